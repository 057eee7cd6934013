//! A private `redis-server` a test owns: on its own port and directory, so
//! the test can stop and restart it without touching the shared Redis.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// A `redis-server` child process; killed when dropped.
pub struct RedisServer {
    /// Where it listens.
    pub address: SocketAddr,
    dir: tempfile::TempDir,
    durable: bool,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server on a free port. `durable` turns on the append-only
    /// file with `appendfsync always`, so a restart loses nothing.
    ///
    /// # Panics
    ///
    /// When `redis-server` is not installed or does not start.
    pub async fn start(durable: bool) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let address = crate::process::free_address();
        let mut server = Self {
            address,
            dir,
            durable,
            child: None,
        };
        server.launch().await;
        server
    }

    /// The `redis://` URL of the server.
    pub fn url(&self) -> String {
        format!("redis://{}", self.address)
    }

    async fn launch(&mut self) {
        let mut command = Command::new("redis-server");
        command
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &self.address.port().to_string(),
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--save", ""])
            .args(["--appendonly", if self.durable { "yes" } else { "no" }])
            .args(["--appendfsync", "always"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let child = command.spawn().unwrap_or_else(|error| {
            panic!("cannot start redis-server ({error}): install it with `apt-get install redis-server`")
        });
        self.child = Some(child);
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(self.address).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("redis-server did not listen on {} within 5 s", self.address);
    }

    /// Kills the server (SIGKILL: a crash, not a shutdown).
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Starts the server again on the same port and directory.
    pub async fn restart(&mut self) {
        self.kill().await;
        self.launch().await;
    }
}
