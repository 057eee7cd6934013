//! A rolling upgrade from release 1's Redis layout (one hash per record)
//! to version 2 (one packed string value): records written by release 1's
//! own scripts (kept verbatim under `tests/it/release1/`) answer through
//! this release as they did, and release 1's scripts fail closed on a
//! version 2 record (docs/RELEASING.md).

use std::time::Duration;

use idempotency_guard::store::redis::RedisStore;
use idempotency_guard::store::{Claim, Lease, LeaseToken, NewRecord, Store};
use idempotency_guard::{Fingerprint, RecordState, StoredResponse};
use idempotency_tests::names;
use redis::{Script, Value};

/// Release 1's scripts, assembled as release 1 assembled them.
fn release1(files: &[&str]) -> Script {
    let source: String = files
        .iter()
        .map(|file| match *file {
            "now" => include_str!("release1/now.lua"),
            "write_new" => include_str!("release1/write_new.lua"),
            "pack" => include_str!("release1/pack.lua"),
            "claim" => include_str!("release1/claim.lua"),
            "fence" => include_str!("release1/fence.lua"),
            "complete" => include_str!("release1/complete.lua"),
            "get" => include_str!("release1/get.lua"),
            "renew" => include_str!("release1/renew.lua"),
            "take_over" => include_str!("release1/take_over.lua"),
            other => panic!("no release 1 script {other}"),
        })
        .collect();
    Script::new(&source)
}

/// Release 1's packed request: fingerprint, transactional flag, the
/// method's length, the method, the path.
fn packed_request(fingerprint: &Fingerprint, method: &str, path: &str) -> Vec<u8> {
    let mut packed = fingerprint.as_bytes().to_vec();
    packed.push(0);
    packed.push(u8::try_from(method.len()).unwrap());
    packed.extend_from_slice(method.as_bytes());
    packed.extend_from_slice(path.as_bytes());
    packed
}

/// Release 1's packed response: status, stored flag, headers' length, the
/// headers, the body.
fn packed_response(response: &StoredResponse) -> Vec<u8> {
    let headers = response.encode_headers();
    let mut packed = response.status.as_u16().to_be_bytes().to_vec();
    packed.push(u8::from(response.body.is_some()));
    packed.extend_from_slice(&u32::try_from(headers.len()).unwrap().to_be_bytes());
    packed.extend_from_slice(&headers);
    packed.extend_from_slice(response.body.as_deref().unwrap_or_default());
    packed
}

struct Release1 {
    connection: redis::aio::MultiplexedConnection,
    prefix: String,
}

impl Release1 {
    fn key(&self, scope: &str, key: &str) -> String {
        format!("{}:r:{}:{scope}:{key}", self.prefix, scope.len())
    }

    /// Release 1's claim of `(scope, key)`; its answer's first number.
    async fn claim(
        &mut self,
        scope: &str,
        key: &str,
        token: LeaseToken,
        lease_ms: u64,
        fingerprint: &Fingerprint,
    ) -> redis::RedisResult<Value> {
        release1(&["now", "write_new", "pack", "claim"])
            .key(self.key(scope, key))
            .arg(token.as_uuid().as_bytes().as_slice())
            .arg(lease_ms)
            .arg(3_600_000)
            .arg(packed_request(fingerprint, "POST", "/orders"))
            .invoke_async(&mut self.connection)
            .await
    }

    async fn complete(
        &mut self,
        scope: &str,
        key: &str,
        token: LeaseToken,
        response: &StoredResponse,
    ) -> redis::RedisResult<i64> {
        release1(&["fence", "now", "complete"])
            .key(self.key(scope, key))
            .arg(token.as_uuid().as_bytes().as_slice())
            .arg(packed_response(response))
            .arg(format!("{}:events", self.prefix))
            .invoke_async(&mut self.connection)
            .await
    }
}

async fn setup() -> (idempotency_tests::TestDb<RedisStore>, Release1) {
    let db = idempotency_tests::redis().await;
    let prefix = db.redis_prefix().unwrap().to_owned();
    let client = redis::Client::open(idempotency_tests::fixtures::redis_url()).unwrap();
    let connection = client.get_multiplexed_async_connection().await.unwrap();
    (db, Release1 { connection, prefix })
}

fn new_record<'a>(key: &'a str, fingerprint: &'a Fingerprint) -> NewRecord<'a> {
    NewRecord {
        scope: names::scope("s"),
        key: names::key(key),
        fingerprint,
        method: "POST",
        path: "/orders",
        token: LeaseToken::new(),
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
        transactional: false,
    }
}

fn response() -> StoredResponse {
    let mut headers = http::HeaderMap::new();
    headers.insert("location", http::HeaderValue::from_static("/orders/7"));
    headers.append("x-multi", http::HeaderValue::from_static("a"));
    headers.append("x-multi", http::HeaderValue::from_static("b"));
    StoredResponse {
        status: http::StatusCode::CREATED,
        headers,
        body: Some(bytes::Bytes::from_static(b"{\"id\":7}\x00\xff")),
    }
}

/// A completed release 1 record replays byte for byte, from a claim and a
/// read, with its fingerprint unchanged (a retry is not `key-reused`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_release1_record_replays_byte_for_byte_redis() {
    let (db, mut old) = setup().await;
    let fingerprint = Fingerprint::from_bytes([5; 32]);
    let token = LeaseToken::new();
    old.claim("s", "done", token, 30_000, &fingerprint)
        .await
        .unwrap();
    assert_eq!(
        old.complete("s", "done", token, &response()).await.unwrap(),
        1
    );

    let Claim::Existing(record) = db
        .store
        .claim(&new_record("done", &fingerprint))
        .await
        .unwrap()
    else {
        panic!("a completed record is not acquired again");
    };
    assert_eq!(record.state(), RecordState::Completed);
    assert_eq!(record.response, Some(response()));
    assert_eq!(record.fingerprint, fingerprint);
    assert_eq!(record.lease_token, token);
    assert_eq!(
        (record.method.as_str(), record.path.as_str()),
        ("POST", "/orders")
    );
    assert!(!record.is_expired());
    let read = db
        .store
        .get(names::scope("s"), names::key("done"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.response, Some(response()));
}

/// An in-flight release 1 record is in flight for the new release (its
/// lease is the old process's), and the old process still completes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_flight_release1_record_stays_in_flight_redis() {
    let (db, mut old) = setup().await;
    let fingerprint = Fingerprint::from_bytes([6; 32]);
    let token = LeaseToken::new();
    old.claim("s", "running", token, 30_000, &fingerprint)
        .await
        .unwrap();

    let Claim::Existing(record) = db
        .store
        .claim(&new_record("running", &fingerprint))
        .await
        .unwrap()
    else {
        panic!("an in-flight record is not acquired again");
    };
    assert_eq!(record.state(), RecordState::InFlight);
    assert_eq!(record.lease_token, token);
    // The new release cannot take it over while its lease lives.
    let taken = db
        .store
        .take_over(token, &new_record("running", &fingerprint))
        .await
        .unwrap();
    assert_eq!(taken, None);
    // The old process completes it; the new one replays it.
    assert_eq!(
        old.complete("s", "running", token, &response())
            .await
            .unwrap(),
        1
    );
    let record = db
        .store
        .get(names::scope("s"), names::key("running"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state(), RecordState::Completed);
    assert_eq!(record.response, Some(response()));
}

/// An abandoned release 1 record (its lease lapsed) reads as abandoned and
/// is taken over; the new lease completes it as a version 2 record, which
/// release 1's scripts refuse with an error (its process answers 503 and
/// never runs the work).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_release1_record_is_taken_over_and_old_scripts_fail_closed_redis() {
    let (db, mut old) = setup().await;
    let fingerprint = Fingerprint::from_bytes([7; 32]);
    let token = LeaseToken::new();
    old.claim("s", "lapsed", token, 1, &fingerprint)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;

    let new = new_record("lapsed", &fingerprint);
    let Claim::Existing(record) = db.store.claim(&new).await.unwrap() else {
        panic!("an abandoned record is reported, not silently replaced");
    };
    assert_eq!(record.state(), RecordState::Abandoned);
    let lease: Lease = db.store.take_over(token, &new).await.unwrap().unwrap();
    // The old holder's lease is gone.
    assert_eq!(
        old.complete("s", "lapsed", token, &response()).await.ok(),
        None
    );
    db.store.complete(&lease, &response()).await.unwrap();
    let record = db
        .store
        .get(names::scope("s"), names::key("lapsed"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.response, Some(response()));

    // Release 1 meets the version 2 record: its claim fails, it never
    // acquires the key.
    let refused = old
        .claim("s", "lapsed", LeaseToken::new(), 30_000, &fingerprint)
        .await;
    let error = refused.expect_err("release 1 cannot read a version 2 record");
    assert_eq!(error.code(), Some("WRONGTYPE"), "{error}");
    // A fresh version 2 claim: release 1 refuses it too.
    let Claim::Acquired(_) = db
        .store
        .claim(&new_record("fresh", &fingerprint))
        .await
        .unwrap()
    else {
        panic!("a fresh key is acquired");
    };
    let refused = old
        .claim("s", "fresh", LeaseToken::new(), 30_000, &fingerprint)
        .await;
    assert!(refused.is_err());
}

/// An operator forgets a release 1 record through the admin store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release1_records_are_forgotten_by_the_admin_store_redis() {
    use idempotency_guard::store::AdminStore;
    use idempotency_guard::store::admin::{ForgetRule, Forgotten};
    let (db, mut old) = setup().await;
    let fingerprint = Fingerprint::from_bytes([8; 32]);
    let token = LeaseToken::new();
    old.claim("s", "old", token, 30_000, &fingerprint)
        .await
        .unwrap();
    old.complete("s", "old", token, &response()).await.unwrap();
    let forgotten = db
        .store
        .forget("s", "old", ForgetRule::Completed)
        .await
        .unwrap();
    assert_eq!(forgotten, Forgotten::Deleted(RecordState::Completed));
    assert!(
        db.store
            .get(names::scope("s"), names::key("old"))
            .await
            .unwrap()
            .is_none()
    );
}
