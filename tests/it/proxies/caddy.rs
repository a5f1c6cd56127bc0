//! Caddy (`forward_auth`) with examples/caddy/Caddyfile; Traefik's ForwardAuth has the same contract.

use std::process::Command;

use super::{Proxy, Traits, example, run, write};
use crate::common::redis::free_port;

/// The example on free ports, its state in its own directory; the fail-closed twin without the
/// always-allow fallback, as the file says.
async fn caddy(tollgate: u16, app: u16, fail_open: bool) -> Proxy {
    let dir = tempfile::tempdir().expect("tempdir");
    let (port, fallback) = (free_port(), free_port());
    let mut replacements = vec![
        ("127.0.0.1:8080", format!("127.0.0.1:{tollgate}")),
        ("127.0.0.1:9000", format!("127.0.0.1:{app}")),
        ("http://:8000", format!("http://:{port}")),
        ("127.0.0.1:8099", format!("127.0.0.1:{fallback}")),
        ("http://:8099", format!("http://:{fallback}")),
    ];
    if !fail_open {
        replacements = vec![
            (" 127.0.0.1:8099 {", " {".to_owned()),
            (
                "\t\tlb_policy first\n\t\tlb_try_duration 1s\n\t\tfail_duration 500ms\n",
                String::new(),
            ),
            (
                "http://:8099 {\n\tbind 127.0.0.1\n\trespond 200\n}\n",
                String::new(),
            ),
            ("127.0.0.1:8080", format!("127.0.0.1:{tollgate}")),
            ("127.0.0.1:9000", format!("127.0.0.1:{app}")),
            ("http://:8000", format!("http://:{port}")),
        ];
    }
    let caddyfile = write(
        dir.path(),
        "Caddyfile",
        &example("examples/caddy/Caddyfile", &replacements),
    );
    let mut command = Command::new("caddy");
    command
        .args(["run", "--adapter", "caddyfile", "--config"])
        .arg(&caddyfile)
        .env("HOME", dir.path())
        .env("XDG_CONFIG_HOME", dir.path())
        .env("XDG_DATA_HOME", dir.path());
    Proxy::start(command, port, dir).await
}

#[tokio::test]
async fn caddy_in_front_of_tollgate() {
    let traits = Traits {
        closed_status: 502,
        fields_to_client: false,
    };
    run("caddy", traits, caddy).await;
}
