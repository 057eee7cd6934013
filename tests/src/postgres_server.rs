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
    /// Extra `postgres` options (`-c name=value ...`).
    settings: String,
    /// Left to the watchdog: not stopped when dropped.
    detached: bool,
    _dir: Option<tempfile::TempDir>,
}

/// The directory of the PostgreSQL server binaries: the newest that
/// Debian installed under `/usr/lib/postgresql`, else the one of `initdb`
/// on `PATH`.
///
/// # Panics
///
/// When neither has `initdb` and `pg_ctl` (the message names the Debian
/// package).
fn binaries() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path().join("bin"))
                .collect()
        })
        .unwrap_or_default();
    versions.sort_by_key(|bin| {
        // "9.6" < "15": compare the major version as a number.
        bin.parent()
            .and_then(|version| version.file_name())
            .and_then(|name| name.to_str())
            .and_then(|name| name.split('.').next())
            .and_then(|major| major.parse::<u32>().ok())
            .unwrap_or(0)
    });
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    versions
        .into_iter()
        .rev()
        .chain(on_path)
        .find(|bin| bin.join("initdb").is_file() && bin.join("pg_ctl").is_file())
        .unwrap_or_else(|| {
            panic!(
                "PostgreSQL's initdb and pg_ctl are not installed: install the Debian package \
                 postgresql (`apt-get install postgresql`), or point TEST_POSTGRES_URL at a server"
            )
        })
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

/// Has a watchdog stop the server whose data directory is `dir/data` and
/// remove `dir` once the test process exits, however it exits (a server
/// dropped before then is already stopped and its directory gone).
fn watch(dir: &Path) {
    // Immediate shutdown (SIGQUIT), then SIGKILL if it lingers.
    let pid_file = crate::watchdog::shell_quote(&format!("{}/data/postmaster.pid", dir.display()));
    let quoted = crate::watchdog::shell_quote(&dir.display().to_string());
    crate::watchdog::run_at_exit(&format!(
        "pid=$(head -n 1 {pid_file} 2>/dev/null)\n\
         if [ -n \"$pid\" ]; then\n\
           kill -QUIT \"$pid\" 2>/dev/null\n\
           for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 \"$pid\" 2>/dev/null || break; sleep 0.3; done\n\
           kill -9 \"$pid\" 2>/dev/null\n\
         fi\n\
         rm -rf {quoted}"
    ));
}

/// Gives `dir` to the `postgres` user, who must own what the server writes.
fn own(dir: &Path) {
    let _ = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(dir)
        .status();
    let _ = Command::new("chmod").args(["755"]).arg(dir).status();
}

/// A fresh temporary directory for one server.
fn server_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("idempotency-pg-")
        .tempdir()
        .expect("a temporary directory")
}

impl PostgresServer {
    /// Creates a cluster (trust auth) and starts it on a free port.
    ///
    /// # Panics
    ///
    /// When the binaries are missing or the server does not start.
    pub fn start() -> Self {
        Self::start_with(&[], false)
    }

    /// Starts a server that lives until this test process exits, however it
    /// exits (a watchdog stops it and removes its directory), and returns
    /// its port. Durability is off (`fsync=off`): the tests that use it
    /// never crash it, and it is thrown away with the process.
    ///
    /// # Panics
    ///
    /// When the binaries are missing or the server does not start.
    pub(crate) fn start_until_exit() -> u16 {
        let server = Self::start_with(
            &[
                "-c fsync=off",
                "-c synchronous_commit=off",
                "-c full_page_writes=off",
                "-c max_connections=300",
            ],
            true,
        );
        server.port
    }

    /// Creates a cluster (trust auth) with extra `postgres` settings
    /// (`"-c name=value"` each) and starts it on a free port.
    ///
    /// # Panics
    ///
    /// When the binaries are missing or the server does not start.
    pub fn start_with_settings(settings: &[&str]) -> Self {
        Self::start_with(settings, false)
    }

    /// A streaming standby of the server at `primary` (a hot standby,
    /// trust auth): a base backup taken over the replication protocol
    /// (`pg_basebackup -R`, which writes `standby.signal` and a
    /// `primary_conninfo` with `application_name=name`, the name
    /// `synchronous_standby_names` lists), started on a free port with
    /// extra `settings`.
    ///
    /// # Panics
    ///
    /// When the base backup fails or the standby does not start.
    pub fn standby_of(primary: std::net::SocketAddr, name: &str, settings: &[&str]) -> Self {
        let bin = binaries();
        let dir = server_dir();
        watch(dir.path());
        own(dir.path());
        let data = dir.path().join("data");
        let connection = format!("application_name={name}");
        let port = primary.port().to_string();
        let host = primary.ip().to_string();
        let backup = run(
            &bin.join("pg_basebackup"),
            &[
                "-h",
                &host,
                "-p",
                &port,
                "-U",
                "postgres",
                "-D",
                data.to_str().unwrap_or_default(),
                "-X",
                "stream",
                "-R",
                "-d",
                &connection,
            ],
        );
        assert!(
            backup.status.success(),
            "pg_basebackup failed: {}",
            String::from_utf8_lossy(&backup.stderr)
        );
        let server = Self {
            port: crate::process::free_address().port(),
            bin,
            data,
            settings: settings.join(" "),
            detached: false,
            _dir: Some(dir),
        };
        server.start_again();
        server
    }

    /// Its address (127.0.0.1 and its port).
    pub fn address(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Promotes a standby to a primary (`pg_ctl promote`): it replays
    /// every write it has received, then takes writes itself.
    ///
    /// # Panics
    ///
    /// When the promotion fails or does not finish within 30 s.
    pub fn promote(&self) {
        let promoted = run(
            &self.bin.join("pg_ctl"),
            &[
                "-D",
                self.data.to_str().unwrap_or_default(),
                "-w",
                "-t",
                "30",
                "promote",
            ],
        );
        assert!(
            promoted.status.success(),
            "pg_ctl promote failed: {}",
            String::from_utf8_lossy(&promoted.stderr)
        );
    }

    /// Creates and starts a cluster with extra `settings`; `until_exit`
    /// leaves stopping it to the watchdog that acts when the test process
    /// exits (every server has one: it also stops a server whose process
    /// ended without dropping it).
    fn start_with(settings: &[&str], until_exit: bool) -> Self {
        let bin = binaries();
        let dir = server_dir();
        watch(dir.path());
        own(dir.path());
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
            settings: settings.join(" "),
            detached: until_exit,
            _dir: if until_exit {
                // The watchdog removes it.
                let _ = dir.keep();
                None
            } else {
                Some(dir)
            },
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
            "-p {} -c listen_addresses=127.0.0.1 -k {} {}",
            self.port,
            self.socket_dir(),
            self.settings
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
        if !self.detached {
            self.stop();
        }
    }
}
