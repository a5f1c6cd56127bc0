//! What the client crate (`tollgate-client`) adds to a call: the same Check against a real Tollgate
//! (embedded store, loopback gRPC) through a raw tonic client and through `Client::check`, which adds
//! the deadline, the failure policy and the conversion into a `Decision`. Then what a stalled Tollgate
//! (accepts connections, never answers) costs a call with the default deadline.
//!
//! Run with `cargo bench --bench client`.

#![allow(missing_docs)] // criterion_group! generates an undocumented function.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tokio::runtime::Runtime;
use tollgate::server::{Listeners, run};
use tollgate::settings::Settings;
use tollgate_client::proto::v1::{self, rate_limiter_client::RateLimiterClient};
use tollgate_client::{Client, Descriptor};
use tollgate_core::clock::SystemClock;

const RULES: &str = "domain: bench\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: second\n      requests_per_unit: 1000000000\n";

/// Serves `RULES` on a loopback port in this process; returns the gRPC address.
fn serve(runtime: &Runtime) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("bench.yaml"), RULES).expect("rules");
    let flags = [
        ("config_dir", dir.path().to_string_lossy().into_owned()),
        ("grpc_addr", "127.0.0.1:0".to_owned()),
        ("http_addr", "127.0.0.1:0".to_owned()),
        ("debug_addr", "127.0.0.1:0".to_owned()),
    ];
    let settings = Settings::load_from(None, &HashMap::new(), &flags).expect("settings");
    runtime.block_on(async move {
        let listeners = Listeners::bind(&settings.listen).await.expect("bind");
        let grpc = listeners.grpc.tcp_addr().expect("tcp");
        tokio::spawn(async move {
            let _dir = dir;
            run(settings, listeners, Arc::new(SystemClock), std::future::pending()).await
        });
        // Ready once a check answers.
        let client = Client::connect_lazy(&format!("http://{grpc}"), "bench").expect("address");
        for _ in 0..500 {
            if client
                .check(&descriptors(), 1)
                .await
                .is_ok_and(|d| !d.failed_open)
            {
                return format!("http://{grpc}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the server never answered");
    })
}

fn descriptors() -> [Descriptor; 1] {
    [Descriptor::from([("user", "ada")])]
}

fn client_overhead(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let addr = serve(&runtime);
    let channel = runtime.block_on(async {
        tonic::transport::Endpoint::from_shared(addr.clone())
            .expect("uri")
            .tcp_nodelay(true)
            .connect()
            .await
            .expect("connect")
    });
    let raw = RateLimiterClient::new(channel.clone());
    let client = Client::from_channel(channel, "bench");

    let mut group = c.benchmark_group("check over loopback");
    group.bench_function("raw tonic", |b| {
        b.iter(|| {
            let request = v1::CheckRequest {
                domain: "bench".into(),
                descriptors: vec![v1::Descriptor {
                    entries: vec![v1::Entry {
                        key: "user".into(),
                        value: "ada".into(),
                    }],
                    cost: None,
                }],
                cost: 1,
                mode: v1::Mode::Consume as i32,
            };
            let mut raw = raw.clone();
            runtime.block_on(async move { raw.check(request).await.expect("answer") })
        });
    });
    group.bench_function("tollgate-client", |b| {
        let descriptors = descriptors();
        b.iter(|| runtime.block_on(client.check(&descriptors, 1)).expect("answer"));
    });
    group.finish();

    // A Tollgate that accepts connections and never answers: each call waits out the deadline.
    let stalled = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        addr
    });
    let stalled = {
        let _runtime = runtime.enter();
        Client::connect_lazy(&format!("http://{stalled}"), "bench").expect("address")
    };
    let mut group = c.benchmark_group("stalled tollgate");
    group.sample_size(20);
    group.bench_function("check, default deadline, fail open", |b| {
        let descriptors = descriptors();
        b.iter(|| {
            let decision = runtime
                .block_on(stalled.check(&descriptors, 1))
                .expect("fails open");
            assert!(decision.failed_open);
        });
    });
    group.finish();
}

criterion_group!(benches, client_overhead);
criterion_main!(benches);
