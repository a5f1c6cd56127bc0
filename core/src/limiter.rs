//! The decision core: rules + store → a verdict for one request. Transport-free: the gRPC and HTTP
//! front ends translate their messages into [`RequestDescriptor`]s and the [`Verdict`] back.
//!
//! Per request: validate; snapshot the rules; find each descriptor's rule (or use its limit override);
//! drop limits named by another matched rule's `replaces`; send every remaining limit to the store in
//! one batch; turn the store's decisions into per-descriptor statuses, applying shadow mode and quota
//! mode; compute the overall code.

mod fallback;
mod leases;
pub mod refund_token;

pub use leases::{LeaseStatus, LeaseVerdict, MAX_LEASE_ID_LEN, ReleaseStatus};
pub use refund_token::{RefundKeys, TokenError};

use fallback::LocalFallback;
use refund_token::Grant;

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use std::time::Instant;

use crate::algorithm::{Algorithm, Decision};
use crate::clock::{Clock, SystemClock};
use crate::observe::denial_log::DenialLog;
use crate::observe::metrics::{Method, Metrics, StoreOperation};
use crate::observe::offenders::TopOffenders;
use crate::rules::file::{FailureMode, Unit, sliding_log_too_large};
use crate::rules::{DescriptorEntry, Rate, Rule, RuleLimit, ValueHasher};
use crate::store::memory::MemoryStore;
use crate::store::{AnyStore, Batch, BatchItem, CommitPolicy, RefundOnce, Store, StoreCounters, StoreError};

pub use crate::rules::RulesHandle;

/// Settings of the decision core (all fixed at startup).
#[derive(Debug, Clone)]
pub struct LimiterOptions {
    /// `CACHE_KEY_PREFIX`: prepended to every storage key so deployments can share one Redis.
    pub cache_key_prefix: String,
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`.
    pub stop_increment_when_over_limit: bool,
    /// Every domain's keys are placed together, as an `all_or_nothing` domain's are (in Redis Cluster,
    /// one hash slot per domain). Set where `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` meets Redis
    /// Cluster: one script must see every descriptor of a request to leave the allowed ones untouched
    /// when another is over its limit.
    pub keep_domains_together: bool,
    /// `SHADOW_MODE`: the overall code is always OK (statuses still tell the truth).
    pub global_shadow_mode: bool,
    /// `QUOTA_MODE`: every descriptor is in quota mode.
    pub global_quota_mode: bool,
    /// The algorithm of request limit overrides (the same default as rules without `algorithm`).
    pub default_algorithm: Algorithm,
    /// Requests with more descriptors are refused, bounding the work one call can cause.
    pub max_descriptors: usize,
    /// `NEAR_LIMIT_RATIO`: allowed hits above this fraction of the limit count as `near_limit`.
    pub near_limit_ratio: f64,
    /// `TOLLGATE_SHOW_CALLER_VALUES`: `/top` and the denial log show callers' raw values (addresses,
    /// user ids) instead of hashes.
    pub show_caller_values: bool,
    /// `TOLLGATE_FLEET_SIZE`: replicas sharing the limits; `failure_mode: local` counts this
    /// instance's share, the limit divided by this.
    pub fleet_size: u32,
}

impl Default for LimiterOptions {
    fn default() -> Self {
        Self {
            cache_key_prefix: String::new(),
            stop_increment_when_over_limit: false,
            keep_domains_together: false,
            global_shadow_mode: false,
            global_quota_mode: false,
            default_algorithm: Algorithm::FixedWindow,
            max_descriptors: DEFAULT_MAX_DESCRIPTORS,
            near_limit_ratio: 0.8,
            show_caller_values: false,
            fleet_size: 1,
        }
    }
}

/// Most entries one descriptor may carry. Envoy's descriptors hold a handful (one per action of a rate
/// limit's action list); the cap bounds the storage key one descriptor can make, checked before any
/// per-descriptor work.
pub const MAX_ENTRIES: usize = 64;

/// Default for [`LimiterOptions::max_descriptors`]. Envoy sends one descriptor per rate-limit action
/// list, so real requests carry a handful; this only stops abuse, while leaving room for batch callers.
pub const DEFAULT_MAX_DESCRIPTORS: usize = 16_384;

/// A per-request limit sent by the client instead of the configured rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// The unit as sent on the wire (`envoy.type.v3.RateLimitUnit`); validated by the limiter.
    pub unit: i32,
}

/// What the limiter needs from one request descriptor.
pub trait RequestDescriptor {
    /// The entry type.
    type Entry: DescriptorEntry;
    /// The ordered entries.
    fn entries(&self) -> &[Self::Entry];
    /// The per-request limit override, if any.
    fn limit_override(&self) -> Option<LimitOverride>;
    /// The descriptor-level increment, if present (0 is meaningful: check without consuming).
    fn hits_addend(&self) -> Option<u64>;
}

/// What a request does to the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Consume the cost where allowed (Envoy's only mode). Descriptors are independent unless the
    /// domain is `all_or_nothing` or `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` is set.
    #[default]
    Consume,
    /// Consume only if every descriptor is allowed.
    AllOrNothing,
    /// Decide as `Consume` would, consume nothing.
    Peek,
}

/// The answer for one descriptor or for the whole request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Allowed.
    Ok,
    /// Over the limit.
    OverLimit,
}

/// The limit reported back to the client (`current_limit`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentLimit {
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// The unit.
    pub unit: Unit,
    /// The rule's `name`; `None` for overrides and unnamed rules.
    pub name: Option<Arc<str>>,
    /// The window length (unit × `unit_multiplier`).
    pub window: Duration,
    /// The algorithm that decided.
    pub algorithm: Algorithm,
    /// Bucket capacity (token bucket, GCRA); the rate for the window algorithms.
    pub burst: u64,
}

/// Which limit a descriptor was measured against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppliedLimit {
    /// Nothing limits the descriptor: no rule matched, or every limit of its rule was replaced.
    None,
    /// The matched rule is `unlimited: true`.
    Unlimited,
    /// This limit decided (the one refused with the longest wait, else the one closest to its limit).
    Limited(CurrentLimit),
}

/// The verdict for one descriptor, in exact units: how a protocol encodes it (Envoy's `u32` counts
/// and whole seconds, the native API's `u64` and exact durations) is decided at the protocol's edge,
/// in the server's `api` module.
#[derive(Debug, Clone)]
pub struct DescriptorStatus {
    /// OK or OVER_LIMIT, after per-rule shadow mode.
    pub code: Code,
    /// The limit that decided, if any.
    pub limit: AppliedLimit,
    /// Units left after this call: 0 when refused or when no limit applies, `u64::MAX` when unlimited.
    pub remaining: u64,
    /// When the limit refused the cost: the exact earliest time the same cost would pass.
    pub retry_after: Option<Duration>,
    /// Present exactly when a limit applied: the exact time until the limit is fully replenished
    /// (fixed window: until the window ends).
    pub reset_after: Option<Duration>,
    /// Whether this descriptor counts as quota mode for the overall code.
    pub quota_mode: bool,
    /// The matched rule (for metadata, metrics and logs); `None` for overrides and no match.
    pub rule: Option<Arc<Rule>>,
    /// Whether the store failed and the rule's failure mode produced this status.
    pub from_failure_mode: bool,
}

impl DescriptorStatus {
    fn no_limit(limit: AppliedLimit) -> Self {
        let remaining = if limit == AppliedLimit::Unlimited {
            u64::MAX
        } else {
            0
        };
        Self {
            code: Code::Ok,
            limit,
            remaining,
            retry_after: None,
            reset_after: None,
            quota_mode: false,
            rule: None,
            from_failure_mode: false,
        }
    }

    /// The limit that decided, when one applied.
    pub fn current_limit(&self) -> Option<&CurrentLimit> {
        match &self.limit {
            AppliedLimit::Limited(limit) => Some(limit),
            AppliedLimit::None | AppliedLimit::Unlimited => None,
        }
    }

    /// Whether the matched rule is `unlimited: true`.
    pub fn is_unlimited(&self) -> bool {
        self.limit == AppliedLimit::Unlimited
    }

    /// envoyproxy/ratelimit's `duration_until_reset`, exact (Envoy's encoding rounds it up to whole
    /// seconds): present exactly when a limit applied. A fixed window, and any limit that allowed,
    /// reports the time until it is fully replenished; another algorithm that refused reports the
    /// earliest time the same request would be allowed.
    pub fn until_reset(&self) -> Option<Duration> {
        let limit = self.current_limit()?;
        match self.retry_after {
            Some(retry) if limit.algorithm != Algorithm::FixedWindow => Some(retry),
            _ => self.reset_after,
        }
    }
}

/// The verdict for a request.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// The overall code, after quota mode and global shadow mode.
    pub overall: Code,
    /// One status per request descriptor, in request order.
    pub statuses: Vec<DescriptorStatus>,
    /// A native consuming Check that consumed: the token a Refund needs to give those units back.
    pub refund_token: Option<String>,
}

/// Why a request could not be decided.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimiterError {
    /// The request named no domain. (Message text as envoyproxy/ratelimit.)
    #[error("rate limit domain must not be empty")]
    EmptyDomain,
    /// The request carried no descriptor. (Message text as envoyproxy/ratelimit.)
    #[error("rate limit descriptor list must not be empty")]
    NoDescriptors,
    /// More descriptors than [`LimiterOptions::max_descriptors`].
    #[error("too many descriptors: {count} (at most {max})")]
    TooManyDescriptors {
        /// Descriptors in the request.
        count: usize,
        /// The configured maximum.
        max: usize,
    },
    /// A limit override the rules file format would refuse (a sliding log over its cap).
    #[error("descriptor {index}: limit override: {reason}")]
    InvalidOverride {
        /// Position of the descriptor in the request.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A descriptor with more entries than [`MAX_ENTRIES`].
    #[error("descriptor {index}: {count} entries (at most {MAX_ENTRIES})")]
    TooManyEntries {
        /// Position of the descriptor in the request.
        index: usize,
        /// Entries in it.
        count: usize,
    },
    /// A limit override with an unknown unit (envoyproxy/ratelimit crashes on this).
    #[error("descriptor {index}: limit override has invalid unit {unit} (expected SECOND..YEAR)")]
    InvalidOverrideUnit {
        /// Position of the descriptor in the request.
        index: usize,
        /// The unit number received.
        unit: i32,
    },
    /// A lease id that is empty (Release) or longer than [`MAX_LEASE_ID_LEN`] bytes.
    #[error("lease_id must be 1 to {MAX_LEASE_ID_LEN} bytes")]
    InvalidLeaseId,
    /// A lease TTL of zero or below.
    #[error("lease ttl must be positive")]
    InvalidLeaseTtl,
    /// A refund whose token is missing, forged, expired, already used, or for another request.
    #[error(transparent)]
    Refund(#[from] TokenError),
    /// A renewal of a lease that holds no live slot (expired, released, or never minted here).
    #[error("no live lease with this lease_id: acquire without an id to take a new one")]
    LeaseNotFound,
    /// The OS gave no randomness to mint an unguessable id with.
    #[error("cannot mint an id: the operating system gave no randomness")]
    NoRandomness,
    /// A Check mode the native API does not define (the number as sent).
    #[error("unknown mode {0} (expected MODE_CONSUME, MODE_PEEK or MODE_ALL_OR_NOTHING)")]
    UnknownMode(i32),
    /// No rules have loaded yet. (Message text as envoyproxy/ratelimit.)
    #[error("no rate limit configuration loaded")]
    NoConfig,
    /// The store failed and at least one affected limit has no `failure_mode`.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What kind of failure a [`LimiterError`] is, for the front ends to map to their status codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed: the caller must change it.
    InvalidRequest,
    /// Nothing can be decided now (the store is down, no rules are loaded): retrying may help.
    Unavailable,
    /// An all-or-nothing call whose keys Redis Cluster cannot update atomically.
    NotAtomic,
    /// The request names something that does not exist (a lease to renew).
    NotFound,
    /// The caller may not do this (a refund without a valid, unused token).
    PermissionDenied,
}

impl LimiterError {
    /// The error's kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            LimiterError::Store(StoreError::CrossSlot | StoreError::AcrossStores) => ErrorKind::NotAtomic,
            LimiterError::NoConfig | LimiterError::Store(_) | LimiterError::NoRandomness => {
                ErrorKind::Unavailable
            }
            LimiterError::LeaseNotFound => ErrorKind::NotFound,
            LimiterError::Refund(_) => ErrorKind::PermissionDenied,
            LimiterError::EmptyDomain
            | LimiterError::NoDescriptors
            | LimiterError::TooManyDescriptors { .. }
            | LimiterError::TooManyEntries { .. }
            | LimiterError::InvalidOverride { .. }
            | LimiterError::InvalidOverrideUnit { .. }
            | LimiterError::InvalidLeaseId
            | LimiterError::InvalidLeaseTtl
            | LimiterError::UnknownMode(_) => ErrorKind::InvalidRequest,
        }
    }
}

/// Who a descriptor's caller is, for the top offenders and the denial log.
struct Caller<'a, E> {
    domain: &'a str,
    entries: &'a [E],
}

/// What one matched descriptor will be checked against. It refers to the rule's limits rather than
/// copying them: a request allocates nothing per limit.
struct Target {
    /// The matched rule; `None` for no match and for a request's limit override.
    rule: Option<Arc<Rule>>,
    /// A request's limit override, used instead of any rule.
    override_limit: Option<RuleLimit>,
    /// Bit `i` set: limit `i` of [`Target::limits`] is checked (it has a rate and no matched rule
    /// replaces it). Zero with `unlimited` false means "no limit" (no match, or everything replaced).
    active: u64,
    unlimited: bool,
    key: String,
    cost: u64,
}

impl Target {
    fn limits(&self) -> &[RuleLimit] {
        match (&self.override_limit, &self.rule) {
            (Some(limit), _) => std::slice::from_ref(limit),
            (None, Some(rule)) => &rule.limits,
            (None, None) => &[],
        }
    }

    /// The checked limits with their rates, in rule order.
    fn rates(&self) -> impl Iterator<Item = (&RuleLimit, &Rate)> + '_ {
        self.limits()
            .iter()
            .enumerate()
            .filter(|(i, _)| self.active & bit(*i) != 0)
            .filter_map(|(_, limit)| limit.rate.as_ref().map(|rate| (limit, rate)))
    }

    fn rate_count(&self) -> usize {
        self.active.count_ones() as usize
    }

    /// Whether a checked limit says `failure_mode: closed` (it decides when the store fails).
    fn fails_closed(&self) -> bool {
        self.rates()
            .any(|(limit, _)| limit.failure_mode == Some(FailureMode::Closed))
    }

    /// Whether one of the checked limits is asked for more than it can ever admit.
    fn exceeds_capacity(&self) -> bool {
        !self.unlimited
            && self
                .rates()
                .any(|(_, rate)| self.cost > rate.limit.max_admissible())
    }
}

/// How a request's store part was decided.
enum Decisions {
    /// By the store: per target, one decision per checked limit.
    Store(Vec<Vec<Decision>>),
    /// The store failed and every affected limit has a failure mode: per target, the local decision
    /// (`failure_mode: local`), or `None` where `open`/`closed` answers.
    FailureMode(Vec<Option<LocalDecision>>),
}

/// A descriptor decided in this instance by `failure_mode: local`.
struct LocalDecision {
    decision: Decision,
    /// The instance's share of the limit's rate, which decided.
    share: Rate,
    name: Option<Arc<str>>,
}

/// The mask bit of limit `i` (rules hold at most [`crate::rules::MAX_LIMITS_PER_RULE`] = 64 limits).
fn bit(i: usize) -> u64 {
    u32::try_from(i)
        .ok()
        .and_then(|i| 1u64.checked_shl(i))
        .unwrap_or(0)
}

/// The mask of the limits that have a rate.
fn rate_bits(limits: &[RuleLimit]) -> u64 {
    limits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.rate.is_some())
        .fold(0, |bits, (i, _)| bits | bit(i))
}

/// The decision core.
#[derive(Debug)]
pub struct Limiter<S> {
    rules: RulesHandle,
    store: S,
    hasher: ValueHasher,
    options: LimiterOptions,
    metrics: Arc<Metrics>,
    offenders: Arc<TopOffenders>,
    denials: DenialLog,
    refunds: RefundTokens,
    fallback: LocalFallback,
}

/// What signs and dates refund tokens.
#[derive(Debug)]
struct RefundTokens {
    /// `None` when the OS gave no randomness: no token is minted, every refund is refused.
    keys: Option<RefundKeys>,
    clock: Arc<dyn Clock>,
}

/// How one request is to be decided, as the public entry points set it. `cost`: units per
/// descriptor, unless a descriptor sets its own.
enum Call {
    /// Envoy's `ShouldRateLimit`: consume, counted as envoyproxy/ratelimit counts.
    Envoy { cost: u64 },
    /// The native API's Check: a cost above a limit's capacity is refused without side effects, and
    /// what was consumed earns a refund token.
    Check { mode: Mode, cost: u64 },
    /// The native API's Refund, with its verified token: each descriptor gets back at most what it
    /// consumed, once.
    Refund { cost: u64, grant: Grant },
}

impl Call {
    fn cost(&self) -> u64 {
        match self {
            Call::Envoy { cost } | Call::Check { cost, .. } | Call::Refund { cost, .. } => *cost,
        }
    }

    /// What the call does to the counters; `None` for a refund.
    fn mode(&self) -> Option<Mode> {
        match self {
            Call::Envoy { .. } => Some(Mode::Consume),
            Call::Check { mode, .. } => Some(*mode),
            Call::Refund { .. } => None,
        }
    }
}

impl<S: Store> Limiter<S> {
    /// A limiter over `store`, answering from whatever rule set `rules` holds at each request.
    pub fn new(rules: RulesHandle, store: S, hasher: ValueHasher, options: LimiterOptions) -> Self {
        let fallback = LocalFallback::new(MemoryStore::new(Arc::new(SystemClock)), options.fleet_size);
        Self {
            fallback,
            rules,
            store,
            hasher,
            options,
            metrics: Metrics::new(),
            offenders: Arc::default(),
            denials: DenialLog::default(),
            refunds: RefundTokens {
                keys: RefundKeys::random(),
                clock: Arc::new(SystemClock),
            },
        }
    }

    /// Signs refund tokens with `keys` (the fleet's, so any replica verifies them; `None`: no tokens,
    /// every refund refused) and dates them by `clock`, instead of a random key of this process's and
    /// the system clock.
    pub fn with_refund_keys(mut self, keys: Option<RefundKeys>, clock: Arc<dyn Clock>) -> Self {
        self.refunds = RefundTokens { keys, clock };
        self
    }

    /// Counts `failure_mode: local` limits in `store` (the server's clock and key cap) instead of a
    /// default embedded store on the system clock.
    pub fn with_local_fallback(mut self, store: MemoryStore) -> Self {
        self.fallback = LocalFallback::new(store, self.options.fleet_size);
        self
    }

    /// Records into `metrics` (the registry the server renders) instead of a private one.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The callers most often refused or near their limit, per domain.
    pub fn offenders(&self) -> &TopOffenders {
        &self.offenders
    }

    /// The store (for sweeping, metrics and tests).
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The rules handle shared with the reloader.
    pub fn rules(&self) -> &RulesHandle {
        &self.rules
    }

    /// Decides one request.
    pub async fn should_rate_limit<D: RequestDescriptor>(
        &self,
        domain: &str,
        descriptors: &[D],
        request_hits_addend: u32,
    ) -> Result<Verdict, LimiterError> {
        let cost = u64::from(request_hits_addend.max(1));
        // Envoy's path counts as envoyproxy/ratelimit does, even a cost no limit can admit: Go replicas
        // may share the counters.
        let call = Call::Envoy { cost };
        self.counted(
            Method::ShouldRateLimit,
            self.decide_request(domain, descriptors, call),
        )
        .await
    }

    /// Runs one request, Envoy's or the native API's, and counts it in the metrics: every request
    /// once, with its latency and, if it failed, why.
    async fn counted(
        &self,
        method: Method,
        request: impl Future<Output = Result<Verdict, LimiterError>>,
    ) -> Result<Verdict, LimiterError> {
        let started = Instant::now();
        let result = request.await;
        self.observe(method, started, result.as_ref().err());
        result
    }

    /// The native API's Check: `cost` units per descriptor (unless a descriptor sets its own), consumed,
    /// peeked or consumed all-or-nothing as `mode` says. A peek may cost 0, which asks "what is left?";
    /// anything else costs at least 1. A cost above a limit's capacity (its `requests_per_unit`, or
    /// `burst`) can never pass: such a check is refused with no retry hint and consumes nothing on any
    /// descriptor, so one absurd cost cannot lock a key out for a window. An allowed consuming check
    /// that consumed carries a refund token ([`Verdict::refund_token`]).
    pub async fn check<D: RequestDescriptor>(
        &self,
        domain: &str,
        descriptors: &[D],
        cost: u64,
        mode: Mode,
    ) -> Result<Verdict, LimiterError> {
        let cost = if mode == Mode::Peek { cost } else { cost.max(1) };
        let call = Call::Check { mode, cost };
        self.counted(Method::Check, self.decide_request(domain, descriptors, call))
            .await
    }

    /// The native API's Refund: gives units back to the descriptors of the Check that issued `token`,
    /// for the same domain and descriptors, once, while the token lives. Each descriptor gets back its
    /// own `cost` (else `cost`; 0 means all it consumed), at most what it consumed. A missing, forged,
    /// expired, replayed or mismatched token is refused with [`LimiterError::Refund`] and changes
    /// nothing; so is a refund the store cannot make now (no failure mode answers for a refund).
    pub async fn refund<D: RequestDescriptor>(
        &self,
        domain: &str,
        descriptors: &[D],
        cost: u64,
        token: &str,
    ) -> Result<Verdict, LimiterError> {
        self.counted(Method::Refund, async {
            // The request's bounds first: the token's MAC reads every descriptor.
            self.validate(domain, descriptors)?;
            let keys = self.refunds.keys.as_ref().ok_or(LimiterError::NoRandomness)?;
            let grant = keys.verify(token, domain, descriptors, self.refunds.clock.now_us())?;
            let call = Call::Refund { cost, grant };
            let verdict = self.decide_request(domain, descriptors, call).await?;
            // A descriptor the store would not refund has used this token already.
            if verdict.statuses.iter().any(|s| s.retry_after.is_some()) {
                return Err(TokenError::Spent.into());
            }
            Ok(verdict)
        })
        .await
    }

    /// Records a call of `method`, its latency and, if it failed, why.
    fn observe(&self, method: Method, started: Instant, error: Option<&LimiterError>) {
        self.metrics.request(method, started.elapsed());
        match error {
            Some(LimiterError::Store(_)) => self.metrics.store_errors.add(1),
            Some(_) => self.metrics.service_errors.add(1),
            None => {}
        }
    }

    /// A new descriptor key holding the scope: `CACHE_KEY_PREFIX + domain + "_"`.
    fn scope_key(&self, domain: &str) -> String {
        let mut key = String::with_capacity(self.options.cache_key_prefix.len() + domain.len() + 48);
        key.push_str(&self.options.cache_key_prefix);
        key.push_str(domain);
        key.push('_');
        key
    }

    async fn decide_request<D: RequestDescriptor>(
        &self,
        domain: &str,
        descriptors: &[D],
        call: Call,
    ) -> Result<Verdict, LimiterError> {
        self.validate(domain, descriptors)?;
        let rules = self.rules.load_full().ok_or(LimiterError::NoConfig)?;
        let Some(domain_rules) = rules.domain(domain) else {
            // Unknown domain: no limit for anything, as envoyproxy/ratelimit answers.
            self.metrics.domain_not_found.add(1);
            let statuses = descriptors
                .iter()
                .map(|_| DescriptorStatus::no_limit(AppliedLimit::None))
                .collect();
            return Ok(Verdict {
                overall: Code::Ok,
                statuses,
                refund_token: None,
            });
        };
        let mut targets = descriptors
            .iter()
            .enumerate()
            .map(|(index, d)| self.target(domain_rules, index, d, call.cost()))
            .collect::<Result<Vec<_>, _>>()?;
        apply_replaces(&mut targets);
        if let Call::Refund { grant, .. } = &call {
            // At most what each descriptor consumed; 0 asked means all of it.
            for (target, granted) in targets.iter_mut().zip(&grant.costs) {
                target.cost = if target.cost == 0 {
                    *granted
                } else {
                    target.cost.min(*granted)
                };
            }
        }
        let native_check = matches!(call, Call::Check { .. });
        let consuming = matches!(call.mode(), Some(Mode::Consume | Mode::AllOrNothing));
        // Which descriptors ask a limit for more than it can ever admit: a native consuming call with
        // any is decided as a peek, and those descriptors refused (allocated only on that rare path).
        let impossible: Option<Vec<bool>> =
            (native_check && consuming && targets.iter().any(Target::exceeds_capacity))
                .then(|| targets.iter().map(Target::exceeds_capacity).collect());
        let mode = if impossible.is_some() {
            Some(Mode::Peek)
        } else {
            call.mode()
        };
        // What a refund token for this call would grant, taken before the targets are spent.
        let grant = (native_check && mode != Some(Mode::Peek)).then(|| {
            let now = self.refunds.clock.now_us();
            (
                targets.iter().map(|t| t.cost).collect::<Vec<_>>(),
                token_expiry_us(&targets, now),
            )
        });
        let policy = match mode {
            None => CommitPolicy::Refund,
            Some(Mode::Peek) => CommitPolicy::Peek,
            Some(Mode::AllOrNothing) => CommitPolicy::AllOrNothing,
            Some(Mode::Consume) if domain_rules.all_or_nothing() => CommitPolicy::AllOrNothing,
            Some(Mode::Consume) if self.options.stop_increment_when_over_limit => {
                CommitPolicy::StopIncrementWhenOverLimit
            }
            Some(Mode::Consume) => CommitPolicy::Independent,
        };
        let scope_len = self.options.cache_key_prefix.len() + domain.len();
        let once = match call {
            Call::Refund { grant, .. } => Some(RefundOnce {
                id: grant.id,
                ttl_us: grant.expires_at_us.saturating_sub(self.refunds.clock.now_us()),
            }),
            Call::Envoy { .. } | Call::Check { .. } => None,
        };
        let placement = Placement {
            scope_len,
            keep_together: domain_rules.all_or_nothing() || self.options.keep_domains_together,
        };
        let decisions = self.decide(&mut targets, policy, placement, once).await?;
        // Peeks and refunds are not hits: they neither count in the rule's stats nor make offenders.
        let counted = matches!(mode, Some(Mode::Consume | Mode::AllOrNothing));
        let mut verdict = self.verdict(domain, descriptors, targets, decisions, counted);
        if let Some(impossible) = impossible {
            self.refuse_impossible(&mut verdict, &impossible);
        }
        if let Some((mut costs, expires)) = grant {
            verdict.refund_token =
                self.refund_token(domain, descriptors, &verdict, policy, &mut costs, expires);
        }
        Ok(verdict)
    }

    /// The token for what an allowed consuming check consumed, descriptor by descriptor: none when
    /// it was refused, when a failure mode answered (nothing was counted), or when no limit applied.
    /// The overall answer may be OK although a descriptor was refused (shadow mode, quota mode): that
    /// descriptor consumed nothing and its grant is 0, and under a policy where one refusal stops the
    /// others consuming (all-or-nothing, `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`) no token is given.
    fn refund_token<D: RequestDescriptor>(
        &self,
        domain: &str,
        descriptors: &[D],
        verdict: &Verdict,
        policy: CommitPolicy,
        costs: &mut [u64],
        expires_at_us: u64,
    ) -> Option<String> {
        let statuses = &verdict.statuses;
        let refused = |s: &DescriptorStatus| s.retry_after.is_some();
        let settled = matches!(
            policy,
            CommitPolicy::AllOrNothing | CommitPolicy::StopIncrementWhenOverLimit
        );
        let consumed = verdict.overall == Code::Ok
            && statuses.iter().all(|s| !s.from_failure_mode)
            && !(settled && statuses.iter().any(refused));
        for (cost, status) in costs.iter_mut().zip(statuses) {
            if refused(status) || status.current_limit().is_none() {
                *cost = 0;
            }
        }
        let keys = self
            .refunds
            .keys
            .as_ref()
            .filter(|_| consumed && costs.iter().any(|&c| c > 0))?;
        Some(keys.mint(domain, descriptors, costs, expires_at_us))
    }

    /// Refuses the descriptors whose cost no limit of theirs can ever admit: no retry hint (waiting
    /// will not help), nothing remaining; a shadow rule still only reports it.
    fn refuse_impossible(&self, verdict: &mut Verdict, impossible: &[bool]) {
        for (status, _) in verdict.statuses.iter_mut().zip(impossible).filter(|(_, i)| **i) {
            let shadow = status.rule.as_ref().is_some_and(|r| r.shadow_mode);
            if !shadow {
                status.code = Code::OverLimit;
            }
            status.remaining = 0;
            status.retry_after = None;
        }
        verdict.overall = self.overall(&verdict.statuses);
    }

    /// The overall code: OK under global shadow mode, else envoyproxy/ratelimit's rule.
    fn overall(&self, statuses: &[DescriptorStatus]) -> Code {
        if self.options.global_shadow_mode {
            Code::Ok
        } else {
            overall_code(statuses)
        }
    }

    fn validate<D: RequestDescriptor>(&self, domain: &str, descriptors: &[D]) -> Result<(), LimiterError> {
        if domain.is_empty() {
            return Err(LimiterError::EmptyDomain);
        }
        if descriptors.is_empty() {
            return Err(LimiterError::NoDescriptors);
        }
        if descriptors.len() > self.options.max_descriptors {
            return Err(LimiterError::TooManyDescriptors {
                count: descriptors.len(),
                max: self.options.max_descriptors,
            });
        }
        if let Some((index, d)) = descriptors
            .iter()
            .enumerate()
            .find(|(_, d)| d.entries().len() > MAX_ENTRIES)
        {
            return Err(LimiterError::TooManyEntries {
                index,
                count: d.entries().len(),
            });
        }
        Ok(())
    }

    fn target<D: RequestDescriptor>(
        &self,
        domain: &crate::rules::Domain,
        index: usize,
        descriptor: &D,
        default_cost: u64,
    ) -> Result<Target, LimiterError> {
        let cost = descriptor.hits_addend().unwrap_or(default_cost);
        let mut key = self.scope_key(domain.name());
        if let Some(over) = descriptor.limit_override() {
            let unit = Unit::from_i32(over.unit).ok_or(LimiterError::InvalidOverrideUnit {
                index,
                unit: over.unit,
            })?;
            let algorithm = self.options.default_algorithm;
            if algorithm == Algorithm::SlidingLog
                && let Some(reason) = sliding_log_too_large(over.requests_per_unit, "the override")
            {
                return Err(LimiterError::InvalidOverride { index, reason });
            }
            let rate = Rate::new(over.requests_per_unit, unit, 1, algorithm, None);
            domain.raw_key(descriptor.entries(), &self.hasher, &mut key);
            let limit = RuleLimit {
                name: None,
                replaces: Vec::new(),
                failure_mode: None,
                rate: Some(rate),
            };
            return Ok(Target {
                rule: None,
                override_limit: Some(limit),
                active: 1,
                unlimited: false,
                key,
                cost,
            });
        }
        let Some(rule) = domain.find(descriptor.entries(), &self.hasher, &mut key) else {
            return Ok(Target {
                rule: None,
                override_limit: None,
                active: 0,
                unlimited: false,
                key: String::new(),
                cost,
            });
        };
        Ok(Target {
            rule: Some(Arc::clone(rule)),
            override_limit: None,
            active: rate_bits(&rule.limits),
            unlimited: rule.limits.iter().any(|l| l.rate.is_none()),
            key,
            cost,
        })
    }

    /// Sends every active rate to the store in one batch. If the store fails and every affected limit
    /// has a `failure_mode`, the failure modes answer instead (`local` ones decided in this instance).
    async fn decide(
        &self,
        targets: &mut [Target],
        policy: CommitPolicy,
        placement: Placement,
        once: Option<RefundOnce>,
    ) -> Result<Decisions, LimiterError> {
        let mut items = Vec::with_capacity(targets.len());
        for (group, target) in (0u32..).zip(targets.iter_mut()).filter(|(_, t)| !t.unlimited) {
            // The key moves into the descriptor's last item (copies only for several limits) and moves
            // back after the call: the store only borrows the batch.
            let key = std::mem::take(&mut target.key);
            let first = items.len();
            for (_, rate) in target.rates() {
                items.push(BatchItem {
                    key: String::new(),
                    limit: rate.limit,
                    cost: target.cost,
                    group,
                });
            }
            if let Some((last, others)) = items[first..].split_last_mut() {
                for item in others {
                    item.key.clone_from(&key);
                }
                last.key = key;
            }
        }
        let decisions = if items.is_empty() {
            Vec::new()
        } else {
            let started = Instant::now();
            let mut batch = Batch {
                items,
                policy,
                scope_len: placement.scope_len,
                keep_together: placement.keep_together,
                once,
            };
            let answer = self.store.apply(&batch).await;
            let operation = match policy {
                CommitPolicy::Refund => StoreOperation::Refund,
                _ => StoreOperation::Decide,
            };
            self.metrics.store_call(operation, started.elapsed());
            return_keys(targets, &mut batch.items);
            match answer {
                Ok(decisions) => decisions,
                // A refund is never answered by a failure mode: nothing was given back, and the
                // caller must know (its token is still unused).
                Err(error)
                    if error.is_transient()
                        && policy != CommitPolicy::Refund
                        && every_limit_has_failure_mode(targets) =>
                {
                    tracing::warn!(%error, "store failed; answering from the rules' failure_mode");
                    return Ok(Decisions::FailureMode(self.decide_locally(targets, policy).await));
                }
                Err(error) => return Err(LimiterError::Store(error)),
            }
        };
        let mut decisions = decisions.into_iter();
        Ok(Decisions::Store(
            targets
                .iter()
                .map(|t| {
                    if t.unlimited {
                        Vec::new()
                    } else {
                        decisions.by_ref().take(t.rate_count()).collect()
                    }
                })
                .collect(),
        ))
    }

    /// The `failure_mode: local` limits of a request whose store call failed, decided in this
    /// instance at its share of each rate, with the same policy. Per target: the decision to report,
    /// or `None` where `open`/`closed` answers (a `closed` limit on the descriptor wins over `local`).
    async fn decide_locally(&self, targets: &[Target], policy: CommitPolicy) -> Vec<Option<LocalDecision>> {
        let mut items = Vec::new();
        let mut shares = Vec::new();
        for (group, target) in (0u32..).zip(targets) {
            if target.unlimited || target.fails_closed() {
                continue;
            }
            for (limit, rate) in target.rates() {
                if limit.failure_mode == Some(FailureMode::Local) {
                    let share = self.fallback.share(rate);
                    items.push(BatchItem {
                        key: target.key.clone(),
                        limit: share.limit,
                        cost: target.cost,
                        group,
                    });
                    shares.push((share, limit.name.clone()));
                }
            }
        }
        let mut local: Vec<Option<LocalDecision>> = targets.iter().map(|_| None).collect();
        if items.is_empty() {
            return local;
        }
        let batch = Batch::new(items, policy);
        let decisions = match self.fallback.apply(&batch).await {
            Ok(decisions) => decisions,
            Err(error) => {
                tracing::warn!(%error, "the local fallback failed too; answering failure_mode: local as open");
                return local;
            }
        };
        // Items are contiguous per group: report one decision per descriptor, as `status` does.
        let mut start = 0;
        for group in batch.items.chunk_by(|a, b| a.group == b.group) {
            let end = start + group.len();
            if let Some(at) = reported(&decisions[start..end]).map(|at| start + at) {
                let (share, name) = &mut shares[at];
                local[group[0].group as usize] = Some(LocalDecision {
                    decision: decisions[at],
                    share: *share,
                    name: name.take(),
                });
            }
            start = end;
        }
        local
    }

    fn verdict<D: RequestDescriptor>(
        &self,
        domain: &str,
        descriptors: &[D],
        targets: Vec<Target>,
        decisions: Decisions,
        counted: bool,
    ) -> Verdict {
        let statuses: Vec<DescriptorStatus> = match decisions {
            Decisions::Store(decisions) => targets
                .into_iter()
                .zip(decisions)
                .zip(descriptors)
                .map(|((target, decisions), descriptor)| {
                    let caller = Caller {
                        domain,
                        entries: descriptor.entries(),
                    };
                    self.status(caller, target, &decisions, counted)
                })
                .collect(),
            Decisions::FailureMode(local) => targets
                .into_iter()
                .zip(local)
                .zip(descriptors)
                .map(|((target, local), descriptor)| match local {
                    Some(local) => {
                        self.metrics.failure_mode_local.add(1);
                        let caller = Caller {
                            domain,
                            entries: descriptor.entries(),
                        };
                        let current = current_limit(&local.share, &local.name);
                        let status =
                            self.status_at(caller, target, &local.share, current, &local.decision, counted);
                        DescriptorStatus {
                            from_failure_mode: true,
                            ..status
                        }
                    }
                    None => self.failure_status(target),
                })
                .collect(),
        };
        Verdict {
            overall: self.overall(&statuses),
            statuses,
            refund_token: None,
        }
    }

    fn quota_mode(&self, target: &Target) -> bool {
        self.options.global_quota_mode || target.rule.as_ref().is_some_and(|r| r.quota_mode)
    }

    fn status<E: DescriptorEntry>(
        &self,
        caller: Caller<'_, E>,
        target: Target,
        decisions: &[Decision],
        counted: bool,
    ) -> DescriptorStatus {
        let Some(at) = reported(decisions).filter(|_| !target.unlimited) else {
            return self.unmeasured(target);
        };
        let decision = &decisions[at];
        let Some((limit, rate)) = target.rates().nth(at) else {
            return self.unmeasured(target);
        };
        let current = current_limit(rate, &limit.name);
        let rate = *rate;
        self.status_at(caller, target, &rate, current, decision, counted)
    }

    /// The status of a descriptor that `decision`, of a limit at `rate` reported as `current`, gives.
    fn status_at<E: DescriptorEntry>(
        &self,
        caller: Caller<'_, E>,
        target: Target,
        rate: &Rate,
        current: CurrentLimit,
        decision: &Decision,
        counted: bool,
    ) -> DescriptorStatus {
        let quota_mode = self.quota_mode(&target);
        let shadow = target.rule.as_ref().is_some_and(|r| r.shadow_mode);
        if let Some(rule) = target.rule.as_ref().filter(|_| counted)
            && self.count_hits(rule, rate, decision, target.cost)
        {
            let shown = self.shown_caller(&caller, &target.key);
            self.offenders.observe(caller.domain, &shown, target.cost);
            if !decision.allowed {
                let retry_ms = u128::from(decision.retry_after_us) / 1_000;
                self.denials.refused(caller.domain, &rule.path, &shown, retry_ms);
            }
        }
        let code = if decision.allowed || shadow {
            Code::Ok
        } else {
            Code::OverLimit
        };
        DescriptorStatus {
            code,
            limit: AppliedLimit::Limited(current),
            remaining: if decision.allowed { decision.remaining } else { 0 },
            retry_after: (!decision.allowed).then(|| Duration::from_micros(decision.retry_after_us)),
            reset_after: Some(Duration::from_micros(decision.reset_after_us)),
            quota_mode,
            rule: target.rule,
            from_failure_mode: false,
        }
    }

    /// The status of a descriptor that no limit measured: its rule is `unlimited`, or nothing matched,
    /// or every limit was replaced.
    fn unmeasured(&self, target: Target) -> DescriptorStatus {
        let limit = if target.unlimited {
            AppliedLimit::Unlimited
        } else {
            AppliedLimit::None
        };
        DescriptorStatus {
            quota_mode: self.quota_mode(&target),
            rule: target.rule,
            ..DescriptorStatus::no_limit(limit)
        }
    }

    /// How `/top` and the denial log name a caller: its storage key when
    /// [`LimiterOptions::show_caller_values`] is set, else the domain and each entry's key with the
    /// value hashed as a `hash: true` rule hashes it (keyed by `TOLLGATE_HASH_KEY`), so addresses and
    /// user ids are not on display (`CACHE_KEY_PREFIX` is left out: it names the deployment, not the
    /// caller). Computed only for callers refused or near their limit.
    fn shown_caller<'k, E: DescriptorEntry>(&self, caller: &Caller<'_, E>, key: &'k str) -> Cow<'k, str> {
        if self.options.show_caller_values {
            return Cow::Borrowed(key);
        }
        // The storage key's shape (`domain_key_value_…`), so a `hash: true` rule's caller reads the same
        // in both.
        let mut shown = String::with_capacity(caller.domain.len() + 40 * caller.entries.len());
        shown.push_str(caller.domain);
        shown.push('_');
        for entry in caller.entries {
            shown.push_str(entry.key());
            shown.push('_');
            self.hasher.append_hash(&mut shown, entry.value());
            shown.push('_');
        }
        Cow::Owned(shown)
    }

    /// The status of a descriptor whose store call failed: `failure_mode: open` allows, `closed`
    /// denies; the most restrictive of a descriptor's limits wins. Nothing was counted, so nothing is
    /// known about the remaining budget; the retry hint is one second.
    fn failure_status(&self, target: Target) -> DescriptorStatus {
        if target.unlimited || target.rate_count() == 0 {
            return self.unmeasured(target);
        }
        let quota_mode = self.quota_mode(&target);
        let closed = target
            .rates()
            .position(|(limit, _)| limit.failure_mode == Some(FailureMode::Closed));
        let counter = if closed.is_some() {
            &self.metrics.failure_mode_denied
        } else {
            &self.metrics.failure_mode_allowed
        };
        counter.add(1);
        let Some((limit, rate)) = target.rates().nth(closed.unwrap_or(0)) else {
            return self.unmeasured(target);
        };
        let current = current_limit(rate, &limit.name);
        let shadow = target.rule.as_ref().is_some_and(|r| r.shadow_mode);
        DescriptorStatus {
            code: if closed.is_some() && !shadow {
                Code::OverLimit
            } else {
                Code::Ok
            },
            limit: AppliedLimit::Limited(current),
            remaining: 0,
            retry_after: closed.map(|_| FAILURE_RETRY_HINT),
            reset_after: Some(FAILURE_RETRY_HINT),
            quota_mode,
            rule: target.rule.clone(),
            from_failure_mode: true,
        }
    }
}

impl Limiter<AnyStore> {
    /// What the store has done so far, for `/metrics`; the local fallback's evictions and entries (see
    /// [`LimiterOptions::fleet_size`]) count with the embedded store's.
    pub fn store_counters(&self) -> StoreCounters {
        let mut counters = self.store.counters();
        counters.memory_evictions += self.fallback.evictions();
        counters.memory_keys += self.fallback.len() as u64;
        counters
    }

    /// Drops the state that can no longer change a decision from every embedded store: the store
    /// itself when it is the embedded one, and the local fallback (empty unless Redis has been
    /// failing). Returns how many entries went. It walks every shard: run it off the runtime.
    pub fn sweep(&self) -> usize {
        let swept = match &self.store {
            AnyStore::Memory(store) => store.sweep(),
            #[cfg(feature = "redis")]
            AnyStore::Redis(_) => 0,
        };
        swept + self.fallback.sweep()
    }
}

impl<S> Limiter<S> {
    /// envoyproxy/ratelimit's per-rule stats: every hit counts in `total_hits`, then in `over_limit`
    /// (plus `shadow_mode` for shadow rules) or `within_limit`; allowed hits above `NEAR_LIMIT_RATIO` of
    /// the limit also count in `near_limit`.
    /// Returns whether the caller is worth a place among the top offenders (refused or near the limit).
    fn count_hits(&self, rule: &Rule, rate: &Rate, decision: &Decision, hits: u64) -> bool {
        let stats = &rule.stats;
        stats.total_hits.add(hits);
        if !decision.allowed {
            stats.over_limit.add(hits);
            if rule.shadow_mode {
                stats.shadow_mode.add(hits);
            }
            return true;
        }
        stats.within_limit.add(hits);
        let limit = rate.limit.requests;
        // The threshold is a whole number of requests, as in the Go service.
        let threshold = (limit as f64 * self.options.near_limit_ratio).floor() as u64;
        let used = limit.saturating_sub(decision.remaining);
        if used > threshold {
            stats.near_limit.add((used - threshold).min(hits));
            return true;
        }
        false
    }
}

/// Retry hint given when the store is down and a rule fails closed: short, because the store usually
/// comes back quickly and the client cannot know when.
const FAILURE_RETRY_HINT: Duration = Duration::from_secs(1);

fn current_limit(rate: &Rate, name: &Option<Arc<str>>) -> CurrentLimit {
    CurrentLimit {
        requests_per_unit: rate.requests_per_unit,
        unit: rate.unit,
        name: name.clone(),
        window: Duration::from_micros(rate.limit.window_us),
        algorithm: rate.limit.algorithm,
        burst: rate.limit.burst,
    }
}

fn every_limit_has_failure_mode(targets: &[Target]) -> bool {
    targets
        .iter()
        .filter(|t| !t.unlimited)
        .flat_map(Target::rates)
        .all(|(limit, _)| limit.failure_mode.is_some())
}

/// Moves each descriptor's key back from the last of its batch items (see `Limiter::decide`).
fn return_keys(targets: &mut [Target], items: &mut [BatchItem]) {
    let mut next = 0;
    for target in targets.iter_mut().filter(|t| !t.unlimited) {
        next += target.rate_count();
        if let Some(last) = next.checked_sub(1).and_then(|at| items.get_mut(at))
            && target.rate_count() > 0
        {
            target.key = std::mem::take(&mut last.key);
        }
    }
}

/// Drops every limit whose name another matched rule `replaces` (envoyproxy/ratelimit computes this
/// after matching every descriptor, unlimited rules included).
fn apply_replaces(targets: &mut [Target]) {
    let replacing = |t: &Target| {
        t.rule
            .as_ref()
            .is_some_and(|r| r.limits.iter().any(|l| !l.replaces.is_empty()))
    };
    if !targets.iter().any(replacing) {
        return;
    }
    // The names are read from shared rules, so the targets can be changed while they are held.
    let rules: Vec<Arc<Rule>> = targets.iter().filter_map(|t| t.rule.clone()).collect();
    let replaced: HashSet<&str> = rules
        .iter()
        .flat_map(|r| {
            r.limits
                .iter()
                .flat_map(|l| l.replaces.iter().map(String::as_str))
        })
        .collect();
    let is_replaced = |limit: &RuleLimit| limit.name.as_deref().is_some_and(|n| replaced.contains(n));
    for target in targets.iter_mut() {
        let Some(rule) = target.rule.clone() else { continue };
        for (i, limit) in rule.limits.iter().enumerate() {
            if is_replaced(limit) {
                target.active &= !bit(i);
            }
        }
        if target.unlimited && rule.limits.iter().all(is_replaced) {
            target.unlimited = false;
        }
    }
}

/// Which of a descriptor's decisions to report: the denied one with the longest wait, else the one
/// closest to its limit (first on ties).
fn reported(decisions: &[Decision]) -> Option<usize> {
    let denied = decisions
        .iter()
        .enumerate()
        .filter(|(_, d)| !d.allowed)
        .max_by_key(|(i, d)| (d.retry_after_us, std::cmp::Reverse(*i)));
    if let Some((at, _)) = denied {
        return Some(at);
    }
    decisions
        .iter()
        .enumerate()
        .min_by_key(|(i, d)| (d.remaining, *i))
        .map(|(at, _)| at)
}

/// envoyproxy/ratelimit's overall code: OVER_LIMIT if any non-quota descriptor is over, or if there is
/// at least one quota-mode descriptor and all of them are over.
fn overall_code(statuses: &[DescriptorStatus]) -> Code {
    let over = |s: &&DescriptorStatus| s.code == Code::OverLimit;
    let non_quota_over = statuses.iter().filter(|s| !s.quota_mode).any(|s| over(&s));
    let mut quota = statuses.iter().filter(|s| s.quota_mode).peekable();
    let all_quota_over = quota.peek().is_some() && quota.all(|s| over(&s));
    if non_quota_over || all_quota_over {
        Code::OverLimit
    } else {
        Code::Ok
    }
}

/// Where a request's keys live: the scope they share and whether the domain keeps them together.
#[derive(Clone, Copy)]
struct Placement {
    scope_len: usize,
    keep_together: bool,
}

/// How long the units a request consumes can still matter: the longest horizon of its limits.
/// When a refund token for `targets`, minted at `now`, expires: after the longest horizon of the
/// limits touched (how long consumed units still matter), but never after the current window of a
/// fixed window among them ends. Past it, the units were consumed from a window that is gone, and a
/// refund would hand them to the next one (in Redis, a new key, with a single-use marker of its own).
fn token_expiry_us(targets: &[Target], now: u64) -> u64 {
    let rates = || targets.iter().filter(|t| !t.unlimited).flat_map(Target::rates);
    let horizon = rates()
        .map(|(_, rate)| rate.limit.horizon_us())
        .max()
        .unwrap_or(0);
    let window_ends = rates()
        .filter(|(_, rate)| rate.limit.algorithm == Algorithm::FixedWindow)
        .map(|(_, rate)| {
            let window = rate.limit.window_us.max(1);
            window - now % window
        })
        .min()
        .unwrap_or(u64::MAX);
    now.saturating_add(horizon.min(window_ends))
}
