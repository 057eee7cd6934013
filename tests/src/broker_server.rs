//! The message brokers of the consumer tests: RabbitMQ and NATS with
//! JetStream, found or started the way the fixtures find or start
//! PostgreSQL and Redis.
//!
//! Which broker: the one an environment variable names (`TEST_AMQP_URL`,
//! `TEST_NATS_URL`); else the shared one on its default port when something
//! answers there (RabbitMQ 5672, NATS 4222); else a private one this test
//! process starts for itself on free ports (its own node name, data and log
//! directories), shared by all its tests and removed by a watchdog when the
//! process exits, however it exits. `TEST_PRIVATE_SERVERS=1` skips the
//! shared defaults and always starts private brokers.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The shared RabbitMQ the tests use when it answers.
const SHARED_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// The shared NATS the tests use when it answers.
const SHARED_NATS_URL: &str = "127.0.0.1:4222";
/// How long a private RabbitMQ may take to open its AMQP port (Erlang
/// boots in about 7 s on an idle 2-core machine; a loaded one is slower).
const RABBITMQ_START_BOUND: Duration = Duration::from_secs(90);
/// How long a private NATS may take to listen.
const NATS_START_BOUND: Duration = Duration::from_secs(15);

/// The RabbitMQ tests use: `TEST_AMQP_URL`, else the shared
/// `amqp://guest:guest@127.0.0.1:5672/%2f` when it answers, else a private
/// `rabbitmq-server` started once for this process.
///
/// # Panics
///
/// When a private broker is needed and cannot start (the message names the
/// Debian package of a missing binary).
pub fn amqp_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var("TEST_AMQP_URL") {
            return url;
        }
        if !crate::fixtures::private_servers_forced() && crate::fixtures::answers_on(5672) {
            return SHARED_AMQP_URL.to_owned();
        }
        let port = start_rabbitmq_until_exit();
        format!("amqp://guest:guest@127.0.0.1:{port}/%2f")
    })
    .clone()
}

/// The NATS (with JetStream) tests use: `TEST_NATS_URL`, else the shared
/// `127.0.0.1:4222` when it answers, else a private `nats-server -js`
/// started once for this process.
///
/// # Panics
///
/// When a private server is needed and cannot start (the message names the
/// Debian package of a missing binary).
pub fn nats_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var("TEST_NATS_URL") {
            return url;
        }
        if !crate::fixtures::private_servers_forced() && crate::fixtures::answers_on(4222) {
            return SHARED_NATS_URL.to_owned();
        }
        let port = start_nats_until_exit();
        format!("127.0.0.1:{port}")
    })
    .clone()
}

/// A temporary directory that a watchdog removes, after killing the process
/// group whose id is in its `server.pgid`, once this test process has exited.
fn watched_dir(prefix: &str) -> std::path::PathBuf {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("a temporary directory")
        .keep();
    let quoted = crate::watchdog::shell_quote(&dir.display().to_string());
    crate::watchdog::run_at_exit(&format!(
        "[ -f {quoted}/server.pgid ] && kill -KILL \"-$(cat {quoted}/server.pgid)\" 2>/dev/null\n\
         rm -rf {quoted}"
    ));
    dir
}

/// Starts a private RabbitMQ node that lives until this process exits.
/// Returns its AMQP port.
fn start_rabbitmq_until_exit() -> u16 {
    let dir = watched_dir("idempotency-rabbitmq-");
    let port = crate::process::free_address().port();
    let dist_port = crate::process::free_address().port();
    // `guest` may log in over loopback only by default; the node listens on
    // loopback alone, so lifting that changes nothing but the check.
    std::fs::write(
        dir.join("rabbitmq.conf"),
        format!("listeners.tcp.default = 127.0.0.1:{port}\nloopback_users = none\n"),
    )
    .expect("write rabbitmq.conf");
    // No plugins: the management plugin would listen on the shared 15672.
    std::fs::write(dir.join("enabled_plugins"), "[].\n").expect("write enabled_plugins");
    // The Debian wrapper in /usr/sbin switches to the rabbitmq user, who
    // cannot write the test's directory; the real script runs as we are.
    let program = ["/usr/lib/rabbitmq/bin/rabbitmq-server", "rabbitmq-server"]
        .into_iter()
        .find(|program| !program.starts_with('/') || Path::new(program).exists())
        .unwrap_or("rabbitmq-server");
    let node = format!("idempotency-test-{}-{port}@localhost", std::process::id());
    let log = std::fs::File::create(dir.join("console.log")).expect("create the console log");
    let mut child = Command::new(program)
        // Its own Erlang cookie, so the shared node's is never read or
        // changed; and any crash dump lands in its directory.
        .env("HOME", &dir)
        .current_dir(&dir)
        .env("RABBITMQ_NODENAME", &node)
        .env("RABBITMQ_NODE_PORT", port.to_string())
        .env("RABBITMQ_DIST_PORT", dist_port.to_string())
        .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq.conf"))
        .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
        .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
        .env("RABBITMQ_LOG_BASE", dir.join("log"))
        .env("RABBITMQ_PID_FILE", dir.join("rabbitmq.pid"))
        // A group of its own: the script runs the Erlang VM as its child,
        // and the watchdog kills the whole group.
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clone the log handle"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|error| {
            panic!(
                "cannot start rabbitmq-server ({error}): install the Debian package \
                 rabbitmq-server (`apt-get install rabbitmq-server`), or point TEST_AMQP_URL at a broker"
            )
        });
    write_group_id(&dir, &child);
    wait_until_listening(
        &mut child,
        port,
        &dir,
        "rabbitmq-server",
        RABBITMQ_START_BOUND,
    );
    port
}

/// Starts a private NATS server with JetStream that lives until this
/// process exits. Returns its port.
fn start_nats_until_exit() -> u16 {
    let dir = watched_dir("idempotency-nats-");
    let port = crate::process::free_address().port();
    let mut child = Command::new("nats-server")
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js"])
        .arg("-sd")
        .arg(dir.join("jetstream"))
        .arg("-l")
        .arg(dir.join("nats.log"))
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|error| {
            panic!(
                "cannot start nats-server ({error}): install the Debian package nats-server \
                 (`apt-get install nats-server`), or point TEST_NATS_URL at a server"
            )
        });
    write_group_id(&dir, &child);
    wait_until_listening(&mut child, port, &dir, "nats-server", NATS_START_BOUND);
    port
}

/// Writes the id of the process group a broker leads (its pid), for the
/// watchdog.
fn write_group_id(dir: &Path, child: &std::process::Child) {
    std::fs::write(dir.join("server.pgid"), child.id().to_string())
        .expect("write the process group id the watchdog reads");
}

/// Waits until a just-started broker accepts connections on `port`.
fn wait_until_listening(
    child: &mut std::process::Child,
    port: u16,
    dir: &Path,
    name: &str,
    bound: Duration,
) {
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{name} on port {port} exited with {status}; its logs are in {}",
                dir.display()
            );
        }
        if crate::fixtures::answers_on(port) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "{name} did not listen on 127.0.0.1:{port} within {} s; its logs are in {}",
        bound.as_secs(),
        dir.display()
    );
}
