//! The command line: `run` (the default) and the hidden `serve`.

use std::path::PathBuf;

/// How to reproduce the report, for `--help` (the same text as the "How to
/// reproduce" section of `docs/BENCHMARKS.md`).
pub(crate) const REPRODUCE: &str = "\
How to reproduce (from the repository's root):
  cargo run --release -p idempotency-bench                  # every store, both peers: docs/BENCHMARKS.md + docs/benchmarks.png
  cargo run --release -p idempotency-bench -- --growth      # the same + the 1M/10M-record growth runs
  cargo run --release -p idempotency-bench -- --growth-only # only the growth section
  cargo run -p idempotency-bench -- --smoke                 # CI: a few seconds, no figures, peer 2.0.0 not built
  cargo run --release -p idempotency-bench -- timers        # what one timer (a lease's, a store call's) costs a request

A full run first builds the peer `idempotent` 2.0.0 (bench/peer2, its own crate outside
the workspace; it declares rust-version 1.98 and builds on 1.95 with --ignore-rust-version):
  cargo build --release --ignore-rust-version --manifest-path bench/peer2/Cargo.toml
--no-peer2 leaves it out. Guard servers export Prometheus text at /metrics, from which
the report takes the mean store batch sizes (idempotency_store_batch_size{op}); --no-server-metrics
runs them without a metrics recorder (the batch sizes are then not measured).

Replica acknowledgements (issue 32): a private Redis primary with one replica (redis-server),
fresh keys without and with RedisStore::with_replica_acks(1, 1 s), alternated 3 times; updates
that section of docs/BENCHMARKS.md in place:
  cargo run --release -p idempotency-bench -- --replica-acks-only --concurrency 1,16,64

A short comparison on Redis only (3 s per cell, 16 connections, no cluster), into /tmp/bench:
  cargo run --release -p idempotency-bench -- --stores redis --concurrency 16 \\
      --redis-cluster-urls '' --out-dir /tmp/bench

The NATS JetStream KV store beside Redis (not in the default --stores: it needs NATS 2.11+,
which the bench does not start; each run opens a bucket of its own and deletes it). A private
one-node NATS 2.15 with JetStream on a free port and a temporary store directory:
  nats=$(scripts/install-nats-server); dir=$(mktemp -d)
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\", 0)); print(s.getsockname()[1])')
  printf 'listen: 127.0.0.1:%s\\nmax_payload: 8MB\\njetstream { store_dir: \"%s\" }\\n' \"$port\" \"$dir\" > \"$dir/nats.conf\"
  \"$nats\" -c \"$dir/nats.conf\" &
  cargo run --release -p idempotency-bench -- --stores redis,nats --concurrency 16 \\
      --redis-cluster-urls '' --nats-url \"nats://127.0.0.1:$port\" --out-dir /tmp/bench-nats
  kill %1; rm -rf \"$dir\"";

/// The benchmark harness of the idempotency guard.
#[derive(Debug, clap::Parser)]
#[command(
    name = "idempotency-bench",
    args_conflicts_with_subcommands = true,
    after_help = REPRODUCE
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
    #[command(flatten)]
    pub(crate) run: RunArgs,
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Runs the benchmarks and writes the report (the default).
    Run(RunArgs),
    /// Serves one app under test (used by `run`, which starts it as a child).
    #[command(hide = true)]
    Serve(ServeArgs),
    /// Times what one timer costs a request (a tokio `Sleep` registered and
    /// cancelled, as the lease's first renewal and each store call's
    /// timeout are) and prints it.
    Timers(TimersArgs),
}

/// The settings of `timers`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct TimersArgs {
    /// Timers registered and cancelled per round.
    #[arg(long, default_value_t = 1_000_000)]
    pub(crate) iterations: u32,
    /// Rounds (the median and the range are printed).
    #[arg(long, default_value_t = 5)]
    pub(crate) rounds: u32,
}

/// The settings of a benchmark run.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct RunArgs {
    /// Measured time of each run, in milliseconds.
    #[arg(long, default_value_t = 3000)]
    pub(crate) duration_ms: u64,
    /// Warm-up before each measured run, in milliseconds (not counted).
    #[arg(long, default_value_t = 1000)]
    pub(crate) warmup_ms: u64,
    /// Concurrent connections (or raw-store clients), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 16, 64, 256])]
    pub(crate) concurrency: Vec<usize>,
    /// Stores to measure, comma-separated: postgres, sqlite, redis, tiered,
    /// nats (not measured unless named: it needs NATS 2.11 or later, see
    /// `--nats-url`).
    #[arg(long, value_delimiter = ',', default_values_t = [
        "postgres".to_owned(), "sqlite".to_owned(), "redis".to_owned(), "tiered".to_owned()
    ])]
    pub(crate) stores: Vec<String>,
    /// PostgreSQL pool size, the same for the guard and the raw runs.
    #[arg(long, default_value_t = 32)]
    pub(crate) pool_size: u32,
    /// Completed keys that replay runs cycle through.
    #[arg(long, default_value_t = 1024)]
    pub(crate) replay_keys: usize,
    /// A PostgreSQL database to connect to for creating (and dropping) the
    /// benchmark's own database.
    #[arg(
        long,
        env = "BENCH_POSTGRES_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    pub(crate) postgres_url: String,
    /// The Redis of the Redis and tiered stores and of the peer.
    #[arg(
        long,
        env = "BENCH_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    pub(crate) redis_url: String,
    /// The NATS server (2.11 or later, JetStream on) of the NATS store,
    /// `nats://host:port` or comma-separated servers of a cluster. The
    /// bench starts none: each run opens a bucket of its own there
    /// (`idem-bench-<run>-<n>`) and deletes it after the run.
    #[arg(long, env = "BENCH_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    pub(crate) nats_url: String,
    /// Replicas of the NATS store's buckets (1 to 5); unset: the store's
    /// default, 3 on a cluster, else 1.
    #[arg(long)]
    pub(crate) nats_replicas: Option<usize>,
    /// The Redis Cluster nodes (comma-separated; empty to skip the cluster).
    #[arg(
        long,
        env = "BENCH_REDIS_CLUSTER_URLS",
        value_delimiter = ',',
        default_value = "redis://127.0.0.1:7101,redis://127.0.0.1:7102,redis://127.0.0.1:7103"
    )]
    pub(crate) redis_cluster_urls: Vec<String>,
    /// Connections of the large-body run (each sends 1 MiB bodies).
    #[arg(long, default_value_t = 64)]
    pub(crate) large_body_connections: usize,
    /// Also measure throughput as the table grows (PostgreSQL, seeded rows,
    /// 10% of them expired, purge running).
    #[arg(long)]
    pub(crate) growth: bool,
    /// Only the growth runs: updates the growth section of an existing
    /// report in place and leaves everything else (and the plot) alone.
    #[arg(long)]
    pub(crate) growth_only: bool,
    /// Only the encryption-at-rest runs (Redis, fresh keys and replays,
    /// with and without sealing, alternated): updates the encryption
    /// section of an existing report in place and leaves everything else
    /// alone.
    #[arg(long)]
    pub(crate) encryption_only: bool,
    /// How many times the encryption-only runs alternate sealed and plain
    /// servers (the section shows the median of each).
    #[arg(long, default_value_t = 3)]
    pub(crate) encryption_rounds: usize,
    /// Only the replica-acknowledgement runs (issue 32): the guard on a
    /// private Redis primary with one replica, fresh keys without and with
    /// `RedisStore::with_replica_acks(1, 1 s)`, alternated: updates that
    /// section of an existing report in place and leaves everything else
    /// alone. Needs `redis-server` (Debian: redis-server).
    #[arg(long)]
    pub(crate) replica_acks_only: bool,
    /// How many times the replica-acknowledgement runs alternate (the
    /// section shows the median of each).
    #[arg(long, default_value_t = 3)]
    pub(crate) replica_acks_rounds: usize,
    /// Row counts of the growth runs, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1_000_000, 10_000_000])]
    pub(crate) growth_rows: Vec<u64>,
    /// A tiny run for CI (a few seconds): every code path, no figures
    /// asserted; writes to a temporary directory unless `--out-dir` is given.
    #[arg(long)]
    pub(crate) smoke: bool,
    /// Leaves out the peer `idempotent` 2.0.0 (bench/peer2): not built, not
    /// measured. Implied by `--smoke`.
    #[arg(long)]
    pub(crate) no_peer2: bool,
    /// The binary of the peer `idempotent` 2.0.0; the harness builds it there
    /// first unless this is given.
    #[arg(long, env = "BENCH_PEER2_BIN")]
    pub(crate) peer2_bin: Option<PathBuf>,
    /// Runs the guard's servers without a Prometheus recorder (and so
    /// without the batch sizes, which are read from its /metrics).
    #[arg(long)]
    pub(crate) no_server_metrics: bool,
    /// Only the runs whose label contains one of these (`|`-separated, as
    /// labels hold commas), for profiling one of them; the report is then
    /// partial.
    #[arg(long, value_delimiter = '|', hide = true)]
    pub(crate) only: Vec<String>,
    /// Where `BENCHMARKS.md` and `benchmarks.png` are written.
    #[arg(long)]
    pub(crate) out_dir: Option<PathBuf>,
    /// The TrueType font of the plot's text (Debian: fonts-dejavu-core).
    #[arg(
        long,
        env = "BENCH_FONT",
        default_value = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
    )]
    pub(crate) font: PathBuf,
}

/// Which app the child serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum App {
    /// The handler alone.
    Bare,
    /// The handler behind our guard.
    Guard,
    /// The handler behind our guard, its stored responses sealed
    /// (`EncryptedStore` over the store, AES-256-GCM).
    GuardEncrypted,
    /// The handler behind our guard with its in-process replay cache
    /// (`--replay-cache-mib`, at least 64 MiB).
    GuardCached,
    /// The handler behind our guard in transactional mode (PostgreSQL).
    GuardTx,
    /// The handler behind our guard in single-commit transactional mode
    /// (PostgreSQL: the key held by an advisory lock, one commit).
    GuardSingleCommit,
    /// The handler behind our guard on Redis, every claim and completion
    /// waiting for one replica (`RedisStore::with_replica_acks(1, 1 s)`).
    GuardReplicaAcks,
    /// The handler behind a hand-written guard, the one a user would write
    /// instead of ours: a per-request `insert … on conflict do nothing`
    /// claim and an `update` completion, on PostgreSQL or SQLite
    /// (`handwritten.rs`).
    Handwritten,
    /// The handler behind the peer crate `idempotent` 0.3.0 (its Valkey/Redis
    /// store, our thin middleware: `peer.rs`).
    Peer,
    /// The handler behind the peer crate `idempotent` 2.0.0 (its own axum
    /// layer and Valkey/Redis store): `serve` replaces itself with the
    /// separate binary of `bench/peer2` (see `--peer2-bin`).
    Peer2,
}

/// The stores the guard can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum StoreName {
    Postgres,
    Sqlite,
    Redis,
    RedisCluster,
    Tiered,
    Nats,
}

impl StoreName {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Sqlite => "sqlite",
            Self::Redis => "redis",
            Self::RedisCluster => "redis-cluster",
            Self::Tiered => "tiered",
            Self::Nats => "nats",
        }
    }

    pub(crate) fn parse(name: &str) -> anyhow::Result<Self> {
        Ok(match name {
            "postgres" => Self::Postgres,
            "sqlite" => Self::Sqlite,
            "redis" => Self::Redis,
            "redis-cluster" => Self::RedisCluster,
            "tiered" => Self::Tiered,
            "nats" => Self::Nats,
            other => anyhow::bail!(
                "unknown store {other:?}: expected postgres, sqlite, redis, redis-cluster, tiered or nats"
            ),
        })
    }
}

/// The settings of one server under test.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ServeArgs {
    #[arg(long, value_enum)]
    pub(crate) app: App,
    #[arg(long, value_enum)]
    pub(crate) store: Option<StoreName>,
    /// `postgres://...` (PostgreSQL, tiered) or `sqlite://...`.
    #[arg(long, default_value = "")]
    pub(crate) database_url: String,
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub(crate) redis_url: String,
    #[arg(long, value_delimiter = ',')]
    pub(crate) redis_cluster_urls: Vec<String>,
    /// The NATS server of the NATS store.
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    pub(crate) nats_url: String,
    /// Replicas of the NATS store's bucket (unset: the store's default).
    #[arg(long)]
    pub(crate) nats_replicas: Option<usize>,
    /// The Redis key prefix of this run (and the NATS store's bucket).
    #[arg(long, default_value = "idem-bench")]
    pub(crate) prefix: String,
    #[arg(long, default_value_t = 32)]
    pub(crate) pool_size: u32,
    /// The guard's in-process replay cache, in MiB, its copies kept 60 s
    /// (0: none; unset: the guard's default, 16 MiB kept 5 s).
    #[arg(long)]
    pub(crate) replay_cache_mib: Option<usize>,
    /// Installs a Prometheus recorder and serves its text at `/metrics`
    /// (guard apps).
    #[arg(long)]
    pub(crate) metrics: bool,
    /// Guard apps: the guarded handler forwards each request's body to
    /// this URL (POST, a pooled HTTP/1.1 client) and answers with the
    /// upstream's answer, instead of answering itself: the axum layer in
    /// front of a backend, for the gateway's like-for-like comparison.
    #[arg(long)]
    pub(crate) forward_to: Option<String>,
    /// The binary of `bench/peer2` (`--app peer2`).
    #[arg(long, env = "BENCH_PEER2_BIN", default_value = crate::peer2::DEFAULT_BIN)]
    pub(crate) peer2_bin: PathBuf,
}
