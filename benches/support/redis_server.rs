//! A `redis-server` of the benchmark's own (shared by the Redis benches through `#[path]`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` of our own on a fixed loopback port; killed when dropped, panics included.
pub(crate) struct RedisServer {
    pub(crate) port: u16,
    child: Option<Child>,
}

impl RedisServer {
    pub(crate) fn start_on_free_port() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("find a free loopback port")
            .port();
        let mut server = Self { port, child: None };
        server.start();
        server
    }

    /// Starts (or restarts) the server on `self.port` and waits until it answers PING. With
    /// `TOLLGATE_BENCH_REDIS_WRAPPER` set (say `valgrind --tool=callgrind ...`), the server runs under
    /// that command; see `scripts/bench/bench-redis-script-instructions.sh`.
    pub(crate) fn start(&mut self) {
        assert!(self.child.is_none(), "redis-server already running");
        let wrapper = std::env::var("TOLLGATE_BENCH_REDIS_WRAPPER").unwrap_or_default();
        let mut command: Vec<&str> = wrapper.split_whitespace().collect();
        command.push("redis-server");
        let child = Command::new(command[0])
            .args(&command[1..])
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server (is it on PATH?)");
        self.child = Some(child);
        // Long enough for a server started under valgrind.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.answers_ping() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer PING within 30 s"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// SIGKILL, as a crash would, and waits for the process to be gone.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Already exited is fine: either way it is gone once `wait` returns.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `SHUTDOWN NOSAVE`, and waits for the process to exit: a clean exit, after which a wrapper
    /// such as valgrind writes its report (a SIGKILL would lose it).
    #[allow(dead_code)] // Only the benches that may run under a wrapper call it.
    pub(crate) fn shutdown(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = stream.write_all(b"SHUTDOWN NOSAVE\r\n");
            }
            let _ = child.wait();
        }
    }

    fn answers_ping(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let mut reply = [0u8; 7];
        stream.set_read_timeout(Some(Duration::from_millis(200))).is_ok()
            && stream.write_all(b"PING\r\n").is_ok()
            && stream.read_exact(&mut reply).is_ok()
            && &reply == b"+PONG\r\n"
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
