//! Failover of a replicated Redis and of a Redis Cluster shard, on real
//! servers: what a promoted replica that missed the last writes does to a
//! retry, without replica acknowledgements and with them
//! (`RedisStore::with_replica_acks`). docs/GUARANTEES.md ("Replicated
//! Redis") states what these tests hold the store to, the double runs
//! they count included.
//!
//! The worst moment is made on purpose: the replica's link to the primary
//! is cut (a network partition, through a `Partition`; on a cluster the
//! replica is stopped and the primary closes its link), the primary
//! answers writes the replica never gets, then the primary is killed and
//! the replica promoted. (Pausing the replica alone does not lose the
//! write: the kernel keeps what the primary sent in the replica's socket,
//! and the replica reads it when it goes on, even after the primary died.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency_guard::engine::{Answer, Engine, Job, Refusal, Settle, Settled};
use idempotency_guard::store::redis::RedisStore;
use idempotency_guard::{Fingerprint, Store, StoredResponse};
use idempotency_tests::{ReplicatedCluster, ReplicatedRedis, names};
use tokio::sync::Notify;

/// How long a store waits for its replicas: long enough for a loaded
/// machine (a `WAIT` answers as soon as the replica does; only the tests
/// that cut the replica off wait it out).
const ACK_TIMEOUT: Duration = Duration::from_millis(500);
/// The engine's lease: short, so that an orphaned record lapses quickly,
/// and long enough to outlast a failover.
const LEASE: Duration = Duration::from_secs(2);

/// Runs of the work per key, across every engine of a test.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<HashMap<String, usize>>>);

impl Runs {
    fn of(&self, key: &str) -> usize {
        self.0.lock().unwrap().get(key).copied().unwrap_or(0)
    }
}

/// An engine with the default store timeout (5 s): above two `WAIT`s
/// that time out (a script Redis does not know yet is sent again).
fn engine(store: RedisStore) -> Engine<RedisStore> {
    Engine::new(store).with_lease(LEASE)
}

fn job(key: &str) -> Job {
    Job::new(
        idempotency_guard::Scope::new("failover").expect("a valid scope"),
        idempotency_guard::IdempotencyKey::from_raw(key).expect("a valid key"),
        Fingerprint::of_bytes(b"charge 100"),
    )
}

/// Runs the work for `key` (it counts its run and completes at once).
async fn run(engine: &Engine<RedisStore>, runs: &Runs, key: &str) -> Answer<()> {
    let runs = runs.clone();
    let counted = key.to_owned();
    engine
        .run(job(key), move |_run| async move {
            *runs.0.lock().unwrap().entry(counted).or_default() += 1;
            Settle::Complete {
                response: StoredResponse::from_bytes("charged"),
                reply: (),
            }
        })
        .await
}

/// A run that holds its lease until released: in flight during the failover.
struct Held {
    go: Arc<Notify>,
    answer: tokio::task::JoinHandle<Answer<()>>,
}

impl Held {
    /// Starts the work for `key` and waits until it runs (its claim answered).
    async fn start(engine: &Engine<RedisStore>, runs: &Runs, key: &str) -> Self {
        let (engine, runs, counted) = (engine.clone(), runs.clone(), key.to_owned());
        let go = Arc::new(Notify::new());
        let started = Arc::new(Notify::new());
        let (go_in, started_in) = (Arc::clone(&go), Arc::clone(&started));
        let job = job(key);
        let mut answer = tokio::spawn(async move {
            engine
                .run(job, move |_run| async move {
                    *runs.0.lock().unwrap().entry(counted).or_default() += 1;
                    started_in.notify_one();
                    go_in.notified().await;
                    Settle::Complete {
                        response: StoredResponse::from_bytes("charged"),
                        reply: (),
                    }
                })
                .await
        });
        tokio::select! {
            () = started.notified() => {}
            ended = &mut answer => panic!("the held work did not start: {:?}", ended.unwrap()),
            () = tokio::time::sleep(Duration::from_secs(5)) => panic!("the held work did not start in 5 s"),
        }
        Self { go, answer }
    }

    /// Lets the work complete; its answer.
    async fn finish(self) -> Answer<()> {
        self.go.notify_one();
        self.answer.await.unwrap()
    }
}

fn ran(answer: &Answer<()>) -> Option<Settled> {
    match answer {
        Answer::Ran { settled, .. } => Some(*settled),
        _ => None,
    }
}

fn refusal(answer: &Answer<()>) -> Option<Refusal> {
    match answer {
        Answer::Refused(refusal) => Some(refusal.clone()),
        _ => None,
    }
}

fn is_in_flight(answer: &Answer<()>) -> bool {
    matches!(refusal(answer), Some(Refusal::RequestInFlight { .. }))
}

fn is_unavailable(answer: &Answer<()>) -> bool {
    matches!(refusal(answer), Some(Refusal::StoreUnavailable { .. }))
}

async fn connect(url: &str, prefix: &str) -> RedisStore {
    RedisStore::connect(url, prefix).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_replica_acks_a_failover_runs_lost_claims_and_completions_twice() {
    let mut pair = ReplicatedRedis::start(1).await;
    let (runs, prefix) = (Runs::default(), "failover-plain");
    let primary = engine(connect(&pair.primary.url(), prefix).await);

    // A claim that reached the replica, whose completion did not.
    let half = Held::start(&primary, &runs, "half").await;
    pair.wait_in_sync().await;
    pair.cut_link(0);
    assert_eq!(ran(&half.finish().await), Some(Settled::Stored));
    // Claims and completions the replica never gets: the primary answers them all.
    let done = run(&primary, &runs, "completed").await;
    assert_eq!(ran(&done), Some(Settled::Stored));
    assert!(matches!(
        run(&primary, &runs, "completed").await,
        Answer::Replay(_)
    ));
    let running = Held::start(&primary, &runs, "running").await;

    let promoted = engine(connect(&pair.fail_over(0), prefix).await);
    // A lost completion of a replicated claim: in flight, or already
    // abandoned when the failover took longer than the lease the replica
    // last got (a loaded machine); never run again (below).
    let half_after = run(&promoted, &runs, "half").await;
    assert!(
        is_in_flight(&half_after)
            || matches!(refusal(&half_after), Some(Refusal::OutcomeUnknown { .. })),
        "a lost completion is in flight or abandoned: {half_after:?}"
    );
    assert_eq!(runs.of("half"), 1, "a lost completion never runs again");
    // The documented limitation (docs/GUARANTEES.md): both run a second time.
    assert_eq!(
        ran(&run(&promoted, &runs, "completed").await),
        Some(Settled::Stored)
    );
    assert_eq!(runs.of("completed"), 2, "a lost completion runs again");
    assert_eq!(
        ran(&run(&promoted, &runs, "running").await),
        Some(Settled::Stored)
    );
    assert_eq!(runs.of("running"), 2, "a lost claim runs again");
    // The first run of `running` cannot store its outcome on a dead primary.
    assert_eq!(ran(&running.finish().await), Some(Settled::NotStored));
    tokio::time::sleep(LEASE + Duration::from_millis(300)).await;
    assert!(matches!(
        refusal(&run(&promoted, &runs, "half").await),
        Some(Refusal::OutcomeUnknown { .. })
    ));
    assert_eq!(runs.of("half"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_replica_acks_a_failover_never_runs_a_claim_twice() {
    let mut pair = ReplicatedRedis::start(1).await;
    let (runs, prefix) = (Runs::default(), "failover-acked");
    let store = connect(&pair.primary.url(), prefix)
        .await
        .with_replica_acks(1, ACK_TIMEOUT);
    let primary = engine(store.clone());

    // The replica cut off: a claim it does not acknowledge fails closed,
    // and the claim is released (fenced) on the primary.
    pair.cut_link(0);
    let refused = run(&primary, &runs, "refused").await;
    assert!(is_unavailable(&refused), "{refused:?}");
    assert_eq!(runs.of("refused"), 0, "the work never runs");
    let mut released = false;
    for _ in 0..40 {
        if store
            .get(names::scope("failover"), names::key("refused"))
            .await
            .unwrap()
            .is_none()
        {
            released = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(released, "the unacknowledged claim is released");

    // The replica back: an acknowledged claim, in flight at the failover.
    pair.heal_link(0);
    pair.wait_in_sync().await;
    let running = Held::start(&primary, &runs, "running").await;
    // The completion will not reach the replica either.
    pair.cut_link(0);
    let url = pair.fail_over(0);
    let promoted = engine(
        connect(&url, prefix)
            .await
            .with_replica_acks(1, ACK_TIMEOUT),
    );
    assert!(is_in_flight(&run(&promoted, &runs, "running").await));
    // The promoted replica has no replica of its own: every new claim fails
    // closed until one attaches.
    assert!(is_unavailable(&run(&promoted, &runs, "refused").await));
    assert_eq!(runs.of("refused"), 0);
    // Its unacknowledged claim is released in the background: wait for it,
    // as above, or the next run can meet it still in flight.
    let unacked_store = connect(&url, prefix).await;
    let mut released = false;
    for _ in 0..40 {
        if unacked_store
            .get(names::scope("failover"), names::key("refused"))
            .await
            .unwrap()
            .is_none()
        {
            released = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        released,
        "the unacknowledged claim on the promoted replica is released"
    );
    // Without acknowledgements there, the refused request runs, once.
    let unacked = engine(unacked_store);
    assert_eq!(
        ran(&run(&unacked, &runs, "refused").await),
        Some(Settled::Stored)
    );
    assert_eq!(runs.of("refused"), 1);
    // The run in flight cannot store its outcome: the primary is gone.
    assert_eq!(ran(&running.finish().await), Some(Settled::NotStored));
    tokio::time::sleep(LEASE + Duration::from_millis(300)).await;
    assert!(matches!(
        refusal(&run(&promoted, &runs, "running").await),
        Some(Refusal::OutcomeUnknown { .. })
    ));
    assert_eq!(
        runs.of("running"),
        1,
        "the acknowledged claim never runs twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_replica_acks_the_layer_answers_503_when_no_replica_acknowledges() {
    use idempotency_guard::IdempotencyLayer;

    let pair = ReplicatedRedis::start(1).await;
    let store = connect(&pair.primary.url(), "failover-layer")
        .await
        .with_replica_acks(1, ACK_TIMEOUT);
    let runs = crate::redis_faults::Runs::default();
    let router = crate::redis_faults::app(IdempotencyLayer::new(store), &runs, "a");
    pair.cut_link(0);
    let answer = idempotency_tests::call(&router, crate::redis_faults::request("pay-1", 0)).await;
    assert_eq!(answer.status, http::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.problem(), "store-unavailable");
    assert!(answer.headers.contains_key("retry-after"));
    assert_eq!(runs.total(), 0, "the handler never runs");
    pair.heal_link(0);
    pair.wait_in_sync().await;
    let answer = idempotency_tests::call(&router, crate::redis_faults::request("pay-1", 0)).await;
    assert_eq!(answer.status, http::StatusCode::CREATED);
    assert_eq!(runs.total(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_replica_acks_an_unacknowledged_completion_is_answered_but_not_stored() {
    let pair = ReplicatedRedis::start(1).await;
    let runs = Runs::default();
    let primary = engine(
        connect(&pair.primary.url(), "failover-complete")
            .await
            .with_replica_acks(1, ACK_TIMEOUT),
    );
    let running = Held::start(&primary, &runs, "k").await;
    pair.cut_link(0);
    // The work ran: its caller gets the reply; the store says the outcome
    // may not survive a failover (it stands on the primary).
    assert_eq!(ran(&running.finish().await), Some(Settled::NotStored));
    assert!(matches!(run(&primary, &runs, "k").await, Answer::Replay(_)));
    assert_eq!(runs.of("k"), 1);
}

/// What remains with replica acknowledgements: a promoted replica that did
/// not acknowledge the claim (`WAIT 1` with two replicas), and a replica
/// that acknowledged it and then restarted without it (in memory only).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replica_acks_cannot_save_a_promoted_replica_without_the_write() {
    let runs = Runs::default();

    let mut pair = ReplicatedRedis::start(2).await;
    let prefix = "failover-other";
    let primary = engine(
        connect(&pair.primary.url(), prefix)
            .await
            .with_replica_acks(1, ACK_TIMEOUT),
    );
    pair.cut_link(1);
    assert_eq!(
        ran(&run(&primary, &runs, "other").await),
        Some(Settled::Stored)
    );
    // The failover promotes the replica that did not acknowledge it.
    let promoted = engine(connect(&pair.fail_over(1), prefix).await);
    assert_eq!(
        ran(&run(&promoted, &runs, "other").await),
        Some(Settled::Stored)
    );
    assert_eq!(runs.of("other"), 2, "documented: WAIT 1 of 2 replicas");

    let mut pair = ReplicatedRedis::start(1).await;
    let prefix = "failover-restart";
    let primary = engine(
        connect(&pair.primary.url(), prefix)
            .await
            .with_replica_acks(1, ACK_TIMEOUT),
    );
    assert_eq!(
        ran(&run(&primary, &runs, "restart").await),
        Some(Settled::Stored)
    );
    // The replica acknowledged it, then restarts (no persistence) while
    // the primary is down, and is promoted empty.
    pair.cut_link(0);
    pair.primary.kill();
    pair.replicas[0].restart();
    let promoted = engine(connect(&pair.fail_over(0), prefix).await);
    assert_eq!(
        ran(&run(&promoted, &runs, "restart").await),
        Some(Settled::Stored)
    );
    assert_eq!(
        runs.of("restart"),
        2,
        "documented: WAIT acknowledges memory"
    );
}

/// A key of `scope` whose record lives on shard `shard` of `cluster`.
fn key_on_shard(cluster: &ReplicatedCluster, prefix: &str, name: &str, shard: usize) -> String {
    (0..)
        .map(|n| format!("{name}-{n}"))
        .find(|key| {
            let record = format!("{prefix}:r:{}:failover:{key}", "failover".len());
            cluster.shard_of(record.as_bytes()) == shard
        })
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_shard_failover_runs_twice_without_replica_acks_and_never_with_them() {
    let mut cluster = ReplicatedCluster::start().await;
    let (runs, prefix) = (Runs::default(), "failover-cluster");
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let plain = engine(RedisStore::connect_cluster(&nodes, prefix).await.unwrap());
    let acked = engine(
        RedisStore::connect_cluster(&nodes, prefix)
            .await
            .unwrap()
            .with_replica_acks(1, ACK_TIMEOUT),
    );
    let key = |name| key_on_shard(&cluster, prefix, name, 0);
    let (running, lost, refused) = (key("running"), key("lost"), key("refused"));

    // Acknowledged by the shard's replica, in flight at the failover.
    let held = Held::start(&acked, &runs, &running).await;
    cluster.detach_replica(0);
    // The primary answers what its replica never gets.
    assert_eq!(ran(&run(&plain, &runs, &lost).await), Some(Settled::Stored));
    assert!(is_unavailable(&run(&acked, &runs, &refused).await));
    assert_eq!(runs.of(&refused), 0);
    // Each claim waits on its own shard: the other shards' replicas answer.
    let elsewhere = key_on_shard(&cluster, prefix, "elsewhere", 1);
    assert_eq!(
        ran(&run(&acked, &runs, &elsewhere).await),
        Some(Settled::Stored)
    );

    let urls = cluster.fail_over(0).await;
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let promoted = engine(RedisStore::connect_cluster(&nodes, prefix).await.unwrap());
    // With acknowledgements: the acknowledged claim is there.
    assert!(is_in_flight(&run(&promoted, &runs, &running).await));
    // Documented: without them the lost run runs again.
    assert_eq!(
        ran(&run(&promoted, &runs, &lost).await),
        Some(Settled::Stored)
    );
    assert_eq!(runs.of(&lost), 2, "a completion lost in a shard failover");
    // The claim refused for want of an acknowledgement runs, once.
    assert_eq!(
        ran(&run(&promoted, &runs, &refused).await),
        Some(Settled::Stored)
    );
    assert_eq!(runs.of(&refused), 1);
    let _ = held.finish().await;
    assert_eq!(
        runs.of(&running),
        1,
        "the acknowledged claim never runs twice"
    );
}

/// Batched claims and completions (one script and one `WAIT` per batch):
/// with the replica cut off, each item that wrote fails by itself; the
/// claims that found another's record answer as without replicas.
#[tokio::test]
async fn a_batch_that_too_few_replicas_acknowledge_fails_each_write() {
    use crate::batching::{Gate, Gated, behind_the_lead};
    use futures_util::future::join_all;
    use idempotency_guard::StoreError;
    use idempotency_guard::store::{Claim, LeaseToken, NewRecord};

    let pair = ReplicatedRedis::start(1).await;
    let acked = connect(&pair.primary.url(), "failover-batch")
        .await
        .with_replica_acks(1, ACK_TIMEOUT);
    let gate = Gate::default();
    let (store, _) = Gated::batched(acked.direct().clone(), &gate);
    let fingerprint = Fingerprint::of_bytes(b"charge 100");
    let new = |key: &'static str| NewRecord {
        scope: names::scope("failover"),
        key: names::key(key),
        fingerprint: &fingerprint,
        method: "POST",
        path: "/payments",
        token: LeaseToken::new(),
        lease: LEASE,
        retention: Duration::from_secs(3600),
        transactional: false,
    };
    let taken = new("taken");
    let Claim::Acquired(lease) = store.claim(&taken).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    pair.cut_link(0);
    // The lead goes by itself; the others queue behind it, in one batch.
    let lead = new("lead");
    let records: Vec<NewRecord<'_>> = ["a", "b", "c", "taken"].map(new).to_vec();
    let (lead, mut claims) = behind_the_lead(
        &gate,
        store.claim(&lead),
        join_all(records.iter().map(|record| store.claim(record))),
    )
    .await;
    assert_eq!(
        store.batch_stats().claims.largest,
        4,
        "one batch behind the lead"
    );
    claims.insert(0, lead);
    for claim in &claims[..4] {
        assert!(
            matches!(
                claim,
                Err(StoreError::NotReplicated {
                    wanted: 1,
                    acked: 0
                })
            ),
            "{claim:?}"
        );
    }
    assert!(
        matches!(&claims[4], Ok(Claim::Existing(_))),
        "{:?}",
        claims[4]
    );
    // Completions, batched likewise: the one that wrote fails for want of
    // an acknowledgement, the one fenced off is refused as ever.
    let stranger = idempotency_guard::store::Lease {
        token: LeaseToken::new(),
        ..lease.clone()
    };
    let response = StoredResponse::from_bytes("charged");
    let (first, mut completions) = behind_the_lead(
        &gate,
        store.complete(&stranger, &response),
        join_all([
            store.complete(&lease, &response),
            store.complete(&stranger, &response),
        ]),
    )
    .await;
    completions.insert(0, first);
    assert!(matches!(completions[0], Err(StoreError::LeaseLost)));
    assert!(matches!(
        completions[1],
        Err(StoreError::NotReplicated {
            wanted: 1,
            acked: 0
        })
    ));
    assert!(matches!(completions[2], Err(StoreError::LeaseLost)));
    assert_eq!(store.batch_stats().completions.largest, 2);
}
