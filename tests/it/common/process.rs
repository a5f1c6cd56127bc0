//! `tollgate` as a child process: a command with a cleared environment, and a running `tollgate serve`
//! found by its `tollgate serving` log line (so it can bind port 0), killed on drop unless it exited.
//! Every wait is bounded.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::Guard;

/// The debug binary cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

pub const STARTUP: Duration = Duration::from_secs(10);
pub const EXIT: Duration = Duration::from_secs(5);
pub const POLL: Duration = Duration::from_millis(10);

/// `tollgate serve` of the rules in `config_dir`, every listener on a free loopback port.
pub fn serve_args(config_dir: &str) -> [&str; 9] {
    serve_args_at(config_dir, "127.0.0.1:0")
}

/// `tollgate serve` of the rules in `config_dir`, gRPC on `grpc` (a restart passes the address it had),
/// the other listeners on free loopback ports.
pub fn serve_args_at<'a>(config_dir: &'a str, grpc: &'a str) -> [&'a str; 9] {
    let any = "127.0.0.1:0";
    [
        "serve",
        "--config-dir",
        config_dir,
        "--grpc-addr",
        grpc,
        "--http-addr",
        any,
        "--debug-addr",
        any,
    ]
}

/// A command for the binary with an empty environment (so the developer's variables cannot leak in).
pub fn tollgate(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .env("NO_COLOR", "1")
        .stdin(Stdio::null());
    command
}

impl Guard {
    /// Waits for the exit within `bound` by polling; `None` if it is still running.
    pub fn wait_for(&mut self, bound: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + bound;
        loop {
            if let Some(status) = self.0.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(POLL);
        }
    }
}

/// Removes ANSI escape sequences (`ESC [ ... letter`), in case the log is coloured.
pub fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The addresses from the `tollgate serving grpc=ADDR http=ADDR debug=ADDR` log line (text, or the
/// JSON of `LOG_FORMAT=json`).
pub fn parse_serving(line: &str) -> Option<(SocketAddr, SocketAddr, SocketAddr)> {
    let line = strip_ansi(line);
    if !line.contains("tollgate serving") {
        return None;
    }
    if let Ok(json) = serde_json::from_str::<Value>(&line) {
        let field = |name: &str| json[name].as_str()?.parse().ok();
        return Some((field("grpc")?, field("http")?, field("debug")?));
    }
    let field = |name: &str| -> Option<SocketAddr> {
        line.split_whitespace()
            .find_map(|token| token.strip_prefix(&format!("{name}=")))
            .and_then(|value| value.trim_matches('"').parse().ok())
    };
    Some((field("grpc")?, field("http")?, field("debug")?))
}

/// A running `tollgate serve`, killed on drop unless it exited.
pub struct Served {
    child: Guard,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub debug: SocketAddr,
    pub stderr: mpsc::Receiver<String>,
    pub log: Vec<String>,
}

impl Served {
    pub async fn start(args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_command(tollgate(args, env)).await
    }

    /// Starts `command` (a binary with its arguments and environment) and waits for its addresses.
    pub async fn start_command(mut command: Command) -> Self {
        command.stdout(Stdio::null()).stderr(Stdio::piped());
        tokio::task::spawn_blocking(move || Self::start_blocking(command))
            .await
            .expect("starter thread")
    }

    fn start_blocking(mut command: Command) -> Self {
        let mut child = Guard(command.spawn().expect("spawn tollgate serve"));
        let stderr = child.0.stderr.take().expect("stderr piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + STARTUP;
        let mut log = Vec::new();
        let addresses = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    let parsed = parse_serving(&line);
                    log.push(line);
                    if let Some(addresses) = parsed {
                        break addresses;
                    }
                }
                Err(_) => {
                    let exit = child.0.try_wait().ok().flatten();
                    panic!(
                        "no `tollgate serving` line with addresses (exit: {exit:?}); stderr so far:\n{}",
                        log.join("\n")
                    );
                }
            }
        };
        let (grpc, http, debug) = addresses;
        Self {
            child,
            grpc,
            http,
            debug,
            stderr: rx,
            log,
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }

    /// Sends SIGTERM without waiting for the exit.
    pub fn signal_term(&self) {
        let pid = self.child.0.id().to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -TERM delivered");
    }

    /// Sends SIGTERM and returns the exit code, bounded.
    pub async fn terminate(self) -> Option<i32> {
        self.terminate_logged().await.0
    }

    /// Sends SIGTERM; returns the exit code and every line logged, bounded.
    pub async fn terminate_logged(self) -> (Option<i32>, Vec<String>) {
        self.signal_term();
        self.wait_exit_logged().await
    }

    /// Waits (bounded) for the process to exit and returns its code.
    pub async fn wait_exit(self) -> Option<i32> {
        self.wait_exit_logged().await.0
    }

    /// Waits (bounded) for the process to exit; returns its code and every line it logged.
    pub async fn wait_exit_logged(mut self) -> (Option<i32>, Vec<String>) {
        tokio::task::spawn_blocking(move || {
            let Some(status) = self.child.wait_for(EXIT) else {
                self.log.extend(self.stderr.try_iter());
                panic!(
                    "no exit within {EXIT:?} of SIGTERM; stderr:\n{}",
                    self.log.join("\n")
                );
            };
            // The reader thread ends with the pipe: every line is in the channel now or soon.
            self.log.extend(self.stderr.iter());
            (status.code(), self.log)
        })
        .await
        .expect("waiter thread")
    }
}
