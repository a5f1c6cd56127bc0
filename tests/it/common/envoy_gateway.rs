//! Tollgate as Envoy Gateway runs envoyproxy/ratelimit: the binary invoked as `ratelimit` with no
//! arguments and exactly the environment Envoy Gateway's infrastructure gives the container (see
//! `docs/envoy-gateway.md`), certificates laid out as its `envoy-rate-limit` Secret mounts them.
//!
//! Two differences from a pod, both forced by the test machine: the certificates live in a temporary
//! directory instead of `/certs`, and the ports are 0 (free) instead of 8081/8080/6070.

use std::process::Command;

use super::certs::CertDir;
use super::process::BIN;

/// Envoy Gateway's rate limit container environment, certificates under `certs`, xDS at `xds`.
pub fn envoy_gateway_env(certs: &CertDir, xds: &str, client_ca: bool) -> Vec<(String, String)> {
    let (crt, key, ca) = (
        certs.path_str("tls.crt"),
        certs.path_str("tls.key"),
        certs.path_str("ca.crt"),
    );
    let mut env = vec![
        ("RUNTIME_ROOT", "/data".to_owned()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".to_owned()),
        ("RUNTIME_IGNOREDOTFILES", "true".to_owned()),
        ("RUNTIME_WATCH_ROOT", "false".to_owned()),
        ("LOG_LEVEL", "info".to_owned()),
        ("USE_STATSD", "false".to_owned()),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".to_owned()),
        ("CONFIG_GRPC_XDS_SERVER_URL", xds.to_owned()),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit".to_owned()),
        ("GRPC_SERVER_USE_TLS", "true".to_owned()),
        ("GRPC_SERVER_TLS_CERT", crt.clone()),
        ("GRPC_SERVER_TLS_KEY", key.clone()),
        ("GRPC_SERVER_TLS_CA_CERT", ca.clone()),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".to_owned()),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", crt),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ca.clone()),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".to_owned()),
        // The test machine's only changes: free ports.
        ("GRPC_PORT", "0".to_owned()),
        ("PORT", "0".to_owned()),
        ("DEBUG_PORT", "0".to_owned()),
    ];
    if client_ca {
        // What docs/envoy-gateway.md adds to require Envoy's client certificate.
        env.push(("GRPC_CLIENT_TLS_CACERT", ca));
    }
    env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// `/bin/ratelimit`: the binary under that name, no arguments.
pub fn ratelimit_command(dir: &std::path::Path, env: &[(String, String)]) -> Command {
    let link = dir.join("ratelimit");
    if !link.exists() {
        std::os::unix::fs::symlink(BIN, &link).expect("link ratelimit to the binary");
    }
    let mut command = Command::new(link);
    command
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("NO_COLOR", "1");
    command
}
