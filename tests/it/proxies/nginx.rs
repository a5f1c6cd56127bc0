//! NGINX (`auth_request`) with examples/nginx/tollgate.conf.

use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;

use super::{Proxy, Traits, example, run, write};
use crate::common::redis::free_port;

/// The example in a minimal `nginx.conf` of a directory of its own, listening on a free port; the
/// fail-closed twin without its `error_page 500` line, as the file says.
async fn nginx(tollgate: u16, app: u16, fail_open: bool) -> Proxy {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let mut replacements = vec![
        ("127.0.0.1:8080", format!("127.0.0.1:{tollgate}")),
        ("127.0.0.1:9000", format!("127.0.0.1:{app}")),
        ("listen 8000;", format!("listen 127.0.0.1:{port};")),
    ];
    if !fail_open {
        replacements.push(("        error_page 500 = @tollgate_down;\n", String::new()));
    }
    let conf = example("examples/nginx/tollgate.conf", &replacements);
    let site = write(dir.path(), "tollgate.conf", &conf);
    // Run as root, NGINX's workers are `nobody`: they buffer request bodies in here.
    let temp = dir.path().join("temp");
    std::fs::create_dir(&temp).expect("temp");
    for open in [dir.path(), temp.as_path()] {
        std::fs::set_permissions(open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    }
    let temp = temp.display();
    let main = format!(
        "pid {dir}/nginx.pid;\nworker_processes 1;\nevents {{ worker_connections 256; }}\nhttp {{\n  access_log off;\n  client_body_temp_path {temp};\n  proxy_temp_path {temp};\n  fastcgi_temp_path {temp};\n  uwsgi_temp_path {temp};\n  scgi_temp_path {temp};\n  include {site};\n}}\n",
        dir = dir.path().display(),
        site = site.display(),
    );
    let main = write(dir.path(), "nginx.conf", &main);
    let mut command = Command::new("nginx");
    command
        .arg("-p")
        .arg(dir.path())
        .arg("-e")
        .arg(dir.path().join("error.log"))
        .arg("-c")
        .arg(&main)
        .args(["-g", "daemon off;"]);
    Proxy::start(command, port, dir).await
}

#[tokio::test]
async fn nginx_in_front_of_tollgate() {
    let traits = Traits {
        closed_status: 500,
        fields_to_client: true,
    };
    run("nginx", traits, nginx).await;
}
