//! Deciding in-process: a [`Limiter`] an application builds from the same rules files, and counts in
//! the same Redis, as a fleet of Tollgate servers. Envoy asks the servers, the application asks its
//! own limiter, and both spend one budget: the keys, the Lua scripts and the answers are the servers'
//! own (with the same `CACHE_KEY_PREFIX`, `HASH_KEY` and rules).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate_core::embedded::{Descriptor, LimiterBuilder};
//! use tollgate_core::limiter::{Code, Mode};
//!
//! // Inside a Tokio runtime: Redis connects, and the rules reload, in background tasks.
//! let limiter = LimiterBuilder::new()
//!     .rules_dir("/etc/tollgate/rules")
//!     .reload_every(std::time::Duration::from_secs(1))
//!     .redis_url("redis://10.0.0.5:6379")
//!     .build()?;
//! let ask = [Descriptor::new([("user_id", "alice")])];
//! let verdict = limiter.check("api", &ask, 1, Mode::Consume).await?;
//! if verdict.overall == Code::OverLimit {
//!     // refuse, with verdict.statuses[0].retry_after
//! }
//! # Ok(()) }
//! ```
//!
//! Without [`LimiterBuilder::redis_url`] the limiter counts in the embedded store
//! ([`crate::store::memory`], in this process's memory): one process's own budget. docs/embedding.md says more.

use std::ops::Deref;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, SystemClock};
use crate::limiter::{LimitOverride, Limiter, LimiterOptions, RefundKeys, RequestDescriptor};
use crate::observe::metrics::Metrics;
use crate::rules::file::{ConfigError, by_domain, parse_file};
use crate::rules::reload::{Reloader, install};
use crate::rules::{CompileOptions, RuleSet, RulesHandle, ValueHasher};
use crate::store::memory::MemoryStore;
use crate::store::{AnyStore, StoreOptions};

/// Builds an [`EmbeddedLimiter`]. Everything has the Tollgate server's default; only the rules are
/// required.
#[derive(Debug, Default)]
pub struct LimiterBuilder {
    rules: Option<RulesFrom>,
    merge_domains: bool,
    reload_every: Option<Duration>,
    store: StoreOptions,
    #[cfg(feature = "redis")]
    redis_url: Option<String>,
    options: LimiterOptions,
    hash_key: String,
    refund_keys: Option<RefundKeys>,
}

/// Where the rules are.
#[derive(Debug)]
enum RulesFrom {
    Dir(PathBuf),
    Texts(Vec<(String, String)>),
}

/// Why an [`EmbeddedLimiter`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Neither [`LimiterBuilder::rules_dir`] nor [`LimiterBuilder::rules_yaml`] was called.
    #[error("no rules: call rules_dir or rules_yaml")]
    NoRules,
    /// The rules do not load (the file and the reason, as `tollgate check-config` says them).
    #[error(transparent)]
    Rules(#[from] ConfigError),
    /// The Redis address does not parse.
    #[cfg(feature = "redis")]
    #[error(transparent)]
    Redis(#[from] crate::store::redis::TargetError),
    /// [`LimiterBuilder::build`] was called outside a Tokio runtime.
    #[error("build the limiter inside a Tokio runtime: Redis and the rules' reload run as its tasks")]
    NoRuntime,
}

impl LimiterBuilder {
    /// A builder with every default.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads the rules from this directory, as `tollgate serve --config-dir` does.
    pub fn rules_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.rules = Some(RulesFrom::Dir(dir.into()));
        self
    }

    /// Adds one rules file's text (`name` stands for the file name in errors). May be called once per
    /// file; replaces a [`LimiterBuilder::rules_dir`].
    pub fn rules_yaml(mut self, name: impl Into<String>, text: impl Into<String>) -> Self {
        let file = (name.into(), text.into());
        match &mut self.rules {
            Some(RulesFrom::Texts(files)) => files.push(file),
            _ => self.rules = Some(RulesFrom::Texts(vec![file])),
        }
        self
    }

    /// envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`: several files may define one domain.
    pub fn merge_domains(mut self, merge: bool) -> Self {
        self.merge_domains = merge;
        self
    }

    /// Reads the rules directory again this often and loads a change (once two reads in a row agree),
    /// as the server does; without it the rules are read once.
    pub fn reload_every(mut self, interval: Duration) -> Self {
        self.reload_every = Some(interval);
        self
    }

    /// Counts in the Redis at `url` (the forms of `REDIS_URL`: `host:port`, `redis://`, `rediss://`, a
    /// unix socket path), with the server's defaults for everything else.
    #[cfg(feature = "redis")]
    pub fn redis_url(mut self, url: impl Into<String>) -> Self {
        self.redis_url = Some(url.into());
        self
    }

    /// Counts where `options` say (Redis Cluster, Sentinel, TLS, timeouts: everything the server's
    /// `REDIS_*` settings describe).
    pub fn store(mut self, options: StoreOptions) -> Self {
        self.store = options;
        self
    }

    /// How requests are decided (the server's `CACHE_KEY_PREFIX`, `SHADOW_MODE`, ... ). The prefix must
    /// be the fleet's for the counters to be shared.
    pub fn options(mut self, options: LimiterOptions) -> Self {
        self.options = options;
        self
    }

    /// The key of `hash: true` values (the server's `TOLLGATE_HASH_KEY`); the fleet's, for shared
    /// counters of hashed values.
    pub fn hash_key(mut self, key: impl Into<String>) -> Self {
        self.hash_key = key.into();
        self
    }

    /// The keys that sign refund tokens (the server's `TOLLGATE_REFUND_KEY`), so a token this limiter
    /// issues is refunded by any of the fleet's servers; otherwise a random key of this process.
    pub fn refund_keys(mut self, keys: RefundKeys) -> Self {
        self.refund_keys = Some(keys);
        self
    }

    /// Loads the rules and starts the store. Inside a Tokio runtime: Redis connects in the background
    /// (until it answers, requests get their rules' failure modes), and the reload, if any, polls in a
    /// task; both stop when the [`EmbeddedLimiter`] is dropped.
    pub fn build(self) -> Result<EmbeddedLimiter, BuildError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| BuildError::NoRuntime)?;
        #[cfg_attr(not(feature = "redis"), allow(unused_mut))]
        let mut store = self.store;
        #[cfg(feature = "redis")]
        if let Some(url) = &self.redis_url {
            let target = crate::store::redis::RedisTarget::parse(url, "single", "tcp", "", "", false, false)?;
            store.redis = Some(crate::store::redis::RedisOptions::new(target));
        }
        let compile = CompileOptions {
            default_algorithm: self.options.default_algorithm,
            #[cfg(feature = "redis")]
            split_per_second: store.per_second.is_some(),
            #[cfg(not(feature = "redis"))]
            split_per_second: false,
            max_file_bytes: crate::rules::file::DEFAULT_MAX_FILE_BYTES,
            ..CompileOptions::default()
        };
        let metrics = Metrics::new();
        let rules: RulesHandle = Arc::new(ArcSwapOption::empty());
        let stop = CancellationToken::new();
        match self.rules.ok_or(BuildError::NoRules)? {
            RulesFrom::Dir(dir) => {
                let reloader = Reloader {
                    dir,
                    merge_domains: self.merge_domains,
                    options: compile,
                    interval: self.reload_every.unwrap_or(Duration::MAX),
                    metrics: Arc::clone(&metrics),
                };
                let version = reloader.load_into(&rules)?;
                if self.reload_every.is_some() {
                    runtime.spawn(reloader.run(Arc::clone(&rules), Some(version), stop.clone()));
                }
            }
            RulesFrom::Texts(files) => {
                let named = files
                    .iter()
                    .map(|(name, text)| Ok((name.clone(), parse_file(name, text)?)));
                let domains = by_domain(named, self.merge_domains)?;
                let set = RuleSet::compile_with_metrics(domains, compile, &metrics)?;
                install(set, "embedded", "rules_yaml", &metrics, &rules);
            }
        }
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let fallback = MemoryStore::with_max_keys(Arc::clone(&clock), store.memory_max_keys);
        let _runtime = runtime.enter();
        let store = AnyStore::open(store, Arc::clone(&clock), stop.clone());
        let keys = self.refund_keys.or_else(RefundKeys::random);
        let limiter = Limiter::new(rules, store, ValueHasher::new(&self.hash_key), self.options)
            .with_metrics(metrics)
            .with_local_fallback(fallback)
            .with_refund_keys(keys, clock);
        Ok(EmbeddedLimiter {
            limiter: Arc::new(limiter),
            stop,
        })
    }
}

/// A [`Limiter`] with its background tasks (Redis' connector, the rules' reload), which stop when it
/// is dropped. Dereferences to the limiter: `check`, `refund`, `acquire`, `release`,
/// `should_rate_limit`.
#[derive(Debug)]
pub struct EmbeddedLimiter {
    limiter: Arc<Limiter<AnyStore>>,
    stop: CancellationToken,
}

impl EmbeddedLimiter {
    /// The limiter, to share between tasks.
    pub fn limiter(&self) -> &Arc<Limiter<AnyStore>> {
        &self.limiter
    }
}

impl Deref for EmbeddedLimiter {
    type Target = Limiter<AnyStore>;

    fn deref(&self) -> &Self::Target {
        &self.limiter
    }
}

impl Drop for EmbeddedLimiter {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// One descriptor of a request: its entries, in order, as Envoy sends them (`[("path", "/login"),
/// ("remote_address", "192.0.2.9")]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Descriptor {
    entries: Vec<(String, String)>,
    hits_addend: Option<u64>,
    limit_override: Option<LimitOverride>,
}

impl Descriptor {
    /// A descriptor of these entries.
    pub fn new<K: Into<String>, V: Into<String>>(entries: impl IntoIterator<Item = (K, V)>) -> Self {
        Self {
            entries: entries.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
            ..Self::default()
        }
    }

    /// This descriptor's own cost, instead of the request's.
    pub fn with_hits_addend(mut self, hits: u64) -> Self {
        self.hits_addend = Some(hits);
        self
    }

    /// A limit for this request instead of the rules' (Envoy's `limit` override).
    pub fn with_limit_override(mut self, limit: LimitOverride) -> Self {
        self.limit_override = Some(limit);
        self
    }
}

impl RequestDescriptor for Descriptor {
    type Entry = (String, String);

    fn entries(&self) -> &[Self::Entry] {
        &self.entries
    }

    fn limit_override(&self) -> Option<LimitOverride> {
        self.limit_override
    }

    fn hits_addend(&self) -> Option<u64> {
        self.hits_addend
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Code, Mode};

    const RULES: &str =
        "domain: app\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";

    #[tokio::test]
    async fn an_embedded_limiter_decides_from_its_rules() {
        let limiter = LimiterBuilder::new()
            .rules_yaml("app.yaml", RULES)
            .build()
            .expect("builds");
        let ask = [Descriptor::new([("user", "ada")])];
        for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
            let verdict = limiter
                .check("app", &ask, 1, Mode::Consume)
                .await
                .expect("decides");
            assert_eq!(verdict.overall, expected);
        }
    }

    #[tokio::test]
    async fn broken_rules_and_a_missing_runtime_are_named() {
        let error = LimiterBuilder::new()
            .rules_yaml("bad.yaml", "domain: ''\n")
            .build()
            .expect_err("empty domain");
        assert!(error.to_string().contains("bad.yaml"), "{error}");
        let error = LimiterBuilder::new().build().expect_err("no rules");
        assert!(matches!(error, BuildError::NoRules));
        let outside = std::thread::spawn(|| LimiterBuilder::new().rules_yaml("app.yaml", RULES).build());
        let error = outside.join().expect("thread").expect_err("no runtime");
        assert!(matches!(error, BuildError::NoRuntime), "{error}");
    }
}
