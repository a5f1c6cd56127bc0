//! envoyproxy/ratelimit's environment variables that Tollgate does not act on, each a warning that
//! says what happens instead, and variables that look like a setting mistyped. (The Go names Tollgate
//! honours are read where each setting is, see [`super::source`]; docs/settings.md tables them all.)

use std::collections::HashMap;

use super::SETTINGS_FILE_ENV;
use super::source::{Entry, native_name, nearest};

/// envoyproxy/ratelimit settings (or prefixes of families) Tollgate accepts and ignores, with what
/// happens instead; each present one is a warning at startup.
pub const GO_IGNORED: &[(&str, &str)] = &[
    (
        "GRPC_SERVER_TLS_CA_CERT",
        "envoyproxy/ratelimit does not read it either (Envoy Gateway sets it); set GRPC_CLIENT_TLS_CACERT to require client certificates",
    ),
    (
        "RUNTIME_WATCH_ROOT",
        "every change to the rules directory reloads",
    ),
    ("RUNTIME_IGNOREDOTFILES", "dot-files are always ignored"),
    (
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        "one script call per slot, all in parallel",
    ),
    (
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        "connections are multiplexed: no pool runs empty",
    ),
    (
        "REDIS_STARTUP_",
        "Tollgate starts at once and connects to Redis in the background",
    ),
    (
        "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
        "one script call per slot, all in parallel",
    ),
    (
        "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
        "connections are multiplexed: no pool runs empty",
    ),
    ("MEMCACHE_", "there is no memcache backend"),
];

/// Adds a warning for each variable of `env` that is an envoyproxy/ratelimit setting Tollgate accepts
/// without acting on it (saying what happens instead), that is no Tollgate setting though it is named
/// like one (`TOLLGATE_*`), or that looks like a mistyped setting of either kind; `known` is every
/// setting. Nothing is ignored in silence; a value Tollgate cannot honour where ignoring it would
/// weaken limits or security is refused where it is read (`BACKEND_TYPE=memcache`).
pub(super) fn warnings(env: &HashMap<String, String>, known: &[Entry], warnings: &mut Vec<String>) {
    let natives: Vec<String> = known.iter().map(|e| native_name(&e.key)).collect();
    let go_names: Vec<&str> = known
        .iter()
        .flat_map(|e| e.go.iter().copied())
        .chain(
            GO_IGNORED
                .iter()
                .map(|(name, _)| *name)
                .filter(|name| !name.ends_with('_')),
        )
        .collect();
    let mut names: Vec<&String> = env.keys().collect();
    names.sort();
    for name in names {
        if let Some((_, instead)) = GO_IGNORED.iter().find(|(known, _)| name.starts_with(known)) {
            warnings.push(format!("ignoring {name}: {instead}"));
        } else if name.starts_with("TOLLGATE_") {
            if name != SETTINGS_FILE_ENV && !natives.contains(name) {
                let hint = nearest(name, natives.iter().map(String::as_str))
                    .map_or_else(String::new, |n| format!(" (did you mean {n}?)"));
                warnings.push(format!("ignoring {name}: not a Tollgate setting{hint}"));
            }
        } else if !go_names.contains(&name.as_str())
            && let Some(meant) = nearest(name, go_names.iter().copied())
        {
            warnings.push(format!("ignoring {name}: not a setting (did you mean {meant}?)"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warned(pairs: &[(&str, &str)]) -> Vec<String> {
        let env = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut out = Vec::new();
        warnings(&env, &super::super::Settings::catalogue(), &mut out);
        out
    }

    #[test]
    fn typos_of_settings_are_named_with_the_setting_meant() {
        let out = warned(&[
            ("REDIS_URl", "r:6379"),
            ("TOLLGATE_REDIS_DEADLNE", "5ms"),
            ("SHADOW_MOD", "true"),
        ]);
        for expected in [
            "ignoring REDIS_URl: not a setting (did you mean REDIS_URL?)",
            "ignoring TOLLGATE_REDIS_DEADLNE: not a Tollgate setting (did you mean TOLLGATE_REDIS_DEADLINE?)",
            "ignoring SHADOW_MOD: not a setting (did you mean SHADOW_MODE?)",
        ] {
            assert!(out.iter().any(|w| w == expected), "{expected} not in {out:?}");
        }
    }

    #[test]
    fn the_environment_of_a_container_raises_nothing() {
        let out = warned(&[
            ("HOME", "/root"),
            ("HOSTNAME", "tollgate-0"),
            ("PATH", "/usr/bin"),
            ("TERM", "xterm"),
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ("KUBERNETES_PORT", "tcp://10.0.0.1:443"),
            ("REDIS_SERVICE_HOST", "10.0.0.9"),
            ("REDIS_PORT", "tcp://10.0.0.9:6379"),
            ("REDIS_URL", "redis:6379"),
            ("TOLLGATE_SETTINGS_FILE", "/etc/tollgate.yaml"),
        ]);
        assert!(out.is_empty(), "{out:?}");
    }
}
