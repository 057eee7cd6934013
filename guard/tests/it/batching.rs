//! Group commit (`store::batch`): concurrent claims and completions that
//! queue go to the store together, and each still gets its own, exact
//! answer.
//!
//! Each test arranges its batch: one batch on its way at a time
//! ([`ONE_AT_A_TIME`]), and a lead call for another key that takes it and
//! then waits at a [`Gate`] the test holds closed (the store under the
//! batcher is [`Gated`]). The test polls the lead once (it now holds the
//! only slot), polls the calls of the batch once (each is now queued behind
//! it), and only then opens the gate: the queued calls go as one batch,
//! whatever the store's speed. The counts prove it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use http::{HeaderMap, StatusCode};
use idempotency_guard::store::batch::{BatchLimits, Batched};
use idempotency_guard::store::{BatchedStore, ClaimItem};
use idempotency_guard::store::{Claim, Lease, LeaseToken, NewRecord};
use idempotency_guard::{
    Fingerprint, IdempotencyKey, Record, RecordEvents, RecordState, Scope, Store, StoreError,
    StoredResponse,
};
use idempotency_tests::names;
use tokio::sync::{OwnedRwLockWriteGuard, RwLock, mpsc};

/// One batch on its way at a time, as large as the tests need.
pub(crate) const ONE_AT_A_TIME: BatchLimits = BatchLimits {
    max_batch: 256,
    max_in_flight: 1,
};

const LEASE: Duration = Duration::from_secs(30);
const DAY: Duration = Duration::from_secs(86_400);

/// The keys a [`Gated`] store released, each with its release's result.
pub(crate) type Releases = mpsc::UnboundedReceiver<(String, Result<(), String>)>;

/// Where the calls that go by themselves wait while the test holds it
/// closed ([`Gate::close`]); open, they pass at once.
#[derive(Clone, Default)]
pub(crate) struct Gate(Arc<RwLock<()>>);

impl Gate {
    /// Closes the gate until the returned guard is dropped.
    pub(crate) fn close(&self) -> OwnedRwLockWriteGuard<()> {
        Arc::clone(&self.0)
            .try_write_owned()
            .expect("the gate is open and nobody waits at it")
    }

    async fn pass(&self) {
        drop(self.0.read().await);
    }
}

/// A direct store whose lone claims and completions (the calls that go by
/// themselves, not in a batch) first pass its [`Gate`]; batches go straight
/// to the store. Its releases are reported on [`Gated::released`].
#[derive(Clone)]
pub(crate) struct Gated<S> {
    inner: S,
    gate: Gate,
    released: mpsc::UnboundedSender<(String, Result<(), String>)>,
}

impl<S: BatchedStore> Gated<S> {
    /// `inner` behind `gate`, batched [`ONE_AT_A_TIME`]; and the keys it
    /// released, with each release's result.
    pub(crate) fn batched(inner: S, gate: &Gate) -> (Batched<Self>, Releases) {
        let (released, releases) = mpsc::unbounded_channel();
        let gated = Self {
            inner,
            gate: gate.clone(),
            released,
        };
        (Batched::wrap(gated, ONE_AT_A_TIME), releases)
    }
}

impl<S: Store> Store for Gated<S> {
    async fn claim(&self, new: &NewRecord<'_>) -> Result<Claim, StoreError> {
        self.gate.pass().await;
        self.inner.claim(new).await
    }

    async fn take_over(
        &self,
        previous: LeaseToken,
        new: &NewRecord<'_>,
    ) -> Result<Option<Lease>, StoreError> {
        self.inner.take_over(previous, new).await
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        self.gate.pass().await;
        self.inner.complete(lease, response).await
    }

    async fn renew(&self, lease: &Lease, duration: Duration) -> Result<(), StoreError> {
        self.inner.renew(lease, duration).await
    }

    async fn record_steps(
        &self,
        lease: &Lease,
        steps: &[idempotency_guard::Step],
    ) -> Result<(), StoreError> {
        self.inner.record_steps(lease, steps).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let released = self.inner.release(lease).await;
        let outcome = released.as_ref().map(|_| ()).map_err(ToString::to_string);
        let _ = self.released.send((lease.key.as_str().to_owned(), outcome));
        released
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        self.inner.get(scope, key).await
    }

    fn events(&self) -> &RecordEvents {
        self.inner.events()
    }
}

impl<S: BatchedStore> BatchedStore for Gated<S> {
    type Completion = S::Completion;

    fn completion(&self, lease: &Lease, response: &StoredResponse) -> Self::Completion {
        self.inner.completion(lease, response)
    }

    async fn claim_batch(
        &self,
        items: Vec<ClaimItem>,
    ) -> Result<Vec<Result<Claim, StoreError>>, StoreError> {
        self.inner.claim_batch(items).await
    }

    async fn complete_batch(
        &self,
        items: Vec<Self::Completion>,
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        self.inner.complete_batch(items).await
    }
}

/// Polls `future` once, in this task (so it is woken as usual), and says
/// whether it is still pending.
async fn pending_after_one_poll<F: Future>(mut future: Pin<&mut F>) -> bool {
    std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx).is_pending())).await
}

/// Runs `lead` and then `batch` behind it: the lead takes the only slot and
/// waits at the closed gate; every call of `batch` is then queued; then the
/// gate opens. Returns the lead's answer and the batch's.
pub(crate) async fn behind_the_lead<L: Future, B: Future>(
    gate: &Gate,
    lead: L,
    batch: B,
) -> (L::Output, B::Output) {
    let closed = gate.close();
    let mut lead = std::pin::pin!(lead);
    let mut batch = std::pin::pin!(batch);
    assert!(
        pending_after_one_poll(lead.as_mut()).await,
        "the lead did not wait at the gate"
    );
    assert!(
        pending_after_one_poll(batch.as_mut()).await,
        "the batch answered while the lead held the only slot"
    );
    drop(closed);
    tokio::join!(lead, batch)
}

/// Instantiates the batching tests for one store: the fixture's direct
/// store, [`Gated`], batched with [`ONE_AT_A_TIME`].
macro_rules! batching_suite {
    ($backend:ident, $fixture:path) => {
        mod $backend {
            use $crate::batching as suite;

            batching_suite!(@tests $fixture;
                two_hundred_claims_of_one_key_in_one_batch_have_one_winner,
                a_mixed_batch_answers_each_claim_for_itself,
                a_batch_of_completions_is_fenced_per_record,
            );
        }
    };
    (@tests $fixture:path; $($test:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $test() {
                let db = $fixture().await;
                let gate = suite::Gate::default();
                let (store, _) = suite::Gated::batched(db.store.direct().clone(), &gate);
                suite::$test(store, gate).await;
            }
        )*
    };
}

fn new_record<'a>(key: &'a str, fingerprint: &'a Fingerprint) -> NewRecord<'a> {
    NewRecord {
        scope: names::scope("batch"),
        key: names::key(key),
        fingerprint,
        method: "POST",
        path: "/payments",
        token: LeaseToken::new(),
        lease: LEASE,
        retention: DAY,
        transactional: false,
    }
}

fn response(body: &'static str) -> StoredResponse {
    StoredResponse {
        status: StatusCode::CREATED,
        headers: HeaderMap::new(),
        body: Some(Bytes::from_static(body.as_bytes())),
    }
}

/// 200 claims of one key, all in one batch: exactly one holds the lease,
/// the 199 others see its record.
pub(crate) async fn two_hundred_claims_of_one_key_in_one_batch_have_one_winner<S: BatchedStore>(
    store: Batched<Gated<S>>,
    gate: Gate,
) {
    let fingerprint = Fingerprint::from_bytes([1; 32]);
    let lead = new_record("lead", &fingerprint);
    let records: Vec<NewRecord<'_>> = (0..200)
        .map(|_| new_record("one-key", &fingerprint))
        .collect();
    let (lead, claims) = behind_the_lead(
        &gate,
        store.claim(&lead),
        join_all(records.iter().map(|new| store.claim(new))),
    )
    .await;
    let counts = store.batch_stats().claims;
    assert_eq!(
        (counts.batches, counts.largest),
        (2, 200),
        "the 200 claims did not go in one batch behind the lead: {counts:?}"
    );
    assert!(matches!(lead, Ok(Claim::Acquired(_))));
    let mut winners = Vec::new();
    for (new, claim) in records.iter().zip(claims) {
        match claim.expect("claim") {
            Claim::Acquired(lease) => {
                assert_eq!(lease.token, new.token, "a lease with another's token");
                winners.push(lease);
            }
            Claim::Existing(_) => {}
        }
    }
    assert_eq!(winners.len(), 1, "{} claims won one key", winners.len());
    let record = store
        .get(names::scope("batch"), names::key("one-key"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.lease_token, winners[0].token);
    assert_eq!(record.state(), RecordState::InFlight);
}

/// One batch of claims for a fresh key, a completed key (claimed again with
/// its own fingerprint and with another), an in-flight key, and the fresh
/// key twice: each claim gets the answer it would get alone.
pub(crate) async fn a_mixed_batch_answers_each_claim_for_itself<S: BatchedStore>(
    store: Batched<Gated<S>>,
    gate: Gate,
) {
    let paid = Fingerprint::from_bytes([2; 32]);
    let other = Fingerprint::from_bytes([3; 32]);
    // A completed record and an in-flight one, made before the batch.
    let done = acquire(&store, &new_record("done", &paid)).await;
    store.complete(&done, &response("paid")).await.unwrap();
    let running = acquire(&store, &new_record("running", &paid)).await;
    let before = store.batch_stats().claims.batches;

    let lead = new_record("lead", &paid);
    let batch = [
        new_record("fresh", &paid),
        new_record("done", &paid),
        new_record("done", &other),
        new_record("running", &paid),
        new_record("fresh", &other),
    ];
    let (lead, claims) = behind_the_lead(
        &gate,
        store.claim(&lead),
        join_all(batch.iter().map(|new| store.claim(new))),
    )
    .await;
    let claims: Vec<Claim> = claims
        .into_iter()
        .map(|claim| claim.expect("claim"))
        .collect();
    let counts = store.batch_stats().claims;
    assert_eq!(
        (counts.batches, counts.largest),
        (before + 2, 5),
        "the five claims did not go in one batch behind the lead"
    );
    assert!(matches!(lead, Ok(Claim::Acquired(_))));

    match &claims[0] {
        Claim::Acquired(lease) => assert_eq!(lease.token, batch[0].token),
        other => panic!("the fresh key was not acquired: {other:?}"),
    }
    for index in [1, 2] {
        match &claims[index] {
            Claim::Existing(record) => {
                assert_eq!(record.state(), RecordState::Completed);
                assert_eq!(record.lease_token, done.token);
                assert_eq!(record.fingerprint, paid, "the record is the first one's");
                let body = record.response.as_ref().and_then(|r| r.body.clone());
                assert_eq!(body.as_deref(), Some(b"paid".as_slice()));
            }
            other => panic!("claim {index} of the completed key: {other:?}"),
        }
    }
    match &claims[3] {
        Claim::Existing(record) => {
            assert_eq!(record.state(), RecordState::InFlight);
            assert_eq!(record.lease_token, running.token);
        }
        other => panic!("the in-flight key: {other:?}"),
    }
    match &claims[4] {
        Claim::Existing(record) => {
            assert_eq!(
                record.lease_token, batch[0].token,
                "not the first claim's record"
            );
            assert_eq!(record.fingerprint, paid);
        }
        other => panic!("the fresh key's second claim in the batch: {other:?}"),
    }
}

/// One batch of completions: the holder's completes; a completion with a
/// stale token and one for a released record are refused, and the records
/// they name are untouched.
pub(crate) async fn a_batch_of_completions_is_fenced_per_record<S: BatchedStore>(
    store: Batched<Gated<S>>,
    gate: Gate,
) {
    let fingerprint = Fingerprint::from_bytes([4; 32]);
    let held = acquire(&store, &new_record("held", &fingerprint)).await;
    let taken = acquire(&store, &new_record("taken", &fingerprint)).await;
    let released = acquire(&store, &new_record("released", &fingerprint)).await;
    store.release(&released).await.unwrap();
    let lead = acquire(&store, &new_record("lead", &fingerprint)).await;
    let stale = Lease {
        token: LeaseToken::new(),
        ..taken.clone()
    };
    let before = store.batch_stats().completions;

    let first = response("first");
    let (lead, answers) = behind_the_lead(
        &gate,
        store.complete(&lead, &first),
        join_all([
            store.complete(&held, &first),
            store.complete(&stale, &first),
            store.complete(&released, &first),
        ]),
    )
    .await;
    let after = store.batch_stats().completions;
    assert!(lead.is_ok(), "the lead's completion: {lead:?}");
    assert!(
        answers[0].is_ok(),
        "the holder's completion: {:?}",
        answers[0]
    );
    assert!(
        matches!(answers[1], Err(StoreError::LeaseLost)),
        "a stale token completed: {:?}",
        answers[1]
    );
    assert!(
        matches!(answers[2], Err(StoreError::LeaseLost)),
        "a released record completed: {:?}",
        answers[2]
    );

    let record = store
        .get(names::scope("batch"), names::key("held"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state(), RecordState::Completed);
    let record = store
        .get(names::scope("batch"), names::key("taken"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        record.state(),
        RecordState::InFlight,
        "the stale write landed"
    );
    assert_eq!(record.lease_token, taken.token);
    assert!(
        store
            .get(names::scope("batch"), names::key("released"))
            .await
            .unwrap()
            .is_none()
    );
    // The lead by itself, then the three behind it in one batch.
    assert_eq!(
        (after.batches, after.items, after.largest),
        (before.batches + 2, before.items + 4, 3),
        "{after:?}"
    );
}

async fn acquire<S: Store>(store: &S, new: &NewRecord<'_>) -> Lease {
    match store.claim(new).await.expect("claim") {
        Claim::Acquired(lease) => lease,
        Claim::Existing(record) => panic!("expected a new claim, found {record:?}"),
    }
}

/// A batch whose statement fails (a trigger refuses one of its keys) answers
/// every claim of it with the error, writes none of them, and leaves the
/// records it did not claim as they were.
async fn a_failing_batch_writes_nothing<S: BatchedStore>(store: Batched<Gated<S>>, gate: Gate) {
    let fingerprint = Fingerprint::from_bytes([5; 32]);
    let done = acquire(&store, &new_record("done", &fingerprint)).await;
    store.complete(&done, &response("paid")).await.unwrap();
    let running = acquire(&store, &new_record("running", &fingerprint)).await;
    let before = store.batch_stats().claims.batches;

    let lead = new_record("lead", &fingerprint);
    let batch = [
        new_record("fresh", &fingerprint),
        new_record("done", &fingerprint),
        new_record("poison", &fingerprint),
        new_record("running", &fingerprint),
    ];
    let (lead, claims) = behind_the_lead(
        &gate,
        store.claim(&lead),
        join_all(batch.iter().map(|new| store.claim(new))),
    )
    .await;
    let counts = store.batch_stats().claims;
    assert_eq!(
        (counts.batches, counts.largest),
        (before + 2, 4),
        "not one batch behind the lead"
    );
    assert!(matches!(lead, Ok(Claim::Acquired(_))));
    for (new, claim) in batch.iter().zip(&claims) {
        assert!(
            matches!(claim, Err(StoreError::Unavailable(_))),
            "the claim of {} in the failed batch answered {claim:?}",
            new.key
        );
    }
    assert!(
        store
            .get(names::scope("batch"), names::key("fresh"))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .get(names::scope("batch"), names::key("poison"))
            .await
            .unwrap()
            .is_none()
    );
    let record = store
        .get(names::scope("batch"), names::key("done"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (record.state(), record.lease_token),
        (RecordState::Completed, done.token)
    );
    let record = store
        .get(names::scope("batch"), names::key("running"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (record.state(), record.lease_token),
        (RecordState::InFlight, running.token)
    );
    // The store still works for the keys that were not poisoned.
    let fresh = acquire(&store, &new_record("fresh", &fingerprint)).await;
    store.complete(&fresh, &response("later")).await.unwrap();
}

#[tokio::test]
async fn a_failing_postgres_batch_writes_nothing() {
    let db = idempotency_tests::postgres().await;
    for statement in [
        "create function poison() returns trigger language plpgsql as $$
         begin
           if new.key = 'poison' then raise exception 'poisoned key'; end if;
           return new;
         end $$",
        "create trigger poison before insert on idempotency_records
         for each row execute function poison()",
    ] {
        sqlx::query(statement)
            .execute(db.store.pool())
            .await
            .unwrap();
    }
    let gate = Gate::default();
    let (store, _) = Gated::batched(db.store.direct().clone(), &gate);
    a_failing_batch_writes_nothing(store, gate).await;
}

#[tokio::test]
async fn a_failing_sqlite_batch_writes_nothing() {
    let db = idempotency_tests::sqlite().await;
    sqlx::query(
        "create trigger poison before insert on idempotency_records
         when new.key = 'poison'
         begin select raise(abort, 'poisoned key'); end",
    )
    .execute(db.store.pool())
    .await
    .unwrap();
    let gate = Gate::default();
    let (store, _) = Gated::batched(db.store.direct().clone(), &gate);
    a_failing_batch_writes_nothing(store, gate).await;
}

/// A caller that goes away while its claim waits in the batcher's queue
/// (behind a lead held at the gate): the batch lands after it left, and
/// the batcher, which owns the batch, releases the claim nobody will run
/// (no engine involved here).
#[tokio::test]
async fn a_claim_acquired_for_a_caller_that_left_is_released_by_the_batcher() {
    let db = idempotency_tests::sqlite().await;
    let gate = Gate::default();
    let (store, mut releases) = Gated::batched(db.store.direct().clone(), &gate);
    let fingerprint = Fingerprint::from_bytes([6; 32]);
    let lead = new_record("lead", &fingerprint);
    let left = new_record("left", &fingerprint);
    let closed = gate.close();
    let mut lead = std::pin::pin!(store.claim(&lead));
    assert!(
        pending_after_one_poll(lead.as_mut()).await,
        "the lead waits"
    );
    {
        // Queued behind the lead, then the caller goes away: its claim
        // stays in the batcher's hands.
        let claim = std::pin::pin!(store.claim(&left));
        assert!(pending_after_one_poll(claim).await, "the claim is queued");
    }
    drop(closed);
    let lead = lead.await;
    assert!(matches!(lead, Ok(Claim::Acquired(_))), "{lead:?}");
    // The batch claims it for nobody; the batcher releases it, fenced by
    // its token, and the record is gone.
    // (The bound only keeps a broken batcher from hanging the suite.)
    let (key, released) = tokio::time::timeout(Duration::from_secs(30), releases.recv())
        .await
        .expect("the batcher released the claim")
        .expect("a release");
    assert_eq!((key.as_str(), released), ("left", Ok(())));
    assert_eq!(
        store.batch_stats().claims.items,
        2,
        "the left claim was sent"
    );
    assert!(
        store
            .get(names::scope("batch"), names::key("left"))
            .await
            .unwrap()
            .is_none()
    );
}
