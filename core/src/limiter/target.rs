//! From a request's descriptors to what the store will be asked: each descriptor's matched rule (or
//! its limit override) and storage key, the limits other rules `replace` dropped, and where the keys
//! live. Nothing here touches the store.

use std::collections::HashSet;
use std::sync::Arc;

use super::{Limiter, LimiterError};
use crate::algorithm::Algorithm;
use crate::observe::metrics::RuleStats;
use crate::rules::file::{FailureMode, Unit, sliding_log_too_large};
use crate::rules::{DescriptorEntry, Rate, Rule, RuleLimit, ValueEncoding};
use crate::store::{BatchItem, Store};

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

/// The descriptors a proxy's request made ([`crate::rules::proxy`]) are decided as any others.
impl<'a> RequestDescriptor for crate::rules::proxy::Descriptor<'a> {
    type Entry = crate::rules::proxy::Entry<'a>;

    fn entries(&self) -> &[Self::Entry] {
        &self.entries
    }

    fn limit_override(&self) -> Option<LimitOverride> {
        None
    }

    fn hits_addend(&self) -> Option<u64> {
        self.hits_addend
    }
}

/// Most entries one descriptor may carry. Envoy's descriptors hold a handful (one per action of a rate
/// limit's action list); the cap bounds the storage key one descriptor can make, checked before any
/// per-descriptor work.
pub const MAX_ENTRIES: usize = 64;

// Every descriptor a proxy's request can make fits.
const _: () = assert!(crate::rules::proxy::MAX_ACTIONS <= MAX_ENTRIES);

/// Who a descriptor's caller is, for the top offenders and the denial log.
pub(super) struct Caller<'a, E> {
    pub(super) domain: &'a str,
    pub(super) entries: &'a [E],
}

/// What one matched descriptor will be checked against. It refers to the rule's limits rather than
/// copying them: a request allocates nothing per limit.
pub(super) struct Target {
    /// The matched rule; `None` for no match and for a request's limit override.
    pub(super) rule: Option<Arc<Rule>>,
    /// A request's limit override, used instead of any rule.
    pub(super) override_limit: Option<Box<RuleLimit>>,
    /// Bit `i` set: limit `i` of [`Target::limits`] is checked (it has a rate and no matched rule
    /// replaces it). Zero with `unlimited` false means "no limit" (no match, or everything replaced).
    pub(super) active: u64,
    pub(super) unlimited: bool,
    pub(super) key: String,
    /// `key` holds values as envoyproxy/ratelimit writes them ([`BatchItem::go_format`]).
    pub(super) go_format: bool,
    pub(super) cost: u64,
    /// With a `detailed_metric` rule, once the request is known to count: the counters of this
    /// descriptor's values (`None` when the rule's cap folds them into its own).
    pub(super) detailed_stats: Option<Arc<RuleStats>>,
}

impl Target {
    /// The counters this descriptor's hits go to: its values' with `detailed_metric`, else `rule`'s
    /// (the target's rule).
    pub(super) fn stats_of<'a>(&'a self, rule: &'a Rule) -> &'a RuleStats {
        self.detailed_stats.as_deref().unwrap_or(&rule.stats)
    }

    pub(super) fn limits(&self) -> &[RuleLimit] {
        match (&self.override_limit, &self.rule) {
            (Some(limit), _) => std::slice::from_ref(&**limit),
            (None, Some(rule)) => &rule.limits,
            (None, None) => &[],
        }
    }

    /// The checked limits with their rates, in rule order.
    pub(super) fn rates(&self) -> impl Iterator<Item = (&RuleLimit, &Rate)> + '_ {
        self.limits()
            .iter()
            .enumerate()
            .filter(|(i, _)| self.active & bit(*i) != 0)
            .filter_map(|(_, limit)| limit.rate.as_ref().map(|rate| (limit, rate)))
    }

    pub(super) fn rate_count(&self) -> usize {
        self.active.count_ones() as usize
    }

    /// Whether a checked limit says `failure_mode: closed` (it decides when the store fails).
    pub(super) fn fails_closed(&self) -> bool {
        self.rates()
            .any(|(limit, _)| limit.failure_mode == Some(FailureMode::Closed))
    }

    /// Whether one of the checked limits is asked for more than it can ever admit.
    pub(super) fn exceeds_capacity(&self) -> bool {
        !self.unlimited
            && self
                .rates()
                .any(|(_, rate)| self.cost > rate.limit.max_admissible())
    }
}

/// The mask bit of limit `i` (rules hold at most [`crate::rules::MAX_LIMITS_PER_RULE`] = 64 limits).
pub(super) fn bit(i: usize) -> u64 {
    u32::try_from(i)
        .ok()
        .and_then(|i| 1u64.checked_shl(i))
        .unwrap_or(0)
}

/// The mask of the limits that have a rate.
pub(super) fn rate_bits(limits: &[RuleLimit]) -> u64 {
    limits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.rate.is_some())
        .fold(0, |bits, (i, _)| bits | bit(i))
}

pub(super) fn every_limit_has_failure_mode(targets: &[Target]) -> bool {
    targets
        .iter()
        .filter(|t| !t.unlimited)
        .flat_map(Target::rates)
        .all(|(limit, _)| limit.failure_mode.is_some())
}

/// Moves each descriptor's key back from the last of its batch items (see `Limiter::decide`).
pub(super) fn return_keys(targets: &mut [Target], items: &mut [BatchItem]) {
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
pub(super) fn apply_replaces(targets: &mut [Target]) {
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

/// Where a request's keys live: the scope they share and whether the domain keeps them together.
#[derive(Clone, Copy)]
pub(super) struct Placement {
    pub(super) scope_len: usize,
    pub(super) keep_together: bool,
}

/// How long the units a request consumes can still matter: the longest horizon of its limits.
/// When a refund token for `targets`, minted at `now`, expires: after the longest horizon of the
/// limits touched (how long consumed units still matter), but never after the current window of a
/// fixed window among them ends. Past it, the units were consumed from a window that is gone, and a
/// refund would hand them to the next one (in Redis, a new key, with a single-use marker of its own).
pub(super) fn token_expiry_us(targets: &[Target], now: u64) -> u64 {
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

impl<S: Store> Limiter<S> {
    /// A new descriptor key holding the scope: `CACHE_KEY_PREFIX + domain + "_"`.
    pub(super) fn scope_key(&self, domain: &str) -> String {
        let mut key = String::with_capacity(self.scope_key_len(domain) + 48);
        key.push_str(&self.options.cache_key_prefix);
        key.push_str(domain);
        key.push('_');
        key
    }

    /// Whether `domain`'s keys are placed together (one hash slot per request): an `all_or_nothing`
    /// domain, or every domain under `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`.
    pub(super) fn keeps_together(&self, domain: &crate::rules::Domain) -> bool {
        domain.all_or_nothing() || self.options.keep_domains_together
    }

    /// Whether a Go fleet may share `domain`'s counters: the store is one it may share (Redis), and the
    /// domain's keys are not placed together (Go's never are). Elsewhere every key is Tollgate's own.
    fn go_may_share(&self, domain: &crate::rules::Domain) -> bool {
        self.store.shares_with_go() && !self.keeps_together(domain)
    }

    /// The length of [`Limiter::scope_key`].
    fn scope_key_len(&self, domain: &str) -> usize {
        self.options.cache_key_prefix.len() + domain.len() + 1
    }

    pub(super) fn validate<D: RequestDescriptor>(
        &self,
        domain: &str,
        descriptors: &[D],
    ) -> Result<(), LimiterError> {
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

    pub(super) fn target<D: RequestDescriptor>(
        &self,
        domain: &crate::rules::Domain,
        index: usize,
        descriptor: &D,
        default_cost: u64,
    ) -> Result<Target, LimiterError> {
        let cost = descriptor.hits_addend().unwrap_or(default_cost);
        let mut key = self.scope_key(domain.name());
        let go_may_share = self.go_may_share(domain);
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
            // Keyed as a rule with this one limit would be.
            let go_format = go_may_share && algorithm == Algorithm::FixedWindow;
            let encoding = if go_format {
                ValueEncoding::Go
            } else {
                ValueEncoding::Escaped
            };
            domain.raw_key(descriptor.entries(), &self.hasher, &mut key, encoding);
            let limit = RuleLimit {
                name: None,
                replaces: Vec::new(),
                failure_mode: None,
                rate: Some(rate),
            };
            return Ok(Target {
                rule: None,
                override_limit: Some(Box::new(limit)),
                active: 1,
                unlimited: false,
                key,
                go_format,
                cost,
                detailed_stats: None,
            });
        }
        let encoding = domain.first_encoding(go_may_share);
        let Some(found) = domain.find(descriptor.entries(), &self.hasher, &mut key, encoding) else {
            return Ok(Target {
                rule: None,
                override_limit: None,
                active: 0,
                unlimited: false,
                key: String::new(),
                go_format: false,
                cost,
                detailed_stats: None,
            });
        };
        let rule = found.rule;
        let go_format = rule.value_encoding(go_may_share) == ValueEncoding::Go;
        if encoding == ValueEncoding::Go && found.encodings_differ && !go_format {
            // Tollgate's own key, and a value that reads differently escaped: walk again, escaping.
            // Only then: a value without `_` or `%` is the same either way.
            key.truncate(self.scope_key_len(domain.name()));
            domain.find(
                descriptor.entries(),
                &self.hasher,
                &mut key,
                ValueEncoding::Escaped,
            );
        }
        Ok(Target {
            rule: Some(Arc::clone(rule)),
            override_limit: None,
            active: rate_bits(&rule.limits),
            unlimited: rule.limits.iter().any(|l| l.rate.is_none()),
            key,
            go_format,
            cost,
            detailed_stats: None,
        })
    }

    /// Gives each target whose rule asks for `detailed_metric` the counters of its descriptor's values.
    /// Only for hits: a peek or a refund counts nothing, and must not take a place under the cap.
    pub(super) fn attach_detailed_stats<D: RequestDescriptor>(
        &self,
        domain: &crate::rules::Domain,
        descriptors: &[D],
        targets: &mut [Target],
    ) {
        for (target, descriptor) in targets.iter_mut().zip(descriptors) {
            let Some(values) = target.rule.as_ref().and_then(|r| r.detailed.as_ref()) else {
                continue;
            };
            let path = domain.metric_path(descriptor.entries(), &self.hasher);
            let stats = path.and_then(|path| values.stats(&path, &self.metrics));
            target.detailed_stats = stats;
        }
    }
}
