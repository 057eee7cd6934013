//! The NATS store beyond the shared suites: its reads that decide come
//! from the stream's leader (`STREAM.MSG.GET`, which only the leader
//! answers), never from a direct get, which any replica may answer from a
//! state that lags the acknowledged writes (a claim's loser would see no
//! winner): a spy subscribes to both API subjects of the test's bucket and
//! counts what the store's operations send. And the bucket's watch waking
//! another process's waiters, and `AnyStore::open` for `STORE=nats`.

use std::time::Duration;

use futures_util::StreamExt;
use idempotency_guard::store::{Claim, LeaseToken, NewRecord};
use idempotency_guard::{Fingerprint, Store, StoredResponse};
use idempotency_tests::names;

fn new_record<'a>(key: &'a str, fingerprint: &'a Fingerprint) -> NewRecord<'a> {
    NewRecord {
        scope: names::scope("reads"),
        key: names::key(key),
        fingerprint,
        method: "POST",
        path: "/",
        token: LeaseToken::new(),
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
        transactional: false,
    }
}

/// How many messages `subscriber` holds now (it waits a moment for the
/// last ones, then stops).
async fn count(subscriber: &mut async_nats::Subscriber) -> usize {
    let mut seen = 0;
    while let Ok(Some(_)) =
        tokio::time::timeout(Duration::from_millis(300), subscriber.next()).await
    {
        seen += 1;
    }
    seen
}

/// Spies on the JetStream API of `store`'s bucket: one subscription per
/// subject, `{stream}` standing for the bucket's stream, in order.
async fn spy(
    store: &idempotency_guard::store::nats::NatsStore,
    subjects: &[&str],
) -> Vec<async_nats::Subscriber> {
    let stream = format!("KV_{}", store.bucket());
    let url = tokio::task::spawn_blocking(idempotency_tests::nats_server::nats_store_url)
        .await
        .unwrap();
    let spy = async_nats::connect(url).await.unwrap();
    let mut subscribers = Vec::new();
    for subject in subjects {
        let subject = subject.replace("{stream}", &stream);
        subscribers.push(spy.subscribe(subject).await.unwrap());
    }
    spy.flush().await.unwrap();
    subscribers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_deciding_read_goes_to_the_streams_leader_never_to_a_direct_get() {
    let db = idempotency_tests::nats().await;
    let [mut direct, mut direct_by_subject, mut leader]: [async_nats::Subscriber; 3] = spy(
        &db.store,
        &[
            "$JS.API.DIRECT.GET.{stream}",
            "$JS.API.DIRECT.GET.{stream}.>",
            "$JS.API.STREAM.MSG.GET.{stream}",
        ],
    )
    .await
    .try_into()
    .unwrap_or_else(|_| unreachable!("three subjects"));

    let fingerprint = Fingerprint::from_bytes([1; 32]);
    let Claim::Acquired(lease) = db
        .store
        .claim(&new_record("k", &fingerprint))
        .await
        .unwrap()
    else {
        panic!("a fresh key is acquired");
    };
    // The loser of a claim reads the winner.
    let Claim::Existing(winner) = db
        .store
        .claim(&new_record("k", &fingerprint))
        .await
        .unwrap()
    else {
        panic!("a second claim loses");
    };
    assert_eq!(winner.lease_token, lease.token);
    // A completion may read before its fenced write (when the watch has
    // not seen its claim yet); a replay reads.
    db.store
        .complete(&lease, &StoredResponse::from_bytes("done"))
        .await
        .unwrap();
    let replay = db
        .store
        .get(names::scope("reads"), names::key("k"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(replay.response.unwrap().body.unwrap(), "done");

    assert_eq!(
        count(&mut direct).await + count(&mut direct_by_subject).await,
        0
    );
    assert!(
        count(&mut leader).await >= 2,
        "the loser's read and the replay's go to the leader"
    );
}

/// The raw value of a record in the NATS bucket, as the leader holds it
/// (for the sealed-records suite: no plaintext in the bucket).
pub(crate) async fn raw_nats(
    store: &idempotency_guard::store::nats::NatsStore,
    scope: &str,
    key: &str,
) -> Vec<u8> {
    use base64::Engine as _;
    let token = |text: &str| {
        format!(
            "={}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
        )
    };
    let url = tokio::task::spawn_blocking(idempotency_tests::nats_server::nats_store_url)
        .await
        .unwrap();
    let client = async_nats::connect(url).await.unwrap();
    let stream = async_nats::jetstream::new(client)
        .get_stream(format!("KV_{}", store.bucket()))
        .await
        .unwrap();
    let subject = format!("$KV.{}.{}.{}", store.bucket(), token(scope), token(key));
    match stream.get_last_raw_message_by_subject(&subject).await {
        Ok(message) => message.payload.to_vec(),
        Err(_) => Vec::new(),
    }
}

/// `AnyStore::open` builds the NATS store from `StoreOptions` (as the
/// service, the gateway and the example do for `STORE=nats`), sealed
/// when given keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_store_opens_the_nats_store_from_its_options() {
    use idempotency_guard::store::{AnyStore, NatsOptions, StoreKind, StoreOptions};
    let url = tokio::task::spawn_blocking(idempotency_tests::nats_server::nats_store_url)
        .await
        .unwrap();
    let bucket = format!("test-any-{}", uuid::Uuid::new_v4().simple());
    let keys = idempotency_guard::store::encrypted::EncryptionKeys::parse(
        "a:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
    )
    .unwrap();
    let mut options = StoreOptions::sql("");
    options.kind = StoreKind::Nats;
    options.nats = Some(NatsOptions {
        url: &url,
        bucket: &bucket,
        replicas: None,
    });
    let plain = AnyStore::open(&options).await.unwrap();
    assert_eq!(plain.kind(), "nats");
    assert!(!plain.is_encrypted());
    plain.migrate().await.expect("nothing to migrate");
    options.encryption = Some(&keys);
    let sealed = AnyStore::open(&options).await.unwrap();
    assert!(sealed.is_encrypted());
    let (router, runs) = crate::support::app(idempotency_guard::IdempotencyLayer::new(sealed));
    let first = crate::support::send(&router, "any-1", r#"{"n":1}"#).await;
    let replay = crate::support::send(&router, "any-1", r#"{"n":1}"#).await;
    assert_eq!(runs.get(), 1);
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    let client = async_nats::connect(url).await.unwrap();
    async_nats::jetstream::new(client)
        .delete_stream(format!("KV_{bucket}"))
        .await
        .unwrap();
}

/// The bucket's watch wakes waiters of another process: a store opened
/// apart on the same bucket (as another process would) sees the
/// completion of this one's record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_in_one_process_wakes_the_waiters_of_another() {
    use idempotency_guard::store::nats::NatsStore;
    let db = idempotency_tests::nats().await;
    let url = tokio::task::spawn_blocking(idempotency_tests::nats_server::nats_store_url)
        .await
        .unwrap();
    let other = NatsStore::connect(&url, db.store.bucket()).await.unwrap();
    let fingerprint = Fingerprint::from_bytes([2; 32]);
    let Claim::Acquired(lease) = db
        .store
        .claim(&new_record("w", &fingerprint))
        .await
        .unwrap()
    else {
        panic!("a fresh key is acquired");
    };
    // The claim's own event reaches the other process first; then quiet.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let waiter = other.events().subscribe("reads", "w");
    // Not woken by nothing: the other process's registry stays quiet.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), waiter.changed())
            .await
            .is_err()
    );
    db.store
        .complete(&lease, &StoredResponse::from_bytes("done"))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiter.changed())
        .await
        .expect("the other process's waiter is woken by the bucket's watch");
}

/// A completion of this process's own claim, once the bucket's watch has
/// seen the claim, writes at once, fenced by the claim's revision: no read
/// from the leader (one round trip less per fresh request), and the
/// completed record keeps the claim's instants exactly as a read gives
/// them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_of_its_own_claim_writes_without_reading_first() {
    let db = idempotency_tests::nats().await;
    let mut leader = spy(&db.store, &["$JS.API.STREAM.MSG.GET.{stream}"])
        .await
        .remove(0);

    let claim_seen = db.store.events().subscribe("reads", "own");
    let fingerprint = Fingerprint::from_bytes([3; 32]);
    let Claim::Acquired(lease) = db
        .store
        .claim(&new_record("own", &fingerprint))
        .await
        .unwrap()
    else {
        panic!("a fresh key is acquired");
    };
    tokio::time::timeout(Duration::from_secs(5), claim_seen.changed())
        .await
        .expect("the watch sees the claim");
    let in_flight = db
        .store
        .get(names::scope("reads"), names::key("own"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(count(&mut leader).await, 1, "the read above");

    db.store
        .complete(&lease, &StoredResponse::from_bytes("done"))
        .await
        .unwrap();
    assert_eq!(count(&mut leader).await, 0, "the completion read nothing");

    let completed = db
        .store
        .get(names::scope("reads"), names::key("own"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(completed.response.unwrap().body.unwrap(), "done");
    assert_eq!(completed.lease_token, lease.token);
    assert_eq!(completed.created_at, in_flight.created_at);
    assert_eq!(completed.expires_at, in_flight.expires_at);
    assert_eq!(completed.lease_expires_at, in_flight.lease_expires_at);
    assert_eq!(completed.method, in_flight.method);
    assert_eq!(completed.path, in_flight.path);
    assert_eq!(completed.fingerprint, in_flight.fingerprint);
}

/// The completion that writes without reading is still fenced: another
/// process that took the lapsed lease over moved the record's revision, so
/// the leader refuses the completion, which reads, finds another lease and
/// answers `LeaseLost`; the take-over's record stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_without_a_read_is_fenced_by_the_claims_revision() {
    use idempotency_guard::store::StoreError;
    use idempotency_guard::store::nats::NatsStore;
    let db = idempotency_tests::nats().await;
    let url = tokio::task::spawn_blocking(idempotency_tests::nats_server::nats_store_url)
        .await
        .unwrap();
    let other = NatsStore::connect(&url, db.store.bucket()).await.unwrap();
    let fingerprint = Fingerprint::from_bytes([4; 32]);
    let claim_seen = db.store.events().subscribe("reads", "fenced");
    let mut first = new_record("fenced", &fingerprint);
    first.lease = Duration::from_millis(300);
    let Claim::Acquired(lease) = db.store.claim(&first).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    tokio::time::timeout(Duration::from_secs(5), claim_seen.changed())
        .await
        .expect("the watch sees the claim");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = new_record("fenced", &fingerprint);
    let taken = other
        .take_over(lease.token, &second)
        .await
        .unwrap()
        .expect("the lapsed lease is taken over");

    let refused = db
        .store
        .complete(&lease, &StoredResponse::from_bytes("late"))
        .await;
    assert!(matches!(refused, Err(StoreError::LeaseLost)), "{refused:?}");
    let record = other
        .get(names::scope("reads"), names::key("fenced"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.lease_token, taken.token);
    assert!(record.response.is_none());
}
