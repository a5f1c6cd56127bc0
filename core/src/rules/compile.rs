//! Validated config → lookup tree. Validation proper lives in [`crate::rules::file`]; the only errors left
//! here are the ones normalisation creates (two values that become equal once lowercased or grouped).

use std::sync::Arc;

use super::matcher::{KeyGroup, Level, Node, PatternNode};
use super::normalize::Normalizer;
use super::pattern::{Pattern, Wildcard};
use super::{Domain, MAX_LIMITS_PER_RULE, Rate, Rule, RuleLimit, RuleSet, ValueEncoding};
use crate::algorithm::Algorithm;
use crate::observe::metrics::Metrics;
use crate::rules::file::{
    ConfigError, DEFAULT_MAX_FILE_BYTES, DescriptorConfig, DomainConfig, LimitPolicy, RateLimitConfig,
    ValueMatch, final_key, sliding_log_too_large,
};

/// Settings that shape compilation but live outside the rules files.
#[derive(Debug, Clone, Copy)]
pub struct CompileOptions {
    /// The algorithm of rules that do not name one (`TOLLGATE_DEFAULT_ALGORITHM`; fixed window, as
    /// envoyproxy/ratelimit, unless changed).
    pub default_algorithm: Algorithm,
    /// `REDIS_PERSECOND`: per-second limits live in a Redis of their own, so an `all_or_nothing`
    /// domain may not mix them with longer ones (no request of it could be settled atomically).
    pub split_per_second: bool,
    /// The largest rules file read (`TOLLGATE_RULES_MAX_FILE_BYTES`); the YAML parser's budgets grow
    /// with each file's size, so a file within it is never refused for its number of rules.
    pub max_file_bytes: u64,
    /// The distinct request values a `detailed_metric` rule counts apart
    /// (`TOLLGATE_DETAILED_METRIC_MAX_VALUES`); beyond them values fold into the rule's own series.
    pub detailed_metric_max_values: usize,
}

impl Default for CompileOptions {
    fn default() -> Self {
        Self {
            default_algorithm: Algorithm::default(),
            split_per_second: false,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            detailed_metric_max_values: crate::observe::metrics::DETAILED_METRIC_MAX_VALUES,
        }
    }
}

impl RuleSet {
    /// Compiles validated domains. Fails only when normalisation makes two sibling values collide.
    ///
    /// The configs are consumed: each node's config is freed once it is compiled, so the compiled rules
    /// reuse its memory instead of adding to it (at 100,000 rules that is the difference between the
    /// load's peak and twice it, which the allocator keeps long after).
    pub fn compile(domains: Vec<DomainConfig>, options: CompileOptions) -> Result<Self, ConfigError> {
        Self::compile_with_metrics(domains, options, &Metrics::default())
    }

    /// [`RuleSet::compile`], with each rule's counters taken from (and kept in) `metrics`.
    pub fn compile_with_metrics(
        domains: Vec<DomainConfig>,
        options: CompileOptions,
        metrics: &Metrics,
    ) -> Result<Self, ConfigError> {
        let mut set = RuleSet::default();
        for config in domains {
            let mut ctx = Context {
                file: &config.file,
                domain_name: config.domain.as_str().into(),
                options,
                metrics,
                rules: Vec::new(),
                hashes: false,
            };
            let root = ctx.level(config.descriptors, &config.domain)?;
            if options.split_per_second && config.all_or_nothing {
                check_one_store(&ctx.rules).map_err(|message| ConfigError::Invalid {
                    file: config.file.clone(),
                    message: format!("domain '{}': {message}", config.domain),
                })?;
            }
            let keyed_as = |encoding| ctx.rules.iter().any(|r| r.value_encoding(true) == encoding);
            let domain = Domain {
                proxy: config.proxy,
                name: config.domain.clone(),
                all_or_nothing: config.all_or_nothing,
                go_keyed: keyed_as(ValueEncoding::Go),
                own_keyed: keyed_as(ValueEncoding::Escaped),
                hashes: ctx.hashes,
                root,
                rules: ctx.rules,
            };
            set.domains.insert(config.domain.clone(), domain);
        }
        Ok(set)
    }
}

/// With `REDIS_PERSECOND`, an `all_or_nothing` domain's rules must all count in one Redis: all
/// per-second (every limit a one-second window), or none.
fn check_one_store(rules: &[Arc<Rule>]) -> Result<(), String> {
    let per_second = |rule: &Rule| {
        rule.limits
            .iter()
            .filter_map(|limit| limit.rate)
            .all(|rate| rate.limit.is_per_second())
    };
    let counted: Vec<&Arc<Rule>> = rules
        .iter()
        .filter(|rule| rule.limits.iter().any(|limit| limit.rate.is_some()))
        .collect();
    let seconds = counted.iter().filter(|rule| per_second(rule)).count();
    if seconds > 0 && seconds < counted.len() {
        return Err(
            "all_or_nothing with REDIS_PERSECOND: per-second limits and longer ones would be in two Redis, \
             which cannot settle a request atomically"
                .into(),
        );
    }
    Ok(())
}

struct Context<'a> {
    file: &'a str,
    /// The domain, shared by every rule's entry in the metrics registry.
    domain_name: Arc<str>,
    options: CompileOptions,
    metrics: &'a Metrics,
    rules: Vec<Arc<Rule>>,
    /// Some descriptor says `hash: true`.
    hashes: bool,
}

impl Context<'_> {
    fn level(&mut self, descriptors: Vec<DescriptorConfig>, parent: &str) -> Result<Level, ConfigError> {
        let mut level = Level::default();
        // Normalisation is per key and level: settle it before inserting any value of that key. Most
        // descriptors have none to settle, and are looked up only once, below (an Envoy Gateway
        // file's top level is one key of some forty bytes per route).
        for d in &descriptors {
            let normalizer = Normalizer::new(&d.normalize);
            if normalizer.is_identity() && !d.normalize.hash {
                continue;
            }
            let group = level.keys.get_or_default(&d.key);
            if !normalizer.is_identity() {
                group.normalizer = normalizer;
            }
            group.hash |= d.normalize.hash;
            self.hashes |= d.normalize.hash;
        }
        for mut d in descriptors {
            // The path validation named the rule by (errors, `/rlconfig`, per-rule metrics).
            let path = format!("{parent}.{}", final_key(&d.key, d.value.as_deref()));
            let node = self.node(&mut d, &path)?;
            let group = level.keys.get_or_default(&d.key);
            self.insert(group, &d, node, &path)?;
        }
        level.shrink_to_fit();
        Ok(level)
    }

    /// The node of `d`, its children taken out of it (compiled and freed before the caller drops the
    /// rest).
    fn node(&mut self, d: &mut DescriptorConfig, path: &str) -> Result<Node, ConfigError> {
        let children = if d.descriptors.is_empty() {
            None
        } else {
            Some(Box::new(self.level(std::mem::take(&mut d.descriptors), path)?))
        };
        let rule = self.rule(d, path)?;
        Ok(Node { rule, children })
    }

    fn insert(
        &self,
        group: &mut KeyGroup,
        d: &DescriptorConfig,
        node: Node,
        path: &str,
    ) -> Result<(), ConfigError> {
        let duplicate = || ConfigError::Invalid {
            file: self.file.to_owned(),
            message: format!("duplicate descriptor composite key '{path}' (after value normalisation)"),
        };
        let (value, pattern) = match (&d.value, &d.value_match) {
            (None, _) => {
                if group.default.replace(node).is_some() {
                    return Err(duplicate());
                }
                return Ok(());
            }
            (Some(value), ValueMatch::Exact) => {
                let value = group.normalizer.apply(value).into();
                if group.exact.insert(value, node).is_some() {
                    return Err(duplicate());
                }
                return Ok(());
            }
            (Some(value), ValueMatch::Wildcard) => {
                let pattern = Wildcard::new(&group.normalizer.apply(value));
                (value, Pattern::Wildcard(pattern))
            }
            (Some(value), ValueMatch::Cidr(net)) => (value, Pattern::Cidr(*net)),
        };
        group.patterns.push(PatternNode {
            pattern,
            shared_key_value: d.share_threshold.then(|| value.as_str().into()),
            node,
        });
        Ok(())
    }

    fn rule(&mut self, d: &mut DescriptorConfig, path: &str) -> Result<Option<Arc<Rule>>, ConfigError> {
        if d.rate_limits.is_empty() && d.concurrency.is_none() {
            return Ok(None);
        }
        if d.rate_limits.len() > MAX_LIMITS_PER_RULE {
            return Err(ConfigError::Invalid {
                file: self.file.to_owned(),
                message: format!(
                    "rate_limits of '{path}' has {} limits; at most {MAX_LIMITS_PER_RULE} are allowed",
                    d.rate_limits.len()
                ),
            });
        }
        // Sized up front: collecting `Result`s loses the length, and a grown vector keeps room for
        // four limits where most rules have one (some 300 bytes a rule, as long as the rules live).
        let mut limits = Vec::with_capacity(d.rate_limits.len());
        for config in &d.rate_limits {
            limits.push(self.limit(config, path)?);
        }
        // Limits of one node are told apart in the store by algorithm and window; two equal ones (for
        // example an unset algorithm and the default named explicitly) would share one counter.
        let mut windows: Vec<_> = limits
            .iter()
            .filter_map(|l| l.rate)
            .map(|r| (r.limit.algorithm, r.limit.window_us))
            .collect();
        windows.sort_unstable_by_key(|(a, w)| (a.as_str(), *w));
        if windows.windows(2).any(|pair| pair[0] == pair[1]) {
            return Err(ConfigError::Invalid {
                file: self.file.to_owned(),
                message: format!("rate_limits of '{path}' has two limits with the same algorithm and window"),
            });
        }
        let (path, stats) = self.metrics.rule_and_path(&self.domain_name, path);
        let detailed = d.detailed_metric.then(|| {
            let max = self.options.detailed_metric_max_values;
            self.metrics.detailed(&self.domain_name, &path, max)
        });
        let rule = Arc::new(Rule {
            path,
            limits,
            concurrency: d.concurrency.map(Box::new),
            shadow_mode: d.shadow_mode,
            quota_mode: d.quota_mode,
            metadata: d.metadata.take().map(Box::new),
            stats,
            detailed,
        });
        self.rules.push(Arc::clone(&rule));
        Ok(Some(rule))
    }

    fn limit(&self, config: &RateLimitConfig, path: &str) -> Result<RuleLimit, ConfigError> {
        let rate = match &config.policy {
            LimitPolicy::Unlimited => None,
            LimitPolicy::Limited(spec) => {
                let algorithm = match &spec.algorithm {
                    Some(name) => name.parse::<Algorithm>().map_err(|e| ConfigError::Invalid {
                        file: self.file.to_owned(),
                        message: e.to_string(),
                    })?,
                    None => self.options.default_algorithm,
                };
                // The file was validated without knowing the default algorithm; the cap holds for it too.
                if algorithm == Algorithm::SlidingLog
                    && let Some(message) =
                        sliding_log_too_large(spec.requests_per_unit, &format!("descriptor '{path}'"))
                {
                    return Err(ConfigError::Invalid {
                        file: self.file.to_owned(),
                        message,
                    });
                }
                Some(Rate::new(
                    spec.requests_per_unit,
                    spec.unit,
                    spec.unit_multiplier,
                    algorithm,
                    spec.burst,
                ))
            }
        };
        Ok(RuleLimit {
            name: config.name.as_deref().map(Arc::from),
            replaces: config.replaces.clone(),
            failure_mode: config.failure_mode,
            rate,
        })
    }
}
