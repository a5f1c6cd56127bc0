//! How requests are decided: the default algorithm, the Go service's global modes, keys, bounds on a
//! request, and the secrets behind hashed values and refund tokens.

use tollgate_core::algorithm::Algorithm;
use tollgate_core::limiter::DEFAULT_MAX_DESCRIPTORS;

use super::source::{Go, Reader};
use super::{Origins, Secret, SettingsError};

/// The decision settings.
#[derive(Debug, Clone)]
pub struct DecisionSettings {
    /// Algorithm of rules and overrides that do not name one.
    pub default_algorithm: Algorithm,
    /// `SHADOW_MODE`: never answer OVER_LIMIT overall.
    pub shadow_mode: bool,
    /// `QUOTA_MODE`: every descriptor is in quota mode.
    pub quota_mode: bool,
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: a request over one of its limits increments none of
    /// the others.
    pub stop_cache_key_increment_when_overlimit: bool,
    /// `NEAR_LIMIT_RATIO`: allowed hits above this fraction of a limit count as `near_limit`.
    pub near_limit_ratio: f64,
    /// `CACHE_KEY_PREFIX`: prepended to every storage key.
    pub cache_key_prefix: String,
    /// Secret for hashing descriptor values (`hash: true`); every replica must share it.
    pub hash_key: Secret,
    /// The secret that signs refund tokens, shared by every replica so a token verifies on any of them.
    /// Several keys separated by commas or newlines: the first signs, all verify (rotation: put the new
    /// key first, drop the old one once its tokens have expired).
    pub refund_key: Secret,
    /// A file holding the refund keys (as `refund_key`; a Kubernetes Secret mounted as a file). Used
    /// when `refund_key` is empty.
    pub refund_key_file: String,
    /// Requests with more descriptors are refused with INVALID_ARGUMENT.
    pub max_descriptors: usize,
    /// How many replicas share the limits. While the store is unreachable, a rule with
    /// `failure_mode: local` counts in this instance at its limit divided by this.
    pub fleet_size: u32,
}

impl DecisionSettings {
    pub(super) fn read(r: &mut Reader<'_>) -> Result<Self, SettingsError> {
        Ok(Self {
            default_algorithm: r.get("default_algorithm", Go::None, Algorithm::FixedWindow)?,
            shadow_mode: r.get("shadow_mode", Go::Same, false)?,
            quota_mode: r.get("quota_mode", Go::Same, false)?,
            stop_cache_key_increment_when_overlimit: r.get(
                "stop_cache_key_increment_when_overlimit",
                Go::Same,
                false,
            )?,
            near_limit_ratio: r.get("near_limit_ratio", Go::Same, 0.8)?,
            cache_key_prefix: r.get("cache_key_prefix", Go::Same, String::new())?,
            hash_key: r.get("hash_key", Go::None, Secret::default())?,
            refund_key: r.get("refund_key", Go::None, Secret::default())?,
            refund_key_file: r.get("refund_key_file", Go::None, String::new())?,
            max_descriptors: r.get("max_descriptors", Go::None, DEFAULT_MAX_DESCRIPTORS)?,
            fleet_size: r.get("fleet_size", Go::None, 1)?,
        })
    }

    pub(super) fn validate(&self, origins: &Origins) -> Result<(), SettingsError> {
        if self.fleet_size == 0 {
            return Err(origins.bad("fleet_size", "0", "a fleet has at least one replica"));
        }
        if self.max_descriptors == 0 {
            return Err(origins.bad(
                "max_descriptors",
                "0",
                "a limit of zero would refuse every request",
            ));
        }
        if self.near_limit_ratio < 0.0 {
            return Err(origins.bad(
                "near_limit_ratio",
                &self.near_limit_ratio.to_string(),
                "a fraction of the limit, 0 or more",
            ));
        }
        Ok(())
    }
}
