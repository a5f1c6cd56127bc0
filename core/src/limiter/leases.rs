//! Concurrency leases through the limiter (native API's Acquire and Release): each descriptor is matched
//! as for rate limits, the matched rules' `concurrency` caps become one store call, and a store failure
//! is answered by the rules' `failure_mode` as rate limits are.
//!
//! A lease's TTL is the requested one, capped by the shortest `lease_ttl` among the matched rules, so no
//! rule's slots can be held longer than it allows. Shadow mode does not apply to concurrency rules: a
//! refused lease holds nothing, so there is nothing to "count but allow".

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Limiter, LimiterError, RequestDescriptor};
use crate::observe::metrics::{Method, StoreOperation};
use crate::rules::file::{ConcurrencyConfig, FailureMode};
use crate::rules::{Rule, ValueEncoding};
use crate::store::Store;
use crate::store::lease::{AcquireRequest, LeaseItem, LeaseSlot, ReleaseRequest};

/// Longest lease id accepted; generated ids are 32 hex characters.
pub const MAX_LEASE_ID_LEN: usize = 128;

/// The outcome of an Acquire for one descriptor.
#[derive(Debug, Clone)]
pub struct LeaseStatus {
    /// Whether the descriptor's slot is held by the lease; true when no concurrency rule applies.
    pub acquired: bool,
    /// The matched rule with a `concurrency` cap; `None` when none applies.
    pub rule: Option<Arc<Rule>>,
    /// Leases held on the descriptor after the call (0 when no rule applies or the store failed).
    pub in_flight: u64,
    /// When refused: the time until the oldest lease expires.
    pub retry_after: Option<Duration>,
    /// Whether the store failed and the rule's `failure_mode` produced this status.
    pub from_failure_mode: bool,
}

impl LeaseStatus {
    /// The rule's cap, if a concurrency rule applies.
    pub fn concurrency(&self) -> Option<ConcurrencyConfig> {
        self.rule.as_ref().and_then(|r| r.concurrency.as_deref().copied())
    }
}

/// The outcome of an Acquire.
#[derive(Debug, Clone)]
pub struct LeaseVerdict {
    /// Whether every descriptor's slot is held. When false the lease holds nothing.
    pub acquired: bool,
    /// The lease's id (the caller's, or a generated one).
    pub lease_id: String,
    /// How long the lease lives unless renewed.
    pub ttl: Duration,
    /// One per request descriptor, in order.
    pub statuses: Vec<LeaseStatus>,
}

/// The outcome of a Release for one descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReleaseStatus {
    /// Whether the lease held the descriptor's slot.
    pub released: bool,
    /// Leases held on the descriptor after the call.
    pub in_flight: u64,
}

/// What one descriptor of a lease call refers to: its rule's cap and its key.
struct LeaseTarget {
    rule: Option<Arc<Rule>>,
    key: String,
}

impl LeaseTarget {
    fn concurrency(&self) -> Option<ConcurrencyConfig> {
        self.rule.as_ref().and_then(|r| r.concurrency.as_deref().copied())
    }
}

impl<S: Store> Limiter<S> {
    /// Without `lease_id`, takes one slot of every descriptor's concurrency rule under a new id minted
    /// here, all or none. With `lease_id`, renews that lease on every key where it holds a live slot and
    /// takes nothing new: if it holds none somewhere (expired, released, never existed), nothing changes
    /// and the answer is [`LimiterError::LeaseNotFound`]. `ttl` is capped by the rules' `lease_ttl`;
    /// `None` uses it.
    pub async fn acquire<D: RequestDescriptor>(
        &self,
        domain: &str,
        descriptors: &[D],
        lease_id: Option<&str>,
        ttl: Option<Duration>,
    ) -> Result<LeaseVerdict, LimiterError> {
        let (lease_id, renew) = match lease_id.filter(|id| !id.is_empty()) {
            Some(id) => (checked_lease_id(id)?.to_owned(), true),
            None => (new_lease_id()?, false),
        };
        if ttl.is_some_and(|t| t.is_zero()) {
            return Err(LimiterError::InvalidLeaseTtl);
        }
        let started = Instant::now();
        let result = self
            .acquire_leases(domain, descriptors, lease_id, renew, ttl)
            .await;
        self.observe(Method::Acquire, Some(started), result.as_ref().err());
        result
    }

    async fn acquire_leases<D: RequestDescriptor>(
        &self,
        domain: &str,
        descriptors: &[D],
        lease_id: String,
        renew: bool,
        ttl: Option<Duration>,
    ) -> Result<LeaseVerdict, LimiterError> {
        let targets = self.lease_targets(domain, descriptors)?;
        let capped = targets
            .iter()
            .filter_map(LeaseTarget::concurrency)
            .map(|c| c.lease_ttl)
            .min();
        let ttl = match (ttl, capped) {
            (Some(asked), Some(cap)) => asked.min(cap),
            (asked, cap) => asked.or(cap).unwrap_or(crate::rules::file::DEFAULT_LEASE_TTL),
        };
        let limited: Vec<&LeaseTarget> = targets.iter().filter(|t| t.concurrency().is_some()).collect();
        let request = AcquireRequest {
            items: limited
                .iter()
                .map(|t| LeaseItem {
                    key: t.key.clone(),
                    max_in_flight: t.concurrency().map_or(0, |c| u64::from(c.max_in_flight)),
                })
                .collect(),
            lease_id,
            renew,
            ttl_us: u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX).max(1),
            scope_len: self.options.cache_key_prefix.len() + domain.len(),
        };
        let slots = if request.items.is_empty() {
            Ok(Vec::new())
        } else {
            let started = Instant::now();
            let answer = self.store.acquire(&request).await;
            self.metrics
                .store_call(StoreOperation::Acquire, started.elapsed());
            answer
        };
        let statuses = match slots {
            Ok(slots) if renew && !slots.iter().all(|s| s.available) => {
                return Err(LimiterError::LeaseNotFound);
            }
            Ok(slots) => self.lease_statuses(targets, slots),
            Err(error) if error.is_transient() && limited.iter().all(|t| failure_mode(t).is_some()) => {
                tracing::warn!(%error, "store failed; answering leases from the rules' failure_mode");
                self.failure_lease_statuses(targets)
            }
            Err(error) => return Err(LimiterError::Store(error)),
        };
        let acquired = statuses.iter().all(|s| s.acquired);
        match (acquired, renew) {
            (true, false) => self.metrics.leases_acquired.add(1),
            (false, _) => self.metrics.leases_refused.add(1),
            (true, true) => {}
        }
        Ok(LeaseVerdict {
            acquired,
            // A refused lease holds nothing: no id to renew or release.
            lease_id: if acquired { request.lease_id } else { String::new() },
            ttl,
            statuses,
        })
    }

    /// Frees the slots `lease_id` holds on every descriptor's concurrency rule.
    pub async fn release<D: RequestDescriptor>(
        &self,
        domain: &str,
        descriptors: &[D],
        lease_id: &str,
    ) -> Result<Vec<ReleaseStatus>, LimiterError> {
        if lease_id.is_empty() {
            return Err(LimiterError::InvalidLeaseId);
        }
        let lease_id = checked_lease_id(lease_id)?;
        let started = Instant::now();
        let result = self.release_leases(domain, descriptors, lease_id).await;
        self.observe(Method::Release, Some(started), result.as_ref().err());
        result
    }

    async fn release_leases<D: RequestDescriptor>(
        &self,
        domain: &str,
        descriptors: &[D],
        lease_id: &str,
    ) -> Result<Vec<ReleaseStatus>, LimiterError> {
        let targets = self.lease_targets(domain, descriptors)?;
        let at: Vec<usize> = (0..targets.len())
            .filter(|&i| targets[i].concurrency().is_some())
            .collect();
        let mut statuses = vec![ReleaseStatus::default(); targets.len()];
        if at.is_empty() {
            return Ok(statuses);
        }
        let request = ReleaseRequest {
            keys: at.iter().map(|&i| targets[i].key.clone()).collect(),
            lease_id: lease_id.to_owned(),
            scope_len: self.options.cache_key_prefix.len() + domain.len(),
        };
        let started = Instant::now();
        let released = self.store.release(&request).await;
        self.metrics
            .store_call(StoreOperation::Release, started.elapsed());
        let released = released?;
        if released.iter().any(|r| r.released) {
            self.metrics.leases_released.add(1);
        }
        for (i, status) in at.into_iter().zip(released) {
            statuses[i] = ReleaseStatus {
                released: status.released,
                in_flight: status.in_flight,
            };
        }
        Ok(statuses)
    }

    fn lease_targets<D: RequestDescriptor>(
        &self,
        domain: &str,
        descriptors: &[D],
    ) -> Result<Vec<LeaseTarget>, LimiterError> {
        self.validate(domain, descriptors)?;
        let rules = self.rules.load_full().ok_or(LimiterError::NoConfig)?;
        let Some(domain_rules) = rules.domain(domain) else {
            self.metrics.unknown_domain(domain);
            return Err(LimiterError::UnknownDomain(domain.to_owned()));
        };
        Ok(descriptors
            .iter()
            .map(|d| {
                let mut key = self.scope_key(domain);
                // Lease keys are Tollgate's alone: values escaped.
                let rule = domain_rules
                    .find(d.entries(), &self.hasher, &mut key, ValueEncoding::Escaped)
                    .map(|found| Arc::clone(found.rule));
                LeaseTarget { rule, key }
            })
            .collect())
    }

    fn lease_statuses(&self, targets: Vec<LeaseTarget>, slots: Vec<LeaseSlot>) -> Vec<LeaseStatus> {
        let all_available = slots.iter().all(|s| s.available);
        let mut slots = slots.into_iter();
        targets
            .into_iter()
            .map(|target| {
                if target.concurrency().is_none() {
                    return LeaseStatus {
                        acquired: true,
                        rule: None,
                        in_flight: 0,
                        retry_after: None,
                        from_failure_mode: false,
                    };
                }
                let slot = slots.next().unwrap_or_default();
                if let Some(rule) = &target.rule {
                    let stats = &rule.stats;
                    stats.total_hits.add(1);
                    if all_available {
                        stats.within_limit.add(1);
                    } else {
                        stats.over_limit.add(1);
                    }
                }
                LeaseStatus {
                    acquired: all_available,
                    rule: target.rule,
                    in_flight: slot.in_flight,
                    retry_after: (!slot.available).then(|| Duration::from_micros(slot.retry_after_us)),
                    from_failure_mode: false,
                }
            })
            .collect()
    }

    /// Statuses when the store failed and every concurrency rule has a failure mode: `closed` refuses,
    /// `open` grants a lease that exists nowhere (nothing was written, so nothing needs releasing).
    fn failure_lease_statuses(&self, targets: Vec<LeaseTarget>) -> Vec<LeaseStatus> {
        let refused = targets
            .iter()
            .any(|t| failure_mode(t) == Some(FailureMode::Closed));
        let counter = if refused {
            &self.metrics.failure_mode_denied
        } else {
            &self.metrics.failure_mode_allowed
        };
        targets
            .into_iter()
            .map(|target| {
                let limited = target.concurrency().is_some();
                if limited {
                    counter.add(1);
                }
                LeaseStatus {
                    acquired: !(limited && refused),
                    rule: target.rule.filter(|_| limited),
                    in_flight: 0,
                    retry_after: (limited && refused).then_some(super::decide::FAILURE_RETRY_HINT),
                    from_failure_mode: limited,
                }
            })
            .collect()
    }
}

fn failure_mode(target: &LeaseTarget) -> Option<FailureMode> {
    target.concurrency().and_then(|c| c.failure_mode)
}

/// A caller's lease id, if acceptable: at most [`MAX_LEASE_ID_LEN`] bytes.
fn checked_lease_id(id: &str) -> Result<&str, LimiterError> {
    if id.len() > MAX_LEASE_ID_LEN {
        return Err(LimiterError::InvalidLeaseId);
    }
    Ok(id)
}

/// 128 random bits in hex: unguessable, so one client cannot renew or release another's lease. Without
/// OS randomness no id is minted at all: a guessable one would let anyone free someone else's slot.
fn new_lease_id() -> Result<String, LimiterError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|_| LimiterError::NoRandomness)?;
    Ok(super::refund_token::hex(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_distinct_hex() {
        let a = new_lease_id().expect("OS randomness");
        let b = new_lease_id().expect("OS randomness");
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn long_ids_are_refused() {
        assert!(checked_lease_id(&"x".repeat(MAX_LEASE_ID_LEN)).is_ok());
        assert_eq!(
            checked_lease_id(&"x".repeat(MAX_LEASE_ID_LEN + 1)),
            Err(LimiterError::InvalidLeaseId)
        );
    }
}
