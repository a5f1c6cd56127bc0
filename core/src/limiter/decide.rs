//! The store's part of a decision and what it becomes: one batch with every active limit of the
//! request, the failure modes when the store fails (`failure_mode: local` decided in this instance),
//! then each descriptor's status, with the rule's stats, the top offenders and the denial log fed on
//! the way.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use super::debug_line::{self, Decided};
use super::target::{Caller, Placement, Target, every_limit_has_failure_mode, return_keys};
use super::verdict::{current_limit, reported};
use super::{
    Answered, AppliedLimit, Code, CurrentLimit, DescriptorStatus, Limiter, LimiterError, RequestDescriptor,
    Verdict,
};
use crate::algorithm::Decision;
use crate::observe::metrics::RuleStats;
use crate::rules::file::FailureMode;
use crate::rules::{DescriptorEntry, Domain, Rate, Rule};
use crate::store::{Batch, BatchItem, CommitPolicy, RefundOnce, Store};

/// How a request's store part was decided.
pub(super) enum Decisions {
    /// By the store: one decision per checked limit, target after target (none for an unlimited
    /// target); [`take_share`] splits them.
    Store(Vec<Decision>),
    /// The store failed and every affected limit has a failure mode: per target, the local decision
    /// (`failure_mode: local`), or `None` where `open`/`closed` answers.
    FailureMode(Vec<Option<LocalDecision>>),
}

/// A descriptor decided in this instance by `failure_mode: local`.
pub(super) struct LocalDecision {
    decision: Decision,
    /// The instance's share of the limit's rate, which decided.
    share: Rate,
    name: Option<Arc<str>>,
}

/// The batch of every active limit of `targets`, or `None` when none is. Each target's key moves into
/// its last item (copies only for several limits) and moves back in [`Limiter::settle`]: the store
/// only borrows the batch.
pub(super) fn batch(
    targets: &mut [Target],
    policy: CommitPolicy,
    placement: Placement,
    once: Option<RefundOnce>,
) -> Option<Batch> {
    let mut items = Vec::with_capacity(targets.len());
    for (group, target) in (0u32..).zip(targets.iter_mut()).filter(|(_, t)| !t.unlimited) {
        let key = std::mem::take(&mut target.key);
        let first = items.len();
        for (_, rate) in target.rates() {
            items.push(BatchItem {
                key: String::new(),
                limit: rate.limit,
                cost: target.cost,
                group,
                go_format: target.go_format,
            });
        }
        if let Some((last, others)) = items[first..].split_last_mut() {
            for item in others {
                item.key.clone_from(&key);
            }
            last.key = key;
        }
    }
    (!items.is_empty()).then_some(Batch {
        items,
        policy,
        scope_len: placement.scope_len,
        keep_together: placement.keep_together,
        once,
    })
}

impl<S: Store> Limiter<S> {
    /// The store's answer to the batch it was asked (`None` when no limit was active), the keys
    /// moved back into `targets`. If the store failed and every affected limit has a `failure_mode`,
    /// the failure modes answer instead (`local` ones decided in this instance).
    pub(super) fn settle(
        &self,
        targets: &mut [Target],
        answered: Option<Answered>,
    ) -> Result<Decisions, LimiterError> {
        let Some((mut batch, answer)) = answered else {
            return Ok(Decisions::Store(Vec::new()));
        };
        return_keys(targets, &mut batch.items);
        match answer {
            Ok(decisions) => Ok(Decisions::Store(decisions)),
            // A refund is never answered by a failure mode: nothing was given back, and the caller
            // must know (its token is still unused).
            Err(error)
                if error.is_transient()
                    && batch.policy != CommitPolicy::Refund
                    && every_limit_has_failure_mode(targets) =>
            {
                tracing::warn!(%error, "store failed; answering from the rules' failure_mode");
                Ok(Decisions::FailureMode(self.decide_locally(targets, batch.policy)))
            }
            Err(error) => Err(LimiterError::Store(error)),
        }
    }

    /// The `failure_mode: local` limits of a request whose store call failed, decided in this
    /// instance at its share of each rate, with the same policy. Per target: the decision to report,
    /// or `None` where `open`/`closed` answers (a `closed` limit on the descriptor wins over `local`).
    pub(super) fn decide_locally(
        &self,
        targets: &[Target],
        policy: CommitPolicy,
    ) -> Vec<Option<LocalDecision>> {
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
                        go_format: target.go_format,
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
        let decisions = match self.fallback.apply(&batch) {
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

    pub(super) fn verdict<D: RequestDescriptor>(
        &self,
        rules: &Domain,
        descriptors: &[D],
        targets: Vec<Target>,
        decisions: Decisions,
        counted: bool,
    ) -> Verdict {
        let domain = rules.name();
        // Gathered only when the debug lines are on: the keys move into the statuses' making.
        let notes = debug_line::enabled().then(|| self.notes(&targets, &decisions));
        let statuses: Vec<DescriptorStatus> = match decisions {
            Decisions::Store(decisions) => {
                let mut rest = decisions.as_slice();
                targets
                    .into_iter()
                    .zip(descriptors)
                    .map(|(target, descriptor)| {
                        let caller = Caller {
                            domain,
                            entries: descriptor.entries(),
                        };
                        let share = take_share(&mut rest, &target);
                        self.status(caller, target, share, counted)
                    })
                    .collect()
            }
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
        if let Some(notes) = notes {
            for ((status, descriptor), (key, hits, store)) in statuses.iter().zip(descriptors).zip(notes) {
                debug_line::log(&Decided {
                    domain,
                    descriptor: &rules.shown_descriptor(descriptor.entries(), &self.hasher),
                    key: &key,
                    hits,
                    status,
                    store,
                });
            }
        }
        Verdict {
            overall: self.overall(&statuses),
            statuses,
            refund_token: None,
        }
    }

    /// For the debug lines, per target: its storage key, its hits, and what decided it (see
    /// [`Decided::store`]).
    fn notes(&self, targets: &[Target], decisions: &Decisions) -> Vec<(String, u64, Option<&'static str>)> {
        let mut rest = match decisions {
            Decisions::Store(decisions) => decisions.as_slice(),
            Decisions::FailureMode(_) => &[],
        };
        let mut store = |at: usize, target: &Target| match decisions {
            Decisions::Store(_) => {
                let decisions = take_share(&mut rest, target);
                let decision = reported(decisions).map(|reported| &decisions[reported])?;
                Some(if decision.from_local_cache {
                    "local cache"
                } else if decision.from_slice {
                    "hot-key slice"
                } else {
                    self.store.name()
                })
            }
            Decisions::FailureMode(local) => local[at].as_ref().map(|_| "local fallback"),
        };
        targets
            .iter()
            .enumerate()
            .map(|(at, target)| {
                (
                    target.key.clone(),
                    target.cost,
                    store(at, target).filter(|_| !target.unlimited),
                )
            })
            .collect()
    }

    pub(super) fn quota_mode(&self, target: &Target) -> bool {
        self.options.global_quota_mode || target.rule.as_ref().is_some_and(|r| r.quota_mode)
    }

    pub(super) fn status<E: DescriptorEntry>(
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
    pub(super) fn status_at<E: DescriptorEntry>(
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
            && self.count_hits(rule, target.stats_of(rule), rate, decision, target.cost)
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
    pub(super) fn unmeasured(&self, target: Target) -> DescriptorStatus {
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
    /// [`LimiterOptions::show_caller_values`] is set, else the domain, each entry's key, and one keyed
    /// hash (`TOLLGATE_HASH_KEY`'s, as `hash: true` rules use) of the storage key without
    /// `CACHE_KEY_PREFIX`. The storage key is what the budget is counted under, after `ip_prefix`,
    /// `lowercase` and the like: callers that share one budget (one IPv6 /64) are one entry, and no
    /// value (an address, a user id) is on display. Computed only for callers refused or near their
    /// limit.
    ///
    /// [`LimiterOptions::show_caller_values`]: super::LimiterOptions::show_caller_values
    pub(super) fn shown_caller<'k, E: DescriptorEntry>(
        &self,
        caller: &Caller<'_, E>,
        key: &'k str,
    ) -> Cow<'k, str> {
        if self.options.show_caller_values {
            return Cow::Borrowed(key);
        }
        let scoped = key
            .strip_prefix(self.options.cache_key_prefix.as_str())
            .unwrap_or(key);
        let mut shown = String::with_capacity(caller.domain.len() + 16 * caller.entries.len() + 40);
        shown.push_str(caller.domain);
        shown.push('_');
        for entry in caller.entries {
            shown.push_str(entry.key());
            shown.push('_');
        }
        self.hasher.append_hash(&mut shown, scoped);
        Cow::Owned(shown)
    }

    /// The status of a descriptor whose store call failed: `failure_mode: open` allows, `closed`
    /// denies; the most restrictive of a descriptor's limits wins. Nothing was counted, so nothing is
    /// known about the remaining budget; the retry hint is one second.
    pub(super) fn failure_status(&self, target: Target) -> DescriptorStatus {
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

impl<S> Limiter<S> {
    /// envoyproxy/ratelimit's per-rule stats: every hit counts in `total_hits`, then in `over_limit`
    /// (plus `shadow_mode` for shadow rules, and `over_limit_with_local_cache` when the over-limit cache
    /// answered) or `within_limit`; allowed hits above `NEAR_LIMIT_RATIO` of the limit also count in
    /// `near_limit`. A refused request that crosses the limit is split as the Go service splits it:
    /// the hits the limit still had room for (the fixed window counts them anyway) count in
    /// `near_limit` above its threshold, and only the rest in `over_limit` and `shadow_mode`.
    /// Returns whether the caller is worth a place among the top offenders (refused or near the limit).
    fn count_hits(
        &self,
        rule: &Rule,
        stats: &RuleStats,
        rate: &Rate,
        decision: &Decision,
        hits: u64,
    ) -> bool {
        stats.total_hits.add(hits);
        let limit = rate.limit.requests;
        let threshold = self.near_limit_threshold(limit);
        if !decision.allowed {
            // A store that refused an item for another's sake reports what the key holds, which
            // may be the whole cost: that refusal crossed nothing.
            let crossed = if decision.from_local_cache || decision.remaining >= hits {
                0
            } else {
                decision.remaining
            };
            stats.over_limit.add(hits - crossed);
            stats.near_limit.add(crossed.min(limit.saturating_sub(threshold)));
            if decision.from_local_cache {
                stats.over_limit_with_local_cache.add(hits);
            }
            if rule.shadow_mode {
                stats.shadow_mode.add(hits - crossed);
            }
            return true;
        }
        stats.within_limit.add(hits);
        if decision.from_slice {
            // A slice's remaining is what this replica holds, not what the key has left: no nearness
            // can be read from it (the key's last decisions before its limit are made in Redis).
            return false;
        }
        let used = limit.saturating_sub(decision.remaining);
        let near = used.saturating_sub(threshold).min(hits);
        stats.near_limit.add(near);
        near > 0
    }

    /// The count above which allowed hits are near the limit: a whole number of requests, computed in
    /// single precision as the Go service computes it (`NEAR_LIMIT_RATIO` is a float32 there), so a
    /// ratio such as 0.7 draws the line at the same request.
    fn near_limit_threshold(&self, limit: u64) -> u64 {
        ((limit as f32) * (self.options.near_limit_ratio as f32)).floor() as u64
    }
}

/// The decisions of `target` at the front of `rest` (the store's decisions, target after target),
/// taken off it: one per checked limit, none for an unlimited target.
fn take_share<'d>(rest: &mut &'d [Decision], target: &Target) -> &'d [Decision] {
    let count = if target.unlimited {
        0
    } else {
        target.rate_count().min(rest.len())
    };
    let (share, after) = rest.split_at(count);
    *rest = after;
    share
}

/// Retry hint given when the store is down and a rule fails closed: short, because the store usually
/// comes back quickly and the client cannot know when.
pub(super) const FAILURE_RETRY_HINT: Duration = Duration::from_secs(1);
