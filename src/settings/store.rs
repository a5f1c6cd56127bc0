//! Where the counters live: the embedded store, or Redis (`REDIS_*`), with the per-second Redis of
//! `REDIS_PERSECOND` (`REDIS_PERSECOND_*`) described by the same [`RedisEndpoint`] type.

use std::fmt;
use std::time::Duration;

use tollgate_core::store::hot_keys;
use tollgate_core::store::redis::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_CONNECTIONS, DEFAULT_DEADLINE, DEFAULT_EXPIRATION_JITTER_SECS,
    RedisTarget, without_userinfo,
};
use tollgate_core::store::{local_cache, memory};

use super::source::{Go, Reader};
use super::{Origins, Secret, SettingsError};

/// The store and how Tollgate talks to it.
#[derive(Debug, Clone)]
pub struct StoreSettings {
    /// `BACKEND_TYPE`: `redis`, the only remote store (used when `REDIS_URL` is set).
    pub backend_type: String,
    /// Most entries the embedded store holds; beyond, consuming requests evict the entries that least
    /// affect decisions (counted in `tollgate_memory_evictions_total`).
    pub memory_max_keys: usize,
    /// `LOCAL_CACHE_SIZE_IN_BYTES`: the over-limit cache in front of Redis (0 turns it off).
    pub local_cache_size_in_bytes: usize,
    /// The Redis (`REDIS_*`); an empty URL means the embedded store.
    pub redis: RedisEndpoint,
    /// `REDIS_PERSECOND`: count per-second limits in [`StoreSettings::per_second`], as the Go service.
    pub redis_persecond: bool,
    /// The per-second Redis (`REDIS_PERSECOND_*`).
    pub per_second: RedisEndpoint,
    /// `REDIS_TLS_CACERT`: PEM file of the CA that signed Redis' certificate (else the system's roots).
    pub redis_tls_cacert: String,
    /// `REDIS_TLS_CLIENT_CERT`: PEM client certificate, for Redis servers that verify clients.
    pub redis_tls_client_cert: String,
    /// `REDIS_TLS_CLIENT_KEY`: PEM key of the client certificate.
    pub redis_tls_client_key: String,
    /// `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`: accept a certificate issued for another name.
    pub redis_tls_skip_hostname_verification: bool,
    /// Longest a decision waits for Redis before the rule's failure mode applies.
    pub redis_deadline: Duration,
    /// `EXPIRATION_JITTER_MAX_SECONDS`: random extra TTL on fixed-window keys.
    pub expiration_jitter_max_seconds: u64,
    /// Decide requests made only of fixed-window counters with pipelined `INCRBY` + `EXPIRE` (the Go
    /// service's commands) instead of the batch script: the same answers and keys for a fraction of
    /// Redis' CPU. Off sends every request through the script.
    pub redis_pipeline_fixed_windows: bool,
    /// Decisions per second on one Redis key, on this replica, from which the replica admits from
    /// slices reserved in Redis (0, the default: never; see `tollgate_core::store::hot_keys`).
    pub hot_key_rate: u64,
    /// How long a reserved slice may be admitted from before its unspent units go back.
    pub hot_key_lease: Duration,
    /// `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`: once Redis has answered, readiness follows whether it
    /// answers (by default a Redis outage leaves the service ready and the rules' failure modes answer,
    /// as in the Go service).
    pub redis_health_check_active_connection: bool,
}

/// The longest hot-key lease accepted.
const MAX_HOT_KEY_LEASE: Duration = Duration::from_secs(60);

/// One Redis: the main one (`REDIS_*`) or the per-second one (`REDIS_PERSECOND_*`).
#[derive(Clone)]
pub struct RedisEndpoint {
    /// `…_URL`: where Redis is (see [`RedisTarget`]); empty: none.
    pub url: String,
    /// `…_TYPE`: `single`, `cluster` or `sentinel`.
    pub kind: String,
    /// `…_SOCKET_TYPE`: `tcp` or `unix`.
    pub socket_type: String,
    /// `…_AUTH`: `password` or `user:password`.
    pub auth: Secret,
    /// `…_SENTINEL_AUTH`: the sentinels' own `password` or `user:password`.
    pub sentinel_auth: Secret,
    /// `…_TLS`: TLS to Redis (also implied by a `rediss://` URL), with the `REDIS_TLS_*` files.
    pub tls: bool,
    /// `…_POOL_SIZE`: multiplexed connections to a node, used round-robin.
    pub pool_size: usize,
    /// `…_TIMEOUT` (`…_CONNECT_TIMEOUT` in Tollgate's names): longest a connection attempt takes.
    pub connect_timeout: Duration,
    /// `…_PIPELINE_WINDOW`: how long a coalesced Redis call waits, from its first request's arrival,
    /// for more requests to join it. Zero sends a call as soon as a call slot is free. Must be shorter
    /// than `redis_deadline`.
    pub pipeline_window: Duration,
    /// `…_PIPELINE_LIMIT`: a coalesced call is sent once it carries this many items, window or not
    /// (zero: the built-in bound alone, 512).
    pub pipeline_limit: usize,
}

impl fmt::Debug for RedisEndpoint {
    /// The URL without its userinfo: a Redis URL may carry a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisEndpoint")
            .field("url", &without_userinfo(&self.url))
            .field("kind", &self.kind)
            .field("socket_type", &self.socket_type)
            .field("auth", &self.auth)
            .field("sentinel_auth", &self.sentinel_auth)
            .field("tls", &self.tls)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("pipeline_window", &self.pipeline_window)
            .field("pipeline_limit", &self.pipeline_limit)
            .finish()
    }
}

/// Which of the two Redis an endpoint is: its keys' prefix and its Go timeout's name.
#[derive(Debug, Clone, Copy)]
enum Which {
    Main,
    PerSecond,
}

impl Which {
    fn prefix(self) -> &'static str {
        match self {
            Which::Main => "redis_",
            Which::PerSecond => "redis_persecond_",
        }
    }

    fn go_timeout(self) -> &'static str {
        match self {
            Which::Main => "REDIS_TIMEOUT",
            Which::PerSecond => "REDIS_PERSECOND_TIMEOUT",
        }
    }
}

impl StoreSettings {
    pub(super) fn read(r: &mut Reader<'_>) -> Result<Self, SettingsError> {
        let mut store = Self {
            backend_type: r.get("backend_type", Go::Same, "redis".into())?,
            memory_max_keys: r.get("memory_max_keys", Go::None, memory::DEFAULT_MAX_KEYS)?,
            local_cache_size_in_bytes: r.get(
                "local_cache_size_in_bytes",
                Go::Same,
                local_cache::DEFAULT_BYTES,
            )?,
            redis: RedisEndpoint::read(r, Which::Main)?,
            redis_persecond: r.get("redis_persecond", Go::Same, false)?,
            per_second: RedisEndpoint::read(r, Which::PerSecond)?,
            redis_tls_cacert: r.get("redis_tls_cacert", Go::Same, String::new())?,
            redis_tls_client_cert: r.get("redis_tls_client_cert", Go::Same, String::new())?,
            redis_tls_client_key: r.get("redis_tls_client_key", Go::Same, String::new())?,
            redis_tls_skip_hostname_verification: r.get(
                "redis_tls_skip_hostname_verification",
                Go::Same,
                false,
            )?,
            redis_deadline: r.get("redis_deadline", Go::None, DEFAULT_DEADLINE)?,
            expiration_jitter_max_seconds: r.get(
                "expiration_jitter_max_seconds",
                Go::Same,
                DEFAULT_EXPIRATION_JITTER_SECS,
            )?,
            redis_pipeline_fixed_windows: r.get("redis_pipeline_fixed_windows", Go::None, true)?,
            hot_key_rate: r.get("hot_key_rate", Go::None, 0)?,
            hot_key_lease: r.get("hot_key_lease", Go::None, hot_keys::DEFAULT_LEASE)?,
            redis_health_check_active_connection: r.get(
                "redis_health_check_active_connection",
                Go::Same,
                false,
            )?,
        };
        let deadline = store.redis_deadline;
        if !deadline.is_zero() {
            store.redis.adjust(Which::Main, deadline, &mut r.warnings);
            store
                .per_second
                .adjust(Which::PerSecond, deadline, &mut r.warnings);
        }
        Ok(store)
    }

    pub(super) fn validate(&self, origins: &Origins) -> Result<(), SettingsError> {
        if !self.backend_type.eq_ignore_ascii_case("redis") {
            return Err(origins.bad(
                "backend_type",
                &self.backend_type,
                "only redis is supported (memcache is not: use Redis, or no REDIS_URL for the embedded store)",
            ));
        }
        // A zero deadline would fail every request.
        if self.redis_deadline.is_zero() {
            return Err(origins.bad("redis_deadline", "0s", "must be longer than zero"));
        }
        if self.hot_key_lease.is_zero() || self.hot_key_lease > MAX_HOT_KEY_LEASE {
            return Err(origins.bad(
                "hot_key_lease",
                &format!("{:?}", self.hot_key_lease),
                "must be longer than zero and at most 60s (units a replica holds are lost to the others until it ends)",
            ));
        }
        if self.memory_max_keys == 0 {
            return Err(origins.bad(
                "memory_max_keys",
                "0",
                "a limit of zero would refuse every request",
            ));
        }
        if self.redis_persecond && (self.redis.url.trim().is_empty() || self.per_second.url.trim().is_empty())
        {
            return Err(origins.bad(
                "redis_persecond_url",
                &self.per_second.url,
                "REDIS_PERSECOND needs both REDIS_URL and REDIS_PERSECOND_URL",
            ));
        }
        // Parsed now, so a malformed address stops startup (and check-config) naming the setting.
        self.redis_target(origins)?;
        self.per_second_target(origins)?;
        Ok(())
    }

    pub(super) fn unused(&self, warnings: &mut Vec<String>) {
        if self.hot_key_rate > 0 && self.redis.url.trim().is_empty() {
            warnings.push(
                "ignoring TOLLGATE_HOT_KEY_RATE: there is no REDIS_URL, and the embedded store decides locally anyway"
                    .into(),
            );
        }
        if !self.redis_persecond && !self.per_second.url.is_empty() {
            warnings.push(
                "ignoring REDIS_PERSECOND_URL: REDIS_PERSECOND is false, every limit is in REDIS_URL".into(),
            );
        }
    }

    /// Where Redis is, or `None` for the embedded store. The error names the URL without its userinfo.
    pub fn redis_target(&self, origins: &Origins) -> Result<Option<RedisTarget>, SettingsError> {
        if self.redis.url.trim().is_empty() {
            return Ok(None);
        }
        self.redis
            .target(self.redis_tls_skip_hostname_verification, Which::Main, origins)
            .map(Some)
    }

    /// Where the per-second Redis is (`REDIS_PERSECOND`), or `None` when per-second limits stay in the
    /// main one.
    pub fn per_second_target(&self, origins: &Origins) -> Result<Option<RedisTarget>, SettingsError> {
        if !self.redis_persecond {
            return Ok(None);
        }
        self.per_second
            .target(
                self.redis_tls_skip_hostname_verification,
                Which::PerSecond,
                origins,
            )
            .map(Some)
    }
}

impl RedisEndpoint {
    fn read(r: &mut Reader<'_>, which: Which) -> Result<Self, SettingsError> {
        let key = |name: &str| format!("{}{name}", which.prefix());
        Ok(Self {
            url: r.get(&key("url"), Go::Same, String::new())?,
            kind: r.get(&key("type"), Go::Same, "single".into())?,
            socket_type: r.get(&key("socket_type"), Go::Same, "tcp".into())?,
            auth: r.get(&key("auth"), Go::Same, Secret::default())?,
            sentinel_auth: r.get(&key("sentinel_auth"), Go::Same, Secret::default())?,
            tls: r.get(&key("tls"), Go::Same, false)?,
            pool_size: r.get(&key("pool_size"), Go::Same, DEFAULT_CONNECTIONS)?,
            connect_timeout: r.get(
                &key("connect_timeout"),
                Go::Named(which.go_timeout()),
                DEFAULT_CONNECT_TIMEOUT,
            )?,
            pipeline_window: r.get(&key("pipeline_window"), Go::Same, Duration::ZERO)?,
            pipeline_limit: r.get(&key("pipeline_limit"), Go::Same, 0)?,
        })
    }

    /// Go values that mean nothing as written here, made to mean what they can, each with a warning:
    /// a Go deployment's settings must start Tollgate.
    fn adjust(&mut self, which: Which, deadline: Duration, warnings: &mut Vec<String>) {
        let name = |key: &str| format!("{}{key}", which.prefix()).to_ascii_uppercase();
        if self.connect_timeout.is_zero() {
            warnings.push(format!(
                "{}=0s would leave a connection attempt unbounded: {} instead",
                which.go_timeout(),
                humantime::format_duration(DEFAULT_CONNECT_TIMEOUT)
            ));
            self.connect_timeout = DEFAULT_CONNECT_TIMEOUT;
        }
        // A window as long as the deadline would answer every coalesced request by its failure mode.
        if self.pipeline_window >= deadline {
            let capped = deadline / 2;
            warnings.push(format!(
                "{}={} is not shorter than REDIS_DEADLINE ({}): requests would wait out their deadline \
                 gathering; gathering for {} instead",
                name("pipeline_window"),
                humantime::format_duration(self.pipeline_window),
                humantime::format_duration(deadline),
                humantime::format_duration(capped)
            ));
            self.pipeline_window = capped;
        }
    }

    /// The parsed address; the error names the URL without its userinfo (a password never reaches a
    /// log).
    fn target(
        &self,
        skip_hostname_verification: bool,
        which: Which,
        origins: &Origins,
    ) -> Result<RedisTarget, SettingsError> {
        RedisTarget::parse(
            &self.url,
            &self.kind,
            &self.socket_type,
            self.auth.expose(),
            self.sentinel_auth.expose(),
            self.tls,
            skip_hostname_verification,
        )
        .map_err(|error| {
            origins.bad(
                &format!("{}url", which.prefix()),
                &without_userinfo(&self.url),
                &error.to_string(),
            )
        })
    }
}
