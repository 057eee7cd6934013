//! A private PostgreSQL server a test owns: its own data directory and
//! port, so the test can stop and start it without touching the shared
//! server on 5432.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A PostgreSQL cluster in a temporary directory; stopped and removed when
/// dropped.
pub struct PostgresServer {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    bin: PathBuf,
    data: PathBuf,
    _dir: tempfile::TempDir,
}

/// The newest PostgreSQL binaries Debian installed.
fn binaries() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path().join("bin"))
                .collect()
        })
        .unwrap_or_default();
    versions.sort();
    versions
        .pop()
        .filter(|bin| bin.join("initdb").is_file())
        .unwrap_or_else(|| panic!("no PostgreSQL server binaries under /usr/lib/postgresql: apt-get install postgresql"))
}

/// Runs a PostgreSQL tool, as the `postgres` user when running as root
/// (PostgreSQL refuses to run as root).
fn run(program: &Path, args: &[&str]) -> std::process::Output {
    let as_root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0"));
    let mut command = if as_root {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    };
    command
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()))
}

impl PostgresServer {
    /// Creates a cluster (trust auth) and starts it on a free port.
    ///
    /// # Panics
    ///
    /// When the binaries are missing or the server does not start.
    pub fn start() -> Self {
        let bin = binaries();
        let dir = tempfile::Builder::new()
            .prefix("idempotency-pg-")
            .tempdir()
            .expect("a temporary directory");
        // The postgres user must own the directory it writes to.
        let _ = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir.path())
            .status();
        let _ = Command::new("chmod").args(["755"]).arg(dir.path()).status();
        let data = dir.path().join("data");
        let init = run(
            &bin.join("initdb"),
            &[
                "-D",
                data.to_str().unwrap_or_default(),
                "-A",
                "trust",
                "-U",
                "postgres",
            ],
        );
        assert!(
            init.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&init.stderr)
        );
        let port = crate::process::free_address().port();
        let server = Self {
            port,
            bin,
            data,
            _dir: dir,
        };
        server.start_again();
        server
    }

    /// The URL of database `postgres` on this server.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Starts the (stopped) server again, on the same port and data.
    ///
    /// # Panics
    ///
    /// When it does not start.
    pub fn start_again(&self) {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {}",
            self.port,
            self.socket_dir()
        );
        let log = format!("{}/server.log", self.socket_dir());
        let started = run(
            &self.bin.join("pg_ctl"),
            &[
                "-D",
                self.data.to_str().unwrap_or_default(),
                "-o",
                &options,
                "-l",
                &log,
                "-w",
                "-t",
                "30",
                "start",
            ],
        );
        assert!(
            started.status.success(),
            "pg_ctl start failed: {}",
            String::from_utf8_lossy(&started.stderr)
        );
        for _ in 0..50 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("PostgreSQL did not listen on {}", self.port);
    }

    /// Stops the server at once (`-m immediate`: like a crash, no checkpoint).
    pub fn stop(&self) {
        let _ = run(
            &self.bin.join("pg_ctl"),
            &[
                "-D",
                self.data.to_str().unwrap_or_default(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
    }

    fn socket_dir(&self) -> String {
        self.data
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
    }
}
