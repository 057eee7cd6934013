//! What a run measured: the rows, the growth figures and the settings the
//! report repeats. Data only: the report, the plot and the growth runs read
//! it; none of them reaches into the harness or the plan.

use std::time::Duration;

use crate::batches::BatchSizes;
use crate::stats::Summary;

/// What one row of the table measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scenario {
    Bare,
    GuardFresh,
    HandwrittenFresh,
    GuardReplay,
    RawWrite,
    RawRead,
    RawClaimExisting,
    PeerFresh,
    PeerReplay,
    Peer2Fresh,
    Peer2Replay,
    GuardTxFresh,
    GuardSingleCommitFresh,
    LargeBare,
    LargeGuard,
    LargePeer,
    LargePeer2,
    GuardEncryptedFresh,
    GuardEncryptedReplay,
    GuardCachedReplay,
    GuardReplicaAcksFresh,
}

impl Scenario {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Bare => "bare handler",
            Self::GuardFresh => "guard, fresh keys",
            Self::HandwrittenFresh => "hand-written guard, fresh keys",
            Self::GuardReplay => "guard, replays",
            Self::RawWrite => "raw claim+complete",
            Self::RawRead => "raw single read",
            Self::RawClaimExisting => "raw claim of a completed key",
            Self::PeerFresh => "peer 0.3.0, fresh keys",
            Self::PeerReplay => "peer 0.3.0, replays",
            Self::Peer2Fresh => "peer 2.0.0, fresh keys",
            Self::Peer2Replay => "peer 2.0.0, replays",
            Self::GuardTxFresh => "guard, transactional mode, fresh keys",
            Self::GuardSingleCommitFresh => "guard, single-commit transactional mode, fresh keys",
            Self::LargeBare => "bare handler, 1 MiB bodies",
            Self::LargeGuard => "guard, 1 MiB bodies, fresh keys",
            Self::LargePeer => "peer 0.3.0, 1 MiB bodies, fresh keys",
            Self::LargePeer2 => "peer 2.0.0, 1 MiB bodies, fresh keys",
            Self::GuardEncryptedFresh => "guard, sealed responses, fresh keys",
            Self::GuardEncryptedReplay => "guard, sealed responses, replays",
            Self::GuardCachedReplay => "guard, replays, replay cache",
            Self::GuardReplicaAcksFresh => "guard, 1 replica ack, fresh keys",
        }
    }
}

/// One measured run.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    /// `postgres`, `sqlite`, `redis`, `redis-cluster`, `tiered`, or `-` (no store).
    pub(crate) store: &'static str,
    pub(crate) scenario: Scenario,
    pub(crate) concurrency: usize,
    pub(crate) summary: Summary,
    /// The server's peak RSS (HTTP runs).
    pub(crate) rss_kib: Option<u64>,
    /// The server's CPU time per request, in microseconds (HTTP runs): all
    /// its threads, warm-up included, over every request it answered.
    pub(crate) cpu_us: Option<f64>,
    /// The guard's mean store batch sizes over the run's load (guard runs
    /// whose server exported its metrics).
    pub(crate) batches: Option<BatchSizes>,
}

/// Everything a run measured, for the report.
pub(crate) struct Results {
    pub(crate) rows: Vec<Row>,
    pub(crate) growth: Vec<GrowthRow>,
    pub(crate) settings: Settings,
}

/// The settings the report repeats.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) command: String,
    pub(crate) warmup: Duration,
    pub(crate) duration: Duration,
    pub(crate) concurrency: Vec<usize>,
    pub(crate) pool_size: u32,
    pub(crate) replay_keys: usize,
    pub(crate) large_body_connections: usize,
    pub(crate) smoke: bool,
    /// Whether the peer `idempotent` 2.0.0 was measured.
    pub(crate) peer2: bool,
    /// Whether the guard's servers ran with a Prometheus recorder.
    pub(crate) server_metrics: bool,
    pub(crate) started: time::OffsetDateTime,
    pub(crate) machine_before: crate::machine::Load,
    pub(crate) machine_after: Option<crate::machine::Load>,
}

/// The figures of one table size.
#[derive(Debug, Clone)]
pub(crate) struct GrowthRow {
    /// Records seeded before the runs.
    pub(crate) rows: u64,
    /// Of them, past their retention.
    pub(crate) expired: u64,
    pub(crate) seed_seconds: f64,
    /// Table and indexes after seeding, in MiB.
    pub(crate) table_mib: f64,
    pub(crate) concurrency: usize,
    /// The guard on fresh keys, no purge running.
    pub(crate) alone: Summary,
    /// The guard on fresh keys while the purge runs.
    pub(crate) purging: Summary,
    /// Records the purge deleted, and how long it took to delete all
    /// expired ones (it starts with the second run's warm-up).
    pub(crate) purged: u64,
    pub(crate) purge_seconds: f64,
}
