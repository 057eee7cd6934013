//! Private replicated Redis, for the failover tests: a primary with
//! replicas (`replicaof`), each replica's replication link through a
//! [`Partition`] the test can cut ([`ReplicatedRedis`]); a Redis Cluster of
//! three primaries with one replica each ([`ReplicatedCluster`]); and one
//! primary with one replica that lives as long as the test process, for the
//! conformance suites (`replicated_until_exit`).
//!
//! Every server runs on free ports, with its files in a temporary
//! directory of its own, without persistence (a killed node forgets
//! everything, as a replica that restarts without an append-only file
//! does). Servers are killed when their value is dropped and, however the
//! test process ends, by the watchdog.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use redis::FromRedisValue;

use crate::partition::Partition;
use crate::redis_server::{form_cluster, node_command, spawn_node};

/// How long the fixtures wait for replication or the cluster to settle.
const SETTLE: Duration = Duration::from_secs(20);

/// A directory for a group of servers, removed (and its servers killed)
/// by the watchdog once the test process exits.
fn group_dir(prefix: &str) -> PathBuf {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
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

/// Sends `command` to the server at `port` on a fresh connection.
///
/// # Panics
///
/// When the server does not answer or refuses the command.
fn query<T: FromRedisValue>(port: u16, command: &redis::Cmd) -> T {
    let url = format!("redis://127.0.0.1:{port}");
    let mut connection = redis::Client::open(url.as_str())
        .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(2)))
        .unwrap_or_else(|error| panic!("connect to {url}: {error}"));
    command
        .query(&mut connection)
        .unwrap_or_else(|error| panic!("{url}: {:?} failed: {error}", command.args_iter().next()))
}

/// The value of `field` in an `INFO` answer.
fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .map(|value| value.trim().to_owned())
}

/// Polls `ready` every 50 ms until it holds, for at most [`SETTLE`].
///
/// # Panics
///
/// With `what` when it never does.
fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + SETTLE;
    while !ready() {
        assert!(
            Instant::now() < deadline,
            "{what} within {} s",
            SETTLE.as_secs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One `redis-server` of a group: killed (SIGKILL) when dropped.
pub struct RedisNode {
    /// Its port on 127.0.0.1.
    pub port: u16,
    pid_dir: PathBuf,
    dir: PathBuf,
    args: Vec<OsString>,
    child: Option<std::process::Child>,
}

impl RedisNode {
    fn start(pid_dir: &Path, port: u16, args: Vec<OsString>) -> Self {
        let mut node = Self {
            port,
            pid_dir: pid_dir.to_owned(),
            dir: pid_dir.join(port.to_string()),
            args,
            child: None,
        };
        node.launch();
        node
    }

    fn launch(&mut self) {
        let mut command = node_command("redis-server", self.port, &self.dir);
        command.args(&self.args);
        self.child = Some(spawn_node(command, &self.pid_dir, self.port, &self.dir));
    }

    /// Its `redis://` URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Sends `command` on a fresh connection.
    ///
    /// # Panics
    ///
    /// When the server does not answer or refuses the command.
    pub fn query<T: FromRedisValue>(&self, command: &redis::Cmd) -> T {
        query(self.port, command)
    }

    /// Its `INFO <section>`.
    pub fn info(&self, section: &str) -> String {
        self.query(redis::cmd("INFO").arg(section))
    }

    fn signal(&self, signal: &str) {
        let Some(child) = &self.child else { return };
        let status = std::process::Command::new("kill")
            .arg(signal)
            .arg(child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {}", child.id());
    }

    /// Stops the process (SIGSTOP): it neither reads nor answers until
    /// [`RedisNode::resume`]; what reaches its socket waits in the kernel.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused process go on (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Kills the process (SIGKILL: a crash, not a shutdown).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the process and starts it again on the same port, with the
    /// same arguments; without persistence it comes back empty.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }
}

impl Drop for RedisNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A primary and its replicas, each replica's link to the primary through
/// a [`Partition`]. Dropped: every server killed, the directory removed.
pub struct ReplicatedRedis {
    /// The primary (until a failover, the one clients write to).
    pub primary: RedisNode,
    /// The replicas, in the order of [`ReplicatedRedis::start`].
    pub replicas: Vec<RedisNode>,
    links: Vec<Partition>,
    dir: PathBuf,
}

impl ReplicatedRedis {
    /// Starts a primary and `replicas` replicas, and waits until every
    /// replica has synchronized.
    ///
    /// # Panics
    ///
    /// When `redis-server` is not installed (the message names the Debian
    /// package) or replication does not come up within 20 s.
    pub async fn start(replicas: usize) -> Self {
        let dir = group_dir("idempotency-redis-replicated-");
        let ports = crate::process::free_ports(1 + replicas);
        // No delay before a full synchronization (the default waits 5 s
        // for more replicas to join it).
        let primary = RedisNode::start(
            &dir,
            ports[0],
            vec!["--repl-diskless-sync-delay".into(), "0".into()],
        );
        let primary_address = std::net::SocketAddr::from(([127, 0, 0, 1], primary.port));
        let mut links = Vec::new();
        let mut nodes = Vec::new();
        for &port in &ports[1..] {
            let link = Partition::start(primary_address).await;
            let args = vec![
                "--replicaof".into(),
                "127.0.0.1".into(),
                link.address.port().to_string().into(),
            ];
            nodes.push(RedisNode::start(&dir, port, args));
            links.push(link);
        }
        let group = Self {
            primary,
            replicas: nodes,
            links,
            dir,
        };
        group.wait_in_sync().await;
        group
    }

    /// Waits until every replica holds every write of the primary so far
    /// (a write and a `WAIT` for all replicas on one connection).
    ///
    /// # Panics
    ///
    /// When they do not within 20 s.
    pub async fn wait_in_sync(&self) {
        let port = self.primary.port;
        let replicas = self.replicas.len();
        tokio::task::spawn_blocking(move || {
            let url = format!("redis://127.0.0.1:{port}");
            let client = redis::Client::open(url.as_str()).expect("a Redis URL");
            let mut connection = client.get_connection().expect("connect to the primary");
            wait_until("every replica synchronizes with the primary", || {
                let _: () = redis::cmd("SET")
                    .arg("fixture:sync")
                    .arg(1)
                    .query(&mut connection)
                    .expect("write on the primary");
                redis::cmd("WAIT")
                    .arg(replicas)
                    .arg(200)
                    .query::<usize>(&mut connection)
                    .is_ok_and(|acked| acked >= replicas)
            });
        })
        .await
        .expect("the synchronization check");
    }

    /// Cuts replica `replica`'s link to the primary (a network partition):
    /// the primary drops it, and it cannot connect again until healed.
    pub fn cut_link(&self, replica: usize) {
        self.links[replica].cut();
    }

    /// Lets replica `replica` reach the primary again.
    pub fn heal_link(&self, replica: usize) {
        self.links[replica].heal();
    }

    /// The failover: kills the primary (SIGKILL) and promotes replica
    /// `replica` (`REPLICAOF NO ONE`), which from now on is the primary;
    /// returns its URL.
    pub fn fail_over(&mut self, replica: usize) -> String {
        self.primary.kill();
        let promoted = &self.replicas[replica];
        let _: () = promoted.query(redis::cmd("REPLICAOF").arg("NO").arg("ONE"));
        wait_until("the promoted replica answers as a primary", || {
            info_field(&promoted.info("replication"), "role").as_deref() == Some("master")
        });
        promoted.url()
    }
}

impl Drop for ReplicatedRedis {
    fn drop(&mut self) {
        self.primary.kill();
        for replica in &mut self.replicas {
            replica.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster of three primaries with one replica each. Dropped: every
/// server killed, the directory removed.
pub struct ReplicatedCluster {
    /// The primaries; shard `i` is `primaries[i]` and `replicas[i]`.
    pub primaries: Vec<RedisNode>,
    /// Each primary's replica.
    pub replicas: Vec<RedisNode>,
    dir: PathBuf,
}

/// The cluster of [`ReplicatedCluster`]: its node timeout in milliseconds.
const NODE_TIMEOUT_MS: &str = "2000";

impl ReplicatedCluster {
    /// Starts six nodes, forms a cluster of the first three (an equal share
    /// of the slots each), makes each of the others a replica of one, and
    /// waits until every replica has synchronized.
    ///
    /// # Panics
    ///
    /// When `redis-server` is not installed (the message names the Debian
    /// package) or the cluster does not form within 20 s.
    pub async fn start() -> Self {
        // Its twelve ports are free when picked, but a server of a test
        // running beside it may bind one before this node does (a cluster
        // bus port most often: the node then exits just after it listened,
        // and connecting to it is reset). Such a start is tried again on
        // other ports, twice at most; the watchdog ends the nodes of a
        // failed start with the test process.
        for attempt in 1..3 {
            match tokio::task::spawn_blocking(Self::start_blocking).await {
                Ok(cluster) => return cluster,
                Err(error) => eprintln!(
                    "the replicated cluster did not start (attempt {attempt}: {error}); again on other ports"
                ),
            }
        }
        tokio::task::spawn_blocking(Self::start_blocking)
            .await
            .expect("start the replicated cluster")
    }

    fn start_blocking() -> Self {
        let dir = group_dir("idempotency-redis-cluster-replicated-");
        let ports = crate::process::free_ports(12);
        let (ports, bus_ports): (Vec<u16>, Vec<u16>) =
            ports.chunks(2).map(|pair| (pair[0], pair[1])).unzip();
        let node = |index: usize| {
            let port = ports[index];
            let config = dir.join(format!("nodes-{port}.conf"));
            let args: Vec<OsString> = vec![
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-node-timeout".into(),
                NODE_TIMEOUT_MS.into(),
                "--cluster-port".into(),
                bus_ports[index].to_string().into(),
                "--cluster-config-file".into(),
                config.into(),
                "--repl-diskless-sync-delay".into(),
                "0".into(),
            ];
            RedisNode::start(&dir, port, args)
        };
        let primaries: Vec<RedisNode> = (0..3).map(node).collect();
        let replicas: Vec<RedisNode> = (3..6).map(node).collect();
        let urls: Vec<String> = primaries.iter().map(RedisNode::url).collect();
        let pairs: Vec<(u16, u16)> = (0..3).map(|i| (ports[i], bus_ports[i])).collect();
        form_cluster(&urls, &pairs);
        for (index, (replica, primary)) in replicas.iter().zip(&primaries).enumerate() {
            let id: String = primary.query(redis::cmd("CLUSTER").arg("MYID"));
            let _: () = replica.query(
                redis::cmd("CLUSTER")
                    .arg("MEET")
                    .arg("127.0.0.1")
                    .arg(primary.port)
                    .arg(bus_ports[index]),
            );
            wait_until("a replica learns its primary's node id", || {
                replica
                    .query::<String>(redis::cmd("CLUSTER").arg("NODES"))
                    .contains(&id)
            });
            let _: () = replica.query(redis::cmd("CLUSTER").arg("REPLICATE").arg(&id));
        }
        let cluster = Self {
            primaries,
            replicas,
            dir,
        };
        for replica in &cluster.replicas {
            wait_until("a cluster replica synchronizes with its primary", || {
                let info = replica.info("replication");
                info_field(&info, "master_link_status").as_deref() == Some("up")
                    && info_field(&info, "master_sync_in_progress").as_deref() == Some("0")
            });
        }
        wait_until("every node sees six nodes and the cluster ok", || {
            cluster.live_nodes().all(|node| {
                let info: String = node.query(redis::cmd("CLUSTER").arg("INFO"));
                info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:6")
            })
        });
        cluster
    }

    fn live_nodes(&self) -> impl Iterator<Item = &RedisNode> {
        self.primaries
            .iter()
            .chain(&self.replicas)
            .filter(|node| node.child.is_some())
    }

    /// The URLs of the primaries (what a cluster client starts from).
    pub fn urls(&self) -> Vec<String> {
        self.primaries.iter().map(RedisNode::url).collect()
    }

    /// The shard that holds `key` (`CLUSTER KEYSLOT`, and the slot ranges
    /// the cluster was formed with).
    pub fn shard_of(&self, key: &[u8]) -> usize {
        let node = self.live_nodes().next().expect("a live node");
        let slot: usize = node.query(redis::cmd("CLUSTER").arg("KEYSLOT").arg(key));
        slot / 16384_usize.div_ceil(3)
    }

    /// Cuts shard `shard`'s replica off its primary until the failover:
    /// stops it (SIGSTOP) and has the primary close the replication link
    /// (`CLIENT KILL TYPE replica`), so that it cannot reconnect before
    /// the primary dies and what the primary writes now never reaches it.
    pub fn detach_replica(&self, shard: usize) {
        self.replicas[shard].pause();
        let _: i64 = self.primaries[shard]
            .query(redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica"));
    }

    /// A shard's failover: kills its primary (SIGKILL), lets its replica go
    /// on if it was detached, and promotes it at once (`CLUSTER FAILOVER
    /// TAKEOVER`); waits until every live node sees it own the shard's
    /// slots. Returns the URLs of the live primaries.
    pub async fn fail_over(&mut self, shard: usize) -> Vec<String> {
        self.primaries[shard].kill();
        self.replicas[shard].resume();
        let promoted = self.replicas[shard].port;
        let _: () =
            self.replicas[shard].query(redis::cmd("CLUSTER").arg("FAILOVER").arg("TAKEOVER"));
        let live: Vec<u16> = self.live_nodes().map(|node| node.port).collect();
        // `CLUSTER NODES`: `<id> <ip:port@bus> <flags> <primary> <ping> <pong>
        // <epoch> <link> <slot ranges...>`; a primary with slots has nine or more fields.
        let owns_slots = move |nodes: &str| {
            let address = format!("127.0.0.1:{promoted}@");
            nodes.lines().any(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                fields.len() > 8
                    && fields[1].starts_with(&address)
                    && fields[2].split(',').any(|flag| flag == "master")
            })
        };
        tokio::task::spawn_blocking(move || {
            wait_until(
                "every live node sees the promoted replica own the shard",
                || {
                    live.iter().all(|&port| {
                        owns_slots(&query::<String>(port, redis::cmd("CLUSTER").arg("NODES")))
                    })
                },
            );
        })
        .await
        .expect("the failover check");
        self.primaries
            .iter()
            .enumerate()
            .map(|(index, primary)| {
                if index == shard {
                    self.replicas[shard].url()
                } else {
                    primary.url()
                }
            })
            .collect()
    }
}

impl Drop for ReplicatedCluster {
    fn drop(&mut self) {
        for node in self.primaries.iter_mut().chain(&mut self.replicas) {
            // A paused node dies of SIGKILL too.
            node.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts a primary with one replica that live until this test process
/// exits (the watchdog kills them), and waits until the replica has
/// synchronized. Returns the primary's `redis://` URL.
///
/// # Panics
///
/// When `redis-server` is not installed (the message names the Debian
/// package) or replication does not come up within 20 s.
pub(crate) fn replicated_until_exit() -> String {
    let dir = group_dir("idempotency-redis-pair-");
    let ports = crate::process::free_ports(2);
    let primary = RedisNode::start(
        &dir,
        ports[0],
        vec!["--repl-diskless-sync-delay".into(), "0".into()],
    );
    let replica = RedisNode::start(
        &dir,
        ports[1],
        vec![
            "--replicaof".into(),
            "127.0.0.1".into(),
            ports[0].to_string().into(),
        ],
    );
    wait_until("the replica synchronizes with its primary", || {
        let info = replica.info("replication");
        info_field(&info, "master_link_status").as_deref() == Some("up")
            && info_field(&info, "master_sync_in_progress").as_deref() == Some("0")
    });
    // The link is up before the primary counts the replica's
    // acknowledgements: a store's first `WAIT 1` must not find none.
    let client = redis::Client::open(primary.url()).expect("a Redis URL");
    let mut connection = client.get_connection().expect("connect to the primary");
    wait_until("the primary counts its replica's acknowledgements", || {
        let _: () = redis::cmd("SET")
            .arg("fixture:sync")
            .arg(1)
            .query(&mut connection)
            .expect("write on the primary");
        redis::cmd("WAIT")
            .arg(1)
            .arg(200)
            .query::<usize>(&mut connection)
            .is_ok_and(|acked| acked >= 1)
    });
    let url = primary.url();
    // Both live until the process exits: the watchdog kills them.
    std::mem::forget(primary);
    std::mem::forget(replica);
    url
}
