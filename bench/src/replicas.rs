//! The private Redis primary with one replica of `--replica-acks-only`
//! (issue 32): started on free ports in a temporary directory, killed when
//! dropped. Both the plain and the acknowledged runs use it, so they pay
//! the same replication stream; only the `WAIT` differs.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

/// A primary and its replica.
pub(crate) struct ReplicatedRedis {
    /// The primary's `redis://` URL.
    pub(crate) url: String,
    children: Vec<Child>,
    _dir: tempfile::TempDir,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl ReplicatedRedis {
    /// Starts both servers (no persistence) and waits until the replica
    /// has synchronized.
    ///
    /// # Errors
    ///
    /// When `redis-server` is missing (the message names the Debian
    /// package) or replication does not come up within 20 s.
    pub(crate) fn start() -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("idem-bench-replicated-")
            .tempdir()?;
        let (primary, replica) = (free_port()?, free_port()?);
        let mut pair = Self {
            url: format!("redis://127.0.0.1:{primary}"),
            children: Vec::new(),
            _dir: dir,
        };
        for (port, extra) in [
            (
                primary,
                vec!["--repl-diskless-sync-delay".to_owned(), "0".to_owned()],
            ),
            (
                replica,
                vec![
                    "--replicaof".to_owned(),
                    "127.0.0.1".to_owned(),
                    primary.to_string(),
                ],
            ),
        ] {
            let node_dir = pair._dir.path().join(port.to_string());
            std::fs::create_dir_all(&node_dir)?;
            let child = Command::new("redis-server")
                .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                .arg("--dir")
                .arg(&node_dir)
                .args(["--save", "", "--appendonly", "no"])
                .args(extra)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context(
                    "cannot start redis-server: install the Debian package redis-server \
                     (`apt-get install redis-server`)",
                )?;
            pair.children.push(child);
        }
        let client = redis::Client::open(format!("redis://127.0.0.1:{replica}").as_str())?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let synchronized = client.get_connection().ok().and_then(|mut connection| {
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query(&mut connection)
                    .ok()?;
                Some(
                    info.contains("master_link_status:up")
                        && info.contains("master_sync_in_progress:0"),
                )
            });
            if synchronized == Some(true) {
                return Ok(pair);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the bench's replica did not synchronize with its primary within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ReplicatedRedis {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
