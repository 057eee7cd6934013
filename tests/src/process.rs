//! Real processes for end-to-end tests: started with an environment,
//! waited for until they answer, killed (for real) when dropped.

use std::net::{SocketAddr, TcpListener};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// The ports handed to servers a test starts as child processes: below the
/// kernel's ephemeral range (`net.ipv4.ip_local_port_range`, 32768–60999 by
/// default), where a listener bound to port 0 (a test's own server, a
/// `Partition`, a proxy) and every outgoing connection take theirs. A port
/// picked by binding port 0 and closing the listener could be taken by such
/// a listener in the next instant, before the child binds it: the child then
/// exits, or worse, its test talks to another test's server.
const CHILD_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// A free port for a child process's server: the next one in
/// `CHILD_PORTS` (20000 to 31999) that can be bound now (distinct within this process;
/// each process starts at its own offset, so two test processes rarely
/// meet).
///
/// # Panics
///
/// When no port of the range can be bound.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let span = u32::from(CHILD_PORTS.end - CHILD_PORTS.start);
    let offset = std::process::id().wrapping_mul(7_919);
    for _ in 0..span {
        let next = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = CHILD_PORTS.start
            + u16::try_from(offset.wrapping_add(next) % span).expect("within the range");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {CHILD_PORTS:?} on 127.0.0.1");
}

/// `count` distinct free ports for child processes (see [`free_port`]).
pub fn free_ports(count: usize) -> Vec<u16> {
    (0..count).map(|_| free_port()).collect()
}

/// A free address on loopback for a child process's server (see
/// [`free_port`]).
///
/// # Panics
///
/// When no port can be bound.
pub fn free_address() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

/// A child process that is killed when dropped.
pub struct Process {
    child: Child,
    /// The address it listens on.
    pub address: SocketAddr,
    program: String,
}

impl Process {
    /// Starts `program` with `LISTEN` set to a free address and `env`, and
    /// waits until `health_path` answers 200 (at most 30 s).
    ///
    /// # Panics
    ///
    /// When it cannot start, or exits or stays silent before answering.
    pub async fn start(program: &str, env: &[(&str, &str)], health_path: &str) -> Self {
        let address = free_address();
        Self::start_at(program, address, env, health_path).await
    }

    /// Like [`Process::start`], on a given address (to restart a process
    /// where it was).
    ///
    /// # Panics
    ///
    /// When it cannot start, or exits or stays silent before answering.
    pub async fn start_at(
        program: &str,
        address: SocketAddr,
        env: &[(&str, &str)],
        health_path: &str,
    ) -> Self {
        Self::start_command(program, &[], address, env, health_path).await
    }

    /// Like [`Process::start`], with arguments (a script for an
    /// interpreter: `python3 server.py`).
    ///
    /// # Panics
    ///
    /// When it cannot start, or exits or stays silent before answering.
    pub async fn start_with_args(
        program: &str,
        args: &[&str],
        env: &[(&str, &str)],
        health_path: &str,
    ) -> Self {
        Self::start_command(program, args, free_address(), env, health_path).await
    }

    async fn start_command(
        program: &str,
        args: &[&str],
        address: SocketAddr,
        env: &[(&str, &str)],
        health_path: &str,
    ) -> Self {
        let mut command = Command::new(program);
        command
            .args(args)
            .env("LISTEN", address.to_string())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        for (name, value) in env {
            command.env(name, value);
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
        let mut process = Self {
            child,
            address,
            program: program.to_owned(),
        };
        process.wait_until_answering(health_path).await;
        process
    }

    async fn wait_until_answering(&mut self, health_path: &str) {
        let url = format!("http://{}{health_path}", self.address);
        for _ in 0..300 {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{} exited with {status} before answering", self.program);
            }
            if status_of_get(&url).await == Some(200) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{} did not answer {url} within 30 s", self.program);
    }

    /// The operating system's id of the process.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The process's resident memory now (`VmRSS`), in KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// The process's peak resident memory so far (`VmHWM`), in KiB.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// Waits for the process to exit (after a signal, say).
    ///
    /// # Panics
    ///
    /// When the process cannot be waited for.
    pub async fn wait(&mut self) -> std::process::ExitStatus {
        self.child.wait().await.expect("wait for the process")
    }

    /// Kills the process with SIGKILL (no cleanup, no graceful shutdown) and
    /// waits for it to be gone.
    ///
    /// # Panics
    ///
    /// When the process cannot be killed.
    pub async fn kill(mut self) {
        self.child.kill().await.expect("kill -9");
    }
}

/// The status code of a plain `GET`, over a raw TCP connection (so this
/// helper needs no HTTP client).
async fn status_of_get(url: &str) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_owned()), |(h, p)| (h, format!("/{p}")));
    let mut stream =
        tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(host))
            .await
            .ok()?
            .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut head = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(2), stream.read_exact(&mut head))
        .await
        .ok()?
        .ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}
