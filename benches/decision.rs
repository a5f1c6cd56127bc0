//! Cost of one decision on the embedded store: descriptor matching alone, then the whole limiter path
//! (matching, key building, algorithm, sharded store) for each algorithm.
//!
//! Run with `cargo bench --bench decision`. The embedded store's future never waits, so it is polled
//! once with a no-op waker instead of going through a runtime: the figures are the decision itself.

#![allow(missing_docs)] // criterion_group! generates an undocumented function.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use arc_swap::ArcSwapOption;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tollgate_core::algorithm::Algorithm;
use tollgate_core::clock::SystemClock;
use tollgate_core::limiter::{LimitOverride, Limiter, LimiterOptions, Mode, RefundKeys, RequestDescriptor};
use tollgate_core::rules::file::parse_file;
use tollgate_core::rules::{CompileOptions, RuleSet, ValueEncoding, ValueHasher};
use tollgate_core::store::memory::MemoryStore;
use tollgate_core::store::{Batch, BatchItem, CommitPolicy, Store as _};

/// Distinct callers cycled through, so the store sees realistic key churn rather than one hot key.
const KEYS: usize = 10_000;

struct Desc(Vec<(String, String)>);

impl RequestDescriptor for Desc {
    type Entry = (String, String);
    fn entries(&self) -> &[(String, String)] {
        &self.0
    }
    fn limit_override(&self) -> Option<LimitOverride> {
        None
    }
    fn hits_addend(&self) -> Option<u64> {
        None
    }
}

fn rules_yaml() -> String {
    let mut yaml = String::from("domain: bench\ndescriptors:\n");
    // A realistic file: many exact routes, a few wildcards, per-user and per-IP defaults.
    for i in 0..200 {
        yaml.push_str(&format!(
            "  - key: route\n    value: /api/v1/resource{i}\n    rate_limit: {{unit: second, requests_per_unit: 1000}}\n"
        ));
    }
    yaml.push_str(
        "  - key: route\n    value: /static/*\n    rate_limit: {unit: second, requests_per_unit: 5000}\n\
         \x20 - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100000}\n\
         \x20 - key: remote_address\n    ip_prefix: {v4: 32, v6: 64}\n    rate_limit: {unit: minute, requests_per_unit: 100000}\n",
    );
    yaml
}

fn limiter(algorithm: Algorithm) -> Limiter<MemoryStore> {
    let domain = parse_file("bench.yaml", &rules_yaml()).expect("valid rules");
    let rules = RuleSet::compile(
        vec![domain],
        CompileOptions {
            default_algorithm: algorithm,
            ..Default::default()
        },
    )
    .expect("compiles");
    let options = LimiterOptions {
        default_algorithm: algorithm,
        ..LimiterOptions::default()
    };
    Limiter::new(
        Arc::new(ArcSwapOption::from_pointee(rules)),
        MemoryStore::new(Arc::new(SystemClock)),
        ValueHasher::default(),
        options,
    )
}

fn ready<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the embedded store never waits"),
    }
}

fn users() -> Vec<Desc> {
    (0..KEYS)
        .map(|i| Desc(vec![("user".into(), format!("user-{i}"))]))
        .collect()
}

fn bench_matching(c: &mut Criterion) {
    let rules = limiter(Algorithm::FixedWindow);
    let set = rules.rules().load_full().expect("loaded");
    let domain = set.domain("bench").expect("domain");
    let hasher = ValueHasher::default();
    let route = [("route".to_owned(), "/api/v1/resource150".to_owned())];
    let wildcard = [("route".to_owned(), "/static/css/site.css".to_owned())];
    let ipv6 = [("remote_address".to_owned(), "2001:db8:1:2:3:4:5:6".to_owned())];
    let mut group = c.benchmark_group("match");
    for (name, entries) in [("exact", &route), ("wildcard", &wildcard), ("ipv6_prefix", &ipv6)] {
        group.bench_function(name, |b| {
            let mut key = String::with_capacity(64);
            b.iter(|| {
                key.clear();
                key.push_str("bench_");
                black_box(domain.find(black_box(entries), &hasher, &mut key, ValueEncoding::Go));
            })
        });
    }
    group.finish();
}

fn bench_decisions(c: &mut Criterion) {
    let mut group = c.benchmark_group("decide_memory");
    group.throughput(Throughput::Elements(1));
    let descriptors = users();
    for algorithm in Algorithm::ALL {
        let limiter = limiter(algorithm);
        let mut i = 0;
        group.bench_with_input(
            BenchmarkId::new("one_descriptor", algorithm.as_str()),
            &algorithm,
            |b, _| {
                b.iter(|| {
                    i = (i + 1) % KEYS;
                    let verdict =
                        ready(limiter.should_rate_limit("bench", std::slice::from_ref(&descriptors[i]), 1));
                    black_box(verdict.expect("decided"));
                })
            },
        );
    }
    let limiter = limiter(Algorithm::TokenBucket);
    let three: Vec<[Desc; 3]> = (0..KEYS)
        .map(|i| {
            [
                Desc(vec![("route".into(), format!("/api/v1/resource{}", i % 200))]),
                Desc(vec![("user".into(), format!("user-{i}"))]),
                Desc(vec![("remote_address".into(), format!("2001:db8:{i:x}::1"))]),
            ]
        })
        .collect();
    let mut i = 0;
    group.bench_function("three_descriptors/token_bucket", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(ready(limiter.should_rate_limit("bench", &three[i], 1)).expect("decided"));
        })
    });
    group.finish();
}

/// The native API's consuming Check, which also mints a refund token, against Envoy's path on the same
/// limiter (the difference is the token's cost); and verifying a token, which every Refund does first.
fn bench_refund_tokens(c: &mut Criterion) {
    let mut group = c.benchmark_group("refund_token");
    group.throughput(Throughput::Elements(1));
    let descriptors = users();
    let limiter = limiter(Algorithm::TokenBucket);
    let mut i = 0;
    group.bench_function("envoy_decision", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            let one = std::slice::from_ref(&descriptors[i]);
            black_box(ready(limiter.should_rate_limit("bench", one, 1)).expect("decided"));
        })
    });
    group.bench_function("native_check_with_token", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            let one = std::slice::from_ref(&descriptors[i]);
            let verdict = ready(limiter.check("bench", one, 1, Mode::Consume)).expect("decided");
            black_box(verdict.refund_token.expect("a token"));
        })
    });
    let keys = RefundKeys::new(b"0123456789abcdef0123456789abcdef", &[]).expect("randomness");
    let one = std::slice::from_ref(&descriptors[0]);
    group.bench_function("mint", |b| {
        b.iter(|| black_box(keys.mint("bench", one, &[1], u64::MAX)))
    });
    let token = keys.mint("bench", one, &[1], u64::MAX);
    group.bench_function("verify", |b| {
        b.iter(|| black_box(keys.verify(&token, "bench", one, 0).expect("valid")))
    });
    group.finish();
}

/// The embedded store's sweep over a million live keys (nothing expires, so every entry is looked at):
/// the whole sweep, which runs off the runtime's threads; one shard's lock is held for 1/64th of it,
/// the longest any request can wait on the sweep.
fn bench_sweep(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory_sweep");
    group.sample_size(10);
    const LIVE: usize = 1_000_000;
    let store = MemoryStore::with_max_keys(Arc::new(SystemClock), LIVE * 2);
    let limit = tollgate_core::algorithm::Limit {
        algorithm: Algorithm::FixedWindow,
        requests: 1_000,
        window_us: 3_600_000_000,
        burst: 1_000,
    };
    for i in 0..LIVE {
        let item = BatchItem {
            key: format!("bench_user_u-{i}_"),
            limit,
            cost: 1,
            group: 0,
            go_format: false,
        };
        ready(store.apply(&Batch::new(vec![item], CommitPolicy::Independent))).expect("stored");
    }
    group.bench_function("one_million_live_keys", |b| b.iter(|| black_box(store.sweep())));
    group.finish();
}

criterion_group!(
    benches,
    bench_matching,
    bench_decisions,
    bench_refund_tokens,
    bench_sweep
);
criterion_main!(benches);
