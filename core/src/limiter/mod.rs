//! The decision core: rules + store → a verdict for one request. Transport-free: the gRPC and HTTP
//! front ends translate their messages into [`RequestDescriptor`]s and the [`Verdict`] back.
//!
//! Per request: validate; snapshot the rules; find each descriptor's rule (or use its limit override);
//! drop limits named by another matched rule's `replaces`; send every remaining limit to the store in
//! one batch; turn the store's decisions into per-descriptor statuses, applying shadow mode and quota
//! mode; compute the overall code.
//!
//! A decision is three steps: `ask` (the rules, a target per descriptor, the store's batch), the
//! store's answer, `conclude` (failure modes, statuses, stats, the refund token). The entry points
//! await the store between them; a limiter over the embedded store itself (`Limiter<MemoryStore>`),
//! which never waits, also has `_now` entry points that call it directly, without a future.
//!
//! Layout: this file holds the [`Limiter`], its entry points (Envoy's `should_rate_limit`, the native
//! `check` and `refund`; leases in `leases.rs`) and those steps; `target.rs` resolves descriptors to
//! rules and keys, `decide.rs` builds the batch and turns the store's answers into statuses,
//! `verdict.rs` holds the answer types, `error.rs` the errors; `fallback.rs` is `failure_mode: local`,
//! `refund_token.rs` the refund tokens; `debug_line.rs` the debug line of each decision; `recorder.rs`
//! hands decided requests to a recorder (the server's decision log, which `tollgate what-if` replays).

mod debug_line;
mod decide;
mod error;
mod fallback;
mod leases;
mod recorder;
pub mod refund_token;
mod target;
mod verdict;

pub use error::{ErrorKind, LimiterError};
pub use target::{LimitOverride, MAX_ENTRIES, RequestDescriptor};
pub use verdict::{AppliedLimit, Code, CurrentLimit, DescriptorStatus, Mode, Verdict};

pub use leases::{LeaseStatus, LeaseVerdict, MAX_LEASE_ID_LEN, ReleaseStatus};
pub use recorder::{Recorded, RecordedDescriptor, Recorder};
pub use refund_token::{RefundKeys, TokenError};

use std::sync::Arc;
use std::time::Instant;

use decide::batch;
use fallback::LocalFallback;
use refund_token::Grant;
use target::{Placement, Target, apply_replaces, token_expiry_us};
use verdict::overall_code;

use crate::algorithm::{Algorithm, Decision};
use crate::clock::{Clock, SystemClock};
use crate::observe::denial_log::DenialLog;
use crate::observe::metrics::{Method, Metrics, StoreOperation};
use crate::observe::offenders::TopOffenders;
use crate::rules::{Domain, RuleSet, ValueHasher};
use crate::store::memory::MemoryStore;
use crate::store::{AnyStore, Batch, CommitPolicy, RefundOnce, Store, StoreCounters, StoreError};

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

/// Default for [`LimiterOptions::max_descriptors`]. Envoy sends one descriptor per rate-limit action
/// list, so real requests carry a handful; this only stops abuse, while leaving room for batch callers.
pub const DEFAULT_MAX_DESCRIPTORS: usize = 16_384;

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
    /// Takes each request decided as Envoy's (the server's decision log), when one is installed.
    recorder: Option<Arc<dyn Recorder>>,
    /// Whether calls and store calls are timed for the latency histograms ([`Limiter::untimed`]).
    timed: bool,
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
    /// Envoy's call with its request-wide `hits_addend` (0, unset, counts 1).
    fn envoy(request_hits_addend: u32) -> Self {
        Call::Envoy {
            cost: u64::from(request_hits_addend.max(1)),
        }
    }

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

/// What [`Limiter::ask`] makes of a request.
enum Ask<'r> {
    /// Answered without the store (a domain no rules define).
    Answered(Verdict),
    /// To be decided with the store's answer to the batch of every active limit, the targets' keys
    /// moved into it (`None`: no limit is active, the store is not asked).
    Store(Asked<'r>, Option<Batch>),
}

/// The batch the store was asked, with its answer.
type Answered = (Batch, Result<Vec<Decision>, StoreError>);

/// A request matched to its rules, and what its verdict will need once the store has answered.
struct Asked<'r> {
    domain_rules: &'r Domain,
    /// One per descriptor.
    targets: Vec<Target>,
    policy: CommitPolicy,
    /// What the call does to the counters (`None`: a refund).
    mode: Option<Mode>,
    /// Envoy's call (recorded in the decision log).
    envoys: bool,
    /// Per descriptor, whether its cost exceeds a limit's capacity (a native check with any).
    impossible: Option<Vec<bool>>,
    /// A native consuming check's grant: the costs and the refund token's expiry.
    grant: Option<(Vec<u64>, u64)>,
}

impl<S: Store> Limiter<S> {
    /// A limiter over `store`, answering from whatever rule set `rules` holds at each request.
    pub fn new(rules: RulesHandle, store: S, hasher: ValueHasher, options: LimiterOptions) -> Self {
        let fallback = LocalFallback::new(MemoryStore::new(Arc::new(SystemClock)), options.fleet_size);
        Self {
            fallback,
            recorder: None,
            timed: true,
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

    /// A limiter that does not time its calls, whose latency histograms stay empty: for a replay
    /// (`tollgate what-if`), where no one waits and the clock reads would be a tenth of the work.
    pub fn untimed(mut self) -> Self {
        self.timed = false;
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
        // Envoy's path counts as envoyproxy/ratelimit does, even a cost no limit can admit: Go replicas
        // may share the counters.
        let call = Call::envoy(request_hits_addend);
        self.counted(
            Method::ShouldRateLimit,
            self.decide_request(domain, descriptors, call),
        )
        .await
    }

    /// Decides a request a proxy forwarded, with the descriptors its domain's `proxy:` block made
    /// ([`crate::rules::proxy`]): exactly as Envoy's `ShouldRateLimit` with those descriptors (the same
    /// counters, shadow and quota modes, failure modes), counted under [`Method::ForwardAuth`].
    pub async fn forward_auth<D: RequestDescriptor>(
        &self,
        domain: &str,
        descriptors: &[D],
    ) -> Result<Verdict, LimiterError> {
        let call = Call::envoy(1);
        self.counted(
            Method::ForwardAuth,
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
        let started = self.timed.then(Instant::now);
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
    fn observe(&self, method: Method, started: Option<Instant>, error: Option<&LimiterError>) {
        if let Some(started) = started {
            self.metrics.request(method, started.elapsed());
        }
        match error {
            Some(LimiterError::Store(_)) => self.metrics.store_errors.add(1),
            Some(_) => self.metrics.service_errors.add(1),
            None => {}
        }
    }

    /// Decides one request: matched to its rules ([`Limiter::ask`]), the store asked, its answers
    /// made into the verdict ([`Limiter::conclude`]).
    async fn decide_request<D: RequestDescriptor>(
        &self,
        domain: &str,
        descriptors: &[D],
        call: Call,
    ) -> Result<Verdict, LimiterError> {
        let rules = self.snapshot(domain, descriptors)?;
        let (asked, batch) = match self.ask(&rules, domain, descriptors, call)? {
            Ask::Answered(verdict) => return Ok(verdict),
            Ask::Store(asked, batch) => (asked, batch),
        };
        let answered = match batch {
            Some(batch) => {
                let started = self.timed.then(Instant::now);
                let answer = self.store.apply(&batch).await;
                self.store_called(batch.policy, started);
                Some((batch, answer))
            }
            None => None,
        };
        self.conclude(domain, descriptors, asked, answered)
    }

    /// The rules to decide a request by, once its bounds are checked.
    fn snapshot<D: RequestDescriptor>(
        &self,
        domain: &str,
        descriptors: &[D],
    ) -> Result<Arc<RuleSet>, LimiterError> {
        self.validate(domain, descriptors)?;
        self.rules.load_full().ok_or(LimiterError::NoConfig)
    }

    /// Everything a request needs before the store: its domain's rules, a target per descriptor
    /// (replaced limits dropped, a refund's costs capped by its grant), how the store is to commit,
    /// and the batch of every active limit. A domain no rules define is answered here.
    fn ask<'r, D: RequestDescriptor>(
        &self,
        rules: &'r RuleSet,
        domain: &str,
        descriptors: &[D],
        call: Call,
    ) -> Result<Ask<'r>, LimiterError> {
        let Some(domain_rules) = rules.domain(domain) else {
            self.metrics.unknown_domain(domain);
            // The native API names the mistake: for an application a domain no rules define is a typo
            // that would silently disable its limits.
            if !matches!(call, Call::Envoy { .. }) {
                return Err(LimiterError::UnknownDomain(domain.to_owned()));
            }
            // Envoy's: no limit for anything, as envoyproxy/ratelimit answers.
            if debug_line::enabled() {
                debug_line::unknown_domain(domain, descriptors.len());
            }
            let statuses = descriptors
                .iter()
                .map(|_| DescriptorStatus::no_limit(AppliedLimit::None))
                .collect();
            return Ok(Ask::Answered(Verdict {
                overall: Code::Ok,
                statuses,
                refund_token: None,
            }));
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
        let envoys = matches!(call, Call::Envoy { .. });
        let once = match call {
            Call::Refund { grant, .. } => Some(RefundOnce {
                id: grant.id,
                ttl_us: grant.expires_at_us.saturating_sub(self.refunds.clock.now_us()),
            }),
            Call::Envoy { .. } | Call::Check { .. } => None,
        };
        let placement = Placement {
            scope_len: self.options.cache_key_prefix.len() + domain.len(),
            keep_together: self.keeps_together(domain_rules),
        };
        let batch = batch(&mut targets, policy, placement, once);
        let asked = Asked {
            domain_rules,
            targets,
            policy,
            mode,
            envoys,
            impossible,
            grant,
        };
        Ok(Ask::Store(asked, batch))
    }

    /// The verdict on a request `asked` of the store, given the batch it was asked and its answer
    /// (`None`: no limit was active, the store was not asked).
    fn conclude<D: RequestDescriptor>(
        &self,
        domain: &str,
        descriptors: &[D],
        asked: Asked<'_>,
        answered: Option<Answered>,
    ) -> Result<Verdict, LimiterError> {
        let Asked {
            domain_rules,
            mut targets,
            policy,
            mode,
            envoys,
            impossible,
            grant,
        } = asked;
        let decisions = self.settle(&mut targets, answered)?;
        // Peeks and refunds are not hits: they neither count in the rule's stats nor make offenders.
        let counted = matches!(mode, Some(Mode::Consume | Mode::AllOrNothing));
        if counted {
            self.attach_detailed_stats(domain_rules, descriptors, &mut targets);
        }
        let mut verdict = self.verdict(domain_rules, descriptors, targets, decisions, counted);
        if counted && self.options.global_shadow_mode && overall_code(&verdict.statuses) == Code::OverLimit {
            self.metrics.global_shadow_mode.add(1);
        }
        if let Some(impossible) = impossible {
            self.refuse_impossible(&mut verdict, &impossible);
        }
        if envoys {
            self.record(domain_rules, descriptors);
        }
        if let Some((mut costs, expires)) = grant {
            verdict.refund_token =
                self.refund_token(domain, descriptors, &verdict, policy, &mut costs, expires);
        }
        Ok(verdict)
    }

    /// Records the latency of a store call begun at `started` (when calls are timed).
    fn store_called(&self, policy: CommitPolicy, started: Option<Instant>) {
        let operation = match policy {
            CommitPolicy::Refund => StoreOperation::Refund,
            _ => StoreOperation::Decide,
        };
        if let Some(started) = started {
            self.metrics.store_call(operation, started.elapsed());
        }
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
}

/// The embedded store never waits, so a caller with a limiter over it that decides many requests on
/// one thread (`tollgate what-if`) may decide each without a future, whose state, built and moved on
/// every call, costs a tenth of an embedded decision. The same decisions, counted the same way.
impl Limiter<MemoryStore> {
    /// [`Limiter::should_rate_limit`], decided without a future.
    pub fn should_rate_limit_now<D: RequestDescriptor>(
        &self,
        domain: &str,
        descriptors: &[D],
        request_hits_addend: u32,
    ) -> Result<Verdict, LimiterError> {
        let call = Call::envoy(request_hits_addend);
        self.counted_now(Method::ShouldRateLimit, domain, descriptors, call)
    }

    /// [`Limiter::forward_auth`], decided without a future.
    pub fn forward_auth_now<D: RequestDescriptor>(
        &self,
        domain: &str,
        descriptors: &[D],
    ) -> Result<Verdict, LimiterError> {
        self.counted_now(Method::ForwardAuth, domain, descriptors, Call::envoy(1))
    }

    /// [`Limiter::counted`] for [`Limiter::decide_request_now`].
    fn counted_now<D: RequestDescriptor>(
        &self,
        method: Method,
        domain: &str,
        descriptors: &[D],
        call: Call,
    ) -> Result<Verdict, LimiterError> {
        let started = self.timed.then(Instant::now);
        let result = self.decide_request_now(domain, descriptors, call);
        self.observe(method, started, result.as_ref().err());
        result
    }

    /// [`Limiter::decide_request`], the store answering at once.
    fn decide_request_now<D: RequestDescriptor>(
        &self,
        domain: &str,
        descriptors: &[D],
        call: Call,
    ) -> Result<Verdict, LimiterError> {
        self.validate(domain, descriptors)?;
        // Borrowed, not cloned as the async path's snapshot is: a guard held for a call that never
        // waits saves the two locked instructions of an `Arc`'s count going up and down.
        let rules = self.rules.load();
        let rules = rules.as_deref().ok_or(LimiterError::NoConfig)?;
        let (asked, batch) = match self.ask(rules, domain, descriptors, call)? {
            Ask::Answered(verdict) => return Ok(verdict),
            Ask::Store(asked, batch) => (asked, batch),
        };
        let answered = batch.map(|batch| {
            let started = self.timed.then(Instant::now);
            let answer = self.store.apply_now(&batch);
            self.store_called(batch.policy, started);
            (batch, answer)
        });
        self.conclude(domain, descriptors, asked, answered)
    }
}

impl Limiter<AnyStore> {
    /// What the store has done so far, for `/metrics`; the local fallback's evictions and entries (see
    /// [`LimiterOptions::fleet_size`]) count with the embedded store's.
    pub fn store_counters(&self) -> StoreCounters {
        let mut counters = self.store.counters();
        counters.memory_evictions += self.fallback.evictions();
        counters.memory_refused += self.fallback.refused_full();
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
