//! Phase 2 of reading a rules file: the semantic validation of the raw descriptors
//! ([`super::decode`]) into the validated model, as envoyproxy/ratelimit's `loadDescriptors` does it
//! and in its order per node (empty key, duplicate composite key, unit/unlimited, replaces,
//! share_threshold), followed by the Tollgate extension checks and then the children. Messages are
//! Go's, without the file prefix (the caller adds it).

use std::net::IpAddr;

use hashbrown::{HashMap, HashSet};

use ipnet::IpNet;

use super::decode::{RawConcurrency, RawDescriptor, RawLimit, RawRoot};
use super::model::{
    ALGORITHMS, BURST_ALGORITHMS, ConcurrencyConfig, DEFAULT_LEASE_TTL, DescriptorConfig, DomainConfig,
    FailureMode, IpPrefix, LimitPolicy, LimitSpec, MAX_IN_FLIGHT, MAX_LEASE_TTL, Normalize, RateLimitConfig,
    Unit, ValueMatch, sliding_log_too_large,
};

pub(super) fn build(raw: RawRoot, file: &str) -> Result<DomainConfig, String> {
    build_from(raw.domain, raw.all_or_nothing, raw.descriptors, raw.proxy, file)
}

/// [`build`] from a root's parts. The top level consumes the raw descriptors, each dropped once
/// built (and, given an iterator that makes them, made only as needed): the two copies of the rules
/// are never both whole.
pub(super) fn build_from(
    domain: String,
    all_or_nothing: bool,
    descriptors: impl IntoIterator<Item = RawDescriptor>,
    proxy: Option<crate::rules::proxy::ProxyRules>,
    file: &str,
) -> Result<DomainConfig, String> {
    if domain.is_empty() {
        return Err("config file cannot have empty domain".to_owned());
    }
    let descriptors = build_level(descriptors, &domain)?;
    Ok(DomainConfig {
        domain,
        file: file.to_owned(),
        all_or_nothing,
        descriptors,
        proxy,
    })
}

/// The node's name in its parent: `key`, or `key_value` when it has a value (Go's finalKey).
///
/// Note `key: a_b` and `key: a, value: b` collide, exactly as in Go.
pub(crate) fn final_key(key: &str, value: Option<&str>) -> String {
    match value {
        Some(v) => format!("{key}_{v}"),
        None => key.to_owned(),
    }
}

/// Uniqueness checks among the children of one parent.
#[derive(Default)]
pub(crate) struct Siblings {
    final_keys: HashSet<String>,
    /// First non-default normalisation declared per `key`.
    normalisation: HashMap<String, Normalize>,
}

impl Siblings {
    /// Go's duplicate check; `path` is the composite key reported (`domain.k1_v1.k2`).
    pub(crate) fn check_duplicate(&mut self, final_key: &str, path: &str) -> Result<(), String> {
        if self.final_keys.insert(final_key.to_owned()) {
            Ok(())
        } else {
            Err(format!("duplicate descriptor composite key '{path}'"))
        }
    }

    /// The matcher normalises the request value per key and level, so siblings sharing a key
    /// must agree. A sibling declaring nothing does not constrain the others.
    pub(crate) fn check_normalisation(&mut self, key: &str, n: &Normalize) -> Result<(), String> {
        if n.is_none() {
            return Ok(());
        }
        match self.normalisation.get(key) {
            Some(existing) if existing != n => {
                Err(format!("conflicting value normalisation for key '{key}'"))
            }
            Some(_) => Ok(()),
            None => {
                self.normalisation.insert(key.to_owned(), n.clone());
                Ok(())
            }
        }
    }

    /// Takes in `other`, the checks of further children of the same parent made apart (a rules file
    /// read in pieces): `false` if one of them clashes with one made here, which checking that child
    /// here would have refused.
    pub(crate) fn merge(&mut self, other: Siblings) -> bool {
        let keys_clash = other.final_keys.iter().any(|k| self.final_keys.contains(k));
        let normalisation_clashes = other
            .normalisation
            .iter()
            .any(|(key, n)| self.normalisation.get(key).is_some_and(|mine| mine != n));
        if keys_clash || normalisation_clashes {
            return false;
        }
        self.final_keys.extend(other.final_keys);
        for (key, n) in other.normalisation {
            self.normalisation.entry(key).or_insert(n);
        }
        true
    }
}

fn build_level<R: std::borrow::Borrow<RawDescriptor>>(
    raws: impl IntoIterator<Item = R>,
    parent: &str,
) -> Result<Vec<DescriptorConfig>, String> {
    let mut siblings = Siblings::default();
    // Sized up front: collecting `Result`s loses the length, and a grown vector keeps room for four
    // nodes where most levels hold one.
    let raws = raws.into_iter();
    let mut built = Vec::with_capacity(raws.size_hint().0);
    for r in raws {
        built.push(build_descriptor(r.borrow(), parent, &mut siblings)?);
    }
    Ok(built)
}

pub(super) fn build_descriptor(
    r: &RawDescriptor,
    parent: &str,
    siblings: &mut Siblings,
) -> Result<DescriptorConfig, String> {
    if r.key.is_empty() {
        return Err("descriptor has empty key".to_owned());
    }
    // Go: an empty value means "no value".
    let value = (!r.value.is_empty()).then(|| r.value.clone());
    let final_key = final_key(&r.key, value.as_deref());
    let path = format!("{parent}.{final_key}");
    siblings.check_duplicate(&final_key, &path)?;

    let rate_limits = build_limits(r, &path)?;
    let concurrency = r
        .concurrency
        .as_ref()
        .map(|c| build_concurrency(c, &path))
        .transpose()?;
    let value_match = build_match(r, value.as_deref(), &path)?;
    if r.share_threshold && value_match == ValueMatch::Exact {
        // Go's text; a `match: cidr` node is also accepted (Tollgate extension).
        return Err(format!(
            "share_threshold can only be used with wildcard values (containing '*'), but found key '{final_key}'"
        ));
    }
    let normalize = build_normalize(r, &path)?;
    siblings.check_normalisation(&r.key, &normalize)?;
    let descriptors = build_level(&r.descriptors, &path)?;

    Ok(DescriptorConfig {
        key: r.key.clone(),
        value,
        value_match,
        rate_limits,
        concurrency,
        shadow_mode: r.shadow_mode,
        quota_mode: r.quota_mode,
        detailed_metric: r.detailed_metric,
        value_to_metric: r.value_to_metric,
        share_threshold: r.share_threshold,
        metadata: r.metadata.clone(),
        normalize,
        descriptors,
    })
}

fn build_limits(r: &RawDescriptor, path: &str) -> Result<Vec<RateLimitConfig>, String> {
    match (&r.rate_limit, &r.rate_limits) {
        (Some(_), Some(_)) => Err(format!(
            "descriptor '{path}' has both rate_limit and rate_limits; use only one of them"
        )),
        (None, None) | (Some(None), None) => Ok(Vec::new()),
        (Some(Some(limit)), None) => Ok(vec![build_limit(limit, path)?]),
        (None, Some(list)) => {
            if list.is_empty() {
                return Err(format!(
                    "rate_limits of descriptor '{path}' must be a non-empty list"
                ));
            }
            let mut seen = HashSet::new();
            let mut out = Vec::with_capacity(list.len());
            for limit in list {
                if limit.unlimited {
                    return Err(format!(
                        "rate_limits of descriptor '{path}' cannot contain an unlimited entry; \
                         use rate_limit with unlimited: true instead"
                    ));
                }
                let built = build_limit(limit, path)?;
                if let LimitPolicy::Limited(spec) = &built.policy {
                    // Two entries with the same window and algorithm would share one counter.
                    let id = (spec.algorithm.clone(), spec.unit, spec.unit_multiplier);
                    if !seen.insert(id) {
                        return Err(format!(
                            "rate_limits of descriptor '{path}' has two entries with the same \
                             algorithm ({}), unit ({}) and unit_multiplier ({})",
                            spec.algorithm.as_deref().unwrap_or("default"),
                            spec.unit.name(),
                            spec.unit_multiplier
                        ));
                    }
                }
                out.push(built);
            }
            Ok(out)
        }
    }
}

fn build_limit(l: &RawLimit, path: &str) -> Result<RateLimitConfig, String> {
    let unit = Unit::from_name(&l.unit);
    if l.unlimited {
        // Only a *valid* unit is an error with unlimited (Go).
        if unit.is_some() {
            return Err("should not specify rate limit unit when unlimited".to_owned());
        }
    } else if unit.is_none() {
        return Err(format!("invalid rate limit unit '{}'", l.unit));
    }
    for replaced in &l.replaces {
        if replaced.is_empty() {
            return Err("should not have an empty replaces entry".to_owned());
        }
        if *replaced == l.name {
            return Err("replaces should not contain name of same descriptor".to_owned());
        }
    }
    let failure_mode = build_failure_mode(l.failure_mode.as_deref(), path, true)?;
    let name = (!l.name.is_empty()).then(|| l.name.clone());
    let replaces = l.replaces.clone();

    let policy = match unit {
        // `unit.is_none()` with `unlimited` false was rejected above.
        Some(unit) if !l.unlimited => LimitPolicy::Limited(build_spec(l, unit, path)?),
        _ => {
            // These would be silently meaningless on an unlimited rule.
            for (key, set) in [
                ("algorithm", l.algorithm.is_some()),
                ("burst", l.burst.is_some()),
                ("unit_multiplier", l.unit_multiplier.is_some()),
            ] {
                if set {
                    return Err(format!(
                        "{key} cannot be used with unlimited: true (descriptor '{path}')"
                    ));
                }
            }
            LimitPolicy::Unlimited
        }
    };
    Ok(RateLimitConfig {
        name,
        replaces,
        failure_mode,
        policy,
    })
}

/// A `failure_mode`. `local` counts a rate in this instance meanwhile; a concurrency limit has no
/// such fallback (leases held elsewhere cannot be seen), so it takes only `open` or `closed`.
fn build_failure_mode(
    given: Option<&str>,
    path: &str,
    rate_limit: bool,
) -> Result<Option<FailureMode>, String> {
    match given.map(str::to_ascii_lowercase) {
        None => Ok(None),
        Some(m) if m == "open" => Ok(Some(FailureMode::Open)),
        Some(m) if m == "closed" => Ok(Some(FailureMode::Closed)),
        Some(m) if m == "local" && rate_limit => Ok(Some(FailureMode::Local)),
        Some(m) if m == "local" => Err(format!(
            "failure_mode 'local' in descriptor '{path}' applies to rate limits, not concurrency \
             (valid: open, closed)"
        )),
        Some(m) => {
            let valid = if rate_limit {
                "open, closed, local"
            } else {
                "open, closed"
            };
            Err(format!(
                "invalid failure_mode '{m}' in descriptor '{path}' (valid: {valid})"
            ))
        }
    }
}

fn build_concurrency(c: &RawConcurrency, path: &str) -> Result<ConcurrencyConfig, String> {
    let Some(max_in_flight) = c.max_in_flight else {
        return Err(format!("concurrency of descriptor '{path}' needs max_in_flight"));
    };
    if max_in_flight > MAX_IN_FLIGHT {
        return Err(format!(
            "max_in_flight {max_in_flight} in descriptor '{path}' exceeds {MAX_IN_FLIGHT}"
        ));
    }
    let lease_ttl = match c.lease_ttl.as_deref() {
        None => DEFAULT_LEASE_TTL,
        Some(text) => parse_lease_ttl(text).ok_or_else(|| {
            format!(
                "lease_ttl '{text}' in descriptor '{path}' must be a duration such as 30s or 500ms, \
                 between 1ms and {}",
                humantime::format_duration(MAX_LEASE_TTL)
            )
        })?,
    };
    Ok(ConcurrencyConfig {
        max_in_flight,
        lease_ttl,
        failure_mode: build_failure_mode(c.failure_mode.as_deref(), path, false)?,
    })
}

/// A `lease_ttl`: a duration with units (`30s`, `1m 30s`, `500ms`) or a bare number of seconds.
fn parse_lease_ttl(text: &str) -> Option<std::time::Duration> {
    let ttl = match text.trim().parse::<u64>() {
        Ok(seconds) => std::time::Duration::from_secs(seconds),
        Err(_) => humantime::parse_duration(text.trim()).ok()?,
    };
    (ttl >= std::time::Duration::from_millis(1) && ttl <= MAX_LEASE_TTL).then_some(ttl)
}

fn build_spec(l: &RawLimit, unit: Unit, path: &str) -> Result<LimitSpec, String> {
    let algorithm = match l.algorithm.as_deref().map(str::to_ascii_lowercase) {
        None => None,
        Some(a) if ALGORITHMS.contains(&a.as_str()) => Some(a),
        Some(a) => {
            return Err(format!(
                "unknown algorithm '{a}' in descriptor '{path}' (valid: {})",
                ALGORITHMS.join(", ")
            ));
        }
    };
    let unit_multiplier = l.unit_multiplier.unwrap_or(1);
    if unit_multiplier == 0 {
        return Err(format!(
            "unit_multiplier must be at least 1 in descriptor '{path}'"
        ));
    }
    if let Some(burst) = l.burst {
        if burst == 0 {
            return Err(format!("burst must be at least 1 in descriptor '{path}'"));
        }
        if let Some(a) = algorithm.as_deref()
            && !BURST_ALGORITHMS.contains(&a)
        {
            return Err(format!(
                "burst is only valid with algorithm {} (descriptor '{path}' uses '{a}')",
                BURST_ALGORITHMS.join(" or ")
            ));
        }
    }
    if algorithm.as_deref() == Some("sliding_log")
        && let Some(message) = sliding_log_too_large(l.requests_per_unit, &format!("descriptor '{path}'"))
    {
        return Err(message);
    }
    Ok(LimitSpec {
        unit,
        unit_multiplier,
        requests_per_unit: l.requests_per_unit,
        algorithm,
        burst: l.burst,
    })
}

fn build_match(r: &RawDescriptor, value: Option<&str>, path: &str) -> Result<ValueMatch, String> {
    let wildcard = value.is_some_and(|v| v.contains('*'));
    match r.match_kind.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None => Ok(if wildcard {
            ValueMatch::Wildcard
        } else {
            ValueMatch::Exact
        }),
        Some("exact") if wildcard => Err(format!(
            "match: exact cannot be used with a value containing '*' (descriptor '{path}')"
        )),
        Some("exact") => Ok(ValueMatch::Exact),
        Some("cidr") => {
            let Some(v) = value else {
                return Err(format!("match: cidr requires a value (descriptor '{path}')"));
            };
            v.parse::<IpNet>()
                .or_else(|_| v.parse::<IpAddr>().map(IpNet::from))
                // Host bits are dropped so equal networks compare equal.
                .map(|net| ValueMatch::Cidr(net.trunc()))
                .map_err(|_| {
                    format!("value '{v}' is not a CIDR or IP address (match: cidr, descriptor '{path}')")
                })
        }
        Some(other) => Err(format!(
            "unknown match '{other}' in descriptor '{path}' (valid: exact, cidr)"
        )),
    }
}

fn build_normalize(r: &RawDescriptor, path: &str) -> Result<Normalize, String> {
    let ip_prefix = match r.ip_prefix {
        None => None,
        Some((v4, v6)) => {
            let default = IpPrefix::default();
            let check = |name: &str, given: Option<u32>, max: u8| match given {
                None => Ok(max),
                Some(len) => u8::try_from(len).ok().filter(|l| *l <= max).ok_or_else(|| {
                    format!("ip_prefix {name} must be between 0 and {max}, got {len} (descriptor '{path}')")
                }),
            };
            Some(IpPrefix {
                v4: check("v4", v4, default.v4)?,
                v6: check("v6", v6, default.v6)?,
            })
        }
    };
    Ok(Normalize {
        lowercase: r.lowercase,
        trim: r.trim,
        ip_prefix,
        hash: r.hash,
    })
}

#[cfg(test)]
mod tests {
    use super::parse_lease_ttl;
    use std::time::Duration;

    #[test]
    fn lease_ttl_takes_units_or_bare_seconds_within_bounds() {
        assert_eq!(parse_lease_ttl("1m 30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_lease_ttl("45"), Some(Duration::from_secs(45)));
        assert_eq!(parse_lease_ttl("500ms"), Some(Duration::from_millis(500)));
        for bad in ["0s", "25h", "soon", "", "-3s"] {
            assert_eq!(parse_lease_ttl(bad), None, "{bad}");
        }
    }
}
