//! HAProxy with examples/haproxy/haproxy.cfg and its Lua action, examples/haproxy/tollgate.lua.

use std::process::Command;

use super::{Proxy, Traits, example, run, write};
use crate::common::redis::free_port;

/// The example on a free port with the Lua file beside it; the fail-closed twin says `closed`.
async fn haproxy(tollgate: u16, app: u16, fail_open: bool) -> Proxy {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let lua = write(
        dir.path(),
        "tollgate.lua",
        &example("examples/haproxy/tollgate.lua", &[]),
    );
    let mut replacements = vec![
        ("http://127.0.0.1:8080", format!("http://127.0.0.1:{tollgate}")),
        ("127.0.0.1:9000", format!("127.0.0.1:{app}")),
        ("bind :8000", format!("bind 127.0.0.1:{port}")),
        ("/etc/haproxy/tollgate.lua", lua.display().to_string()),
    ];
    if !fail_open {
        replacements.push(("lua.tollgate api open", "lua.tollgate api closed".to_owned()));
    }
    let config = write(
        dir.path(),
        "haproxy.cfg",
        &example("examples/haproxy/haproxy.cfg", &replacements),
    );
    let mut command = Command::new("haproxy");
    command.arg("-f").arg(&config).arg("-db");
    Proxy::start(command, port, dir).await
}

#[tokio::test]
async fn haproxy_in_front_of_tollgate() {
    let traits = Traits {
        closed_status: 503,
        fields_to_client: true,
    };
    run("haproxy", traits, haproxy).await;
}
