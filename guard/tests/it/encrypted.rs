//! Encryption at rest ([`EncryptedStore`]) over every store: what the store
//! itself holds carries no plaintext of a body or a header value; records
//! sealed under an old key replay after rotation; a record sealed under a
//! key the ring no longer holds is a clear, counted error, never garbage.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use idempotency_guard::store::encrypted::{DECRYPT_FAILURES_TOTAL, SEALED};
use idempotency_guard::store::encrypted::{EncryptedStore, EncryptionKeys};
use idempotency_guard::store::{Claim, LeaseToken, NewRecord};
use idempotency_guard::{Fingerprint, Store, StoreError, StoredResponse};
use idempotency_tests::names;

/// Instantiates the encryption tests for one store; `$raw` reads the
/// stored response's bytes straight from the backend.
macro_rules! encrypted_suite {
    ($backend:ident, $fixture:path, $raw:path) => {
        mod $backend {
            use $crate::encrypted as suite;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_store_holds_no_plaintext_of_bodies_or_headers() {
                let db = $fixture().await;
                suite::the_store_holds_no_plaintext(db.store.clone(), |scope, key| {
                    let store = db.store.clone();
                    async move { $raw(&store, &scope, &key).await }
                })
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_unsealed_record_is_refused_when_sealing_is_required() {
                let db = $fixture().await;
                suite::unsealed_refused_when_required(db.store.clone()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn rotation_keeps_old_records_readable_and_unknown_keys_fail_clearly() {
                let db = $fixture().await;
                suite::rotation_and_unknown_keys(db.store.clone()).await;
            }
        }
    };
}

const BODY_SECRET: &str = "sk_live_body_secret_51HqLyjWDarjtT1zdp7dc";
const HEADER_SECRET: &str = "header-secret-value-9f8e7d6c5b4a";
const KEY_A: &str = "a:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const KEY_B: &str = "b:HyAhIiMkJSYnKCkqKywtLi8wMTIzNDU2Nzg5Ojs8PT4=";
const FP: Fingerprint = Fingerprint::from_bytes([3; 32]);

fn keys(text: &str) -> EncryptionKeys {
    EncryptionKeys::parse(text).unwrap()
}

fn minted() -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.insert("x-api-key", HeaderValue::from_static(HEADER_SECRET));
    StoredResponse {
        status: StatusCode::CREATED,
        headers,
        body: Some(Bytes::from(format!(r#"{{"api_key":"{BODY_SECRET}"}}"#))),
    }
}

async fn complete<S: Store>(store: &S, scope: &str, key: &str, response: &StoredResponse) {
    let new = NewRecord {
        scope: names::scope(scope),
        key: names::key(key),
        fingerprint: &FP,
        method: "POST",
        path: "/keys",
        token: LeaseToken::new(),
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
        transactional: false,
    };
    let Claim::Acquired(lease) = store.claim(&new).await.unwrap() else {
        panic!("{scope}/{key} was already claimed");
    };
    store.complete(&lease, response).await.unwrap();
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

pub(crate) async fn the_store_holds_no_plaintext<S, F, Fut>(store: S, raw: F)
where
    S: Store,
    F: Fn(String, String) -> Fut,
    Fut: std::future::Future<Output = Vec<u8>>,
{
    let encrypted = EncryptedStore::new(store.clone(), keys(KEY_A));
    complete(&encrypted, "enc-scope", "minted", &minted()).await;
    // A response too large to store keeps its headers sealed too.
    let mut too_large = minted();
    too_large.body = None;
    complete(&encrypted, "enc-scope", "too-large", &too_large).await;

    for key in ["minted", "too-large"] {
        let bytes = raw("enc-scope".to_owned(), key.to_owned()).await;
        assert!(!bytes.is_empty(), "{key}: the raw read found the record");
        assert!(!contains(&bytes, BODY_SECRET), "{key}: body in clear");
        assert!(!contains(&bytes, HEADER_SECRET), "{key}: header in clear");
        assert!(
            !contains(&bytes, "application/json"),
            "{key}: header in clear"
        );
        assert!(contains(&bytes, "v1 a"), "{key}: the key id is stored");
    }
    let inner = store
        .get(names::scope("enc-scope"), names::key("too-large"))
        .await
        .unwrap()
        .unwrap();
    assert!(
        inner.response.unwrap().body.is_none(),
        "whether a body is stored stays visible without a key"
    );
    // Through the wrapper, the response is whole again.
    let record = encrypted
        .get(names::scope("enc-scope"), names::key("minted"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.response, Some(minted()));
    let record = encrypted
        .get(names::scope("enc-scope"), names::key("too-large"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.response, Some(too_large));
    // The inner store sees the status (the status API needs it) and the seal.
    let inner = store
        .get(names::scope("enc-scope"), names::key("minted"))
        .await
        .unwrap()
        .unwrap();
    let response = inner.response.unwrap();
    assert_eq!(response.status, StatusCode::CREATED);
    assert_eq!(response.headers[&SEALED], "v1 a");
}

pub(crate) async fn unsealed_refused_when_required<S: Store>(store: S) {
    // Planted in clear by whoever can write the store.
    complete(&store, "enc-scope", "planted", &minted()).await;
    let lenient = EncryptedStore::new(store.clone(), keys(KEY_A));
    let record = lenient
        .get(names::scope("enc-scope"), names::key("planted"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.response, Some(minted()), "read as it is by default");
    let strict = EncryptedStore::new(store.clone(), keys(KEY_A)).with_require_sealed(true);
    assert!(
        matches!(
            strict
                .get(names::scope("enc-scope"), names::key("planted"))
                .await,
            Err(StoreError::Corrupt(_))
        ),
        "refused when sealing is required"
    );
    // A sealed one still reads.
    complete(&strict, "enc-scope", "sealed", &minted()).await;
    let record = strict
        .get(names::scope("enc-scope"), names::key("sealed"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.response, Some(minted()));
}

pub(crate) async fn rotation_and_unknown_keys<S: Store>(store: S) {
    crate::metrics_probe::install();
    let under_a = EncryptedStore::new(store.clone(), keys(KEY_A));
    complete(&under_a, "rot", "old", &minted()).await;

    // Rotate: B seals new records, A still opens old ones.
    let under_b = EncryptedStore::new(store.clone(), keys(&format!("{KEY_B},{KEY_A}")));
    let old = under_b
        .get(names::scope("rot"), names::key("old"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        old.response,
        Some(minted()),
        "A's record replays after rotation"
    );
    complete(&under_b, "rot", "new", &minted()).await;
    let new = store
        .get(names::scope("rot"), names::key("new"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(new.response.unwrap().headers[&SEALED], "v1 b");
    // Claiming a completed key (a replay) opens it too.
    let claim = NewRecord {
        scope: names::scope("rot"),
        key: names::key("old"),
        fingerprint: &FP,
        method: "POST",
        path: "/keys",
        token: LeaseToken::new(),
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
        transactional: false,
    };
    let Claim::Existing(existing) = under_b.claim(&claim).await.unwrap() else {
        panic!("the key is completed");
    };
    assert_eq!(existing.response, Some(minted()));

    // A dropped: its records are a clear error, counted, never garbage.
    let only_b = EncryptedStore::new(store.clone(), keys(KEY_B));
    let before =
        crate::metrics_probe::counter(DECRYPT_FAILURES_TOTAL, &[("reason", "unknown-key")]);
    let error = only_b
        .get(names::scope("rot"), names::key("old"))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, StoreError::Corrupt(_)) && error.to_string().contains("key id"),
        "{error}"
    );
    assert!(matches!(
        only_b.claim(&claim).await,
        Err(StoreError::Corrupt(_))
    ));
    let after = crate::metrics_probe::counter(DECRYPT_FAILURES_TOTAL, &[("reason", "unknown-key")]);
    assert!(
        after >= before + 2,
        "each failure is counted ({before} -> {after})"
    );
    assert_eq!(
        only_b
            .get(names::scope("rot"), names::key("new"))
            .await
            .unwrap()
            .unwrap()
            .response,
        Some(minted())
    );

    // A wrong key under a known id does not authenticate: an error, counted.
    let impostor = EncryptedStore::new(
        store.clone(),
        keys("a:HyAhIiMkJSYnKCkqKywtLi8wMTIzNDU2Nzg5Ojs8PT4="),
    );
    let before = crate::metrics_probe::counter(DECRYPT_FAILURES_TOTAL, &[("reason", "invalid")]);
    assert!(matches!(
        impostor.get(names::scope("rot"), names::key("old")).await,
        Err(StoreError::Corrupt(_))
    ));
    let after = crate::metrics_probe::counter(DECRYPT_FAILURES_TOTAL, &[("reason", "invalid")]);
    assert!(after > before);
}

/// The stored response's columns of one PostgreSQL row.
pub(crate) async fn raw_postgres(
    store: &idempotency_guard::store::postgres::PostgresStore,
    scope: &str,
    key: &str,
) -> Vec<u8> {
    let (headers, body): (Option<Vec<u8>>, Option<Vec<u8>>) = sqlx::query_as(
        "select response_headers, response_body from idempotency_records where scope = $1 and key = $2",
    )
    .bind(scope)
    .bind(key)
    .fetch_one(store.pool())
    .await
    .unwrap();
    [headers.unwrap_or_default(), body.unwrap_or_default()].concat()
}

/// The stored response's columns of one SQLite row.
pub(crate) async fn raw_sqlite(
    store: &idempotency_guard::store::sqlite::SqliteStore,
    scope: &str,
    key: &str,
) -> Vec<u8> {
    let (headers, body): (Option<Vec<u8>>, Option<Vec<u8>>) = sqlx::query_as(
        "select response_headers, response_body from idempotency_records where scope = ?1 and key = ?2",
    )
    .bind(scope)
    .bind(key)
    .fetch_one(store.pool())
    .await
    .unwrap();
    [headers.unwrap_or_default(), body.unwrap_or_default()].concat()
}

/// The Redis keys matching `pattern`, with `SCAN` (`KEYS` blocks a shared
/// Redis that holds many keys, and timed out on one holding 700k).
async fn scan(connection: &mut redis::aio::MultiplexedConnection, pattern: &str) -> Vec<Vec<u8>> {
    let mut names = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(10_000)
            .query_async(connection)
            .await
            .unwrap();
        names.extend(batch);
        if next == 0 {
            return names;
        }
        cursor = next;
    }
}

/// The record's Redis value, read with a plain client.
pub(crate) async fn raw_redis(
    _store: &idempotency_guard::store::redis::RedisStore,
    scope: &str,
    key: &str,
) -> Vec<u8> {
    let client = redis::Client::open(idempotency_tests::fixtures::redis_url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let pattern = format!("*:r:{}:{scope}:{key}", scope.len());
    let names = scan(&mut connection, &pattern).await;
    let mut bytes = Vec::new();
    for name in names {
        let value: Vec<u8> = redis::cmd("GET")
            .arg(name)
            .query_async(&mut connection)
            .await
            .unwrap();
        bytes.extend(value);
    }
    bytes
}

/// Through the guard: a sealed response replays byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_replays_a_sealed_response_byte_for_byte() {
    let db = idempotency_tests::sqlite().await;
    let store = EncryptedStore::new(db.store.clone(), keys(KEY_A));
    let (router, runs) =
        crate::support::app(idempotency_guard::IdempotencyLayer::new(store.clone()));
    let first = crate::support::send(&router, "sealed-1", r#"{"amount":1}"#).await;
    let replay = crate::support::send(&router, "sealed-1", r#"{"amount":1}"#).await;
    assert_eq!(runs.get(), 1);
    assert_eq!(replay.status, first.status);
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.header("location"), first.header("location"));
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    let raw = raw_sqlite(&db.store, "default", "sealed-1").await;
    assert!(
        !contains(&raw, "/things/1"),
        "the Location header is sealed"
    );
}

/// Configuration turns encryption on: `AnyStore::open` given keys (as the
/// example app and the gateway build it from `IDEMPOTENCY_ENCRYPTION_KEYS`)
/// seals what the guard stores; the Redis value holds no plaintext of the
/// body or a header, and the replay is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_store_opened_with_configured_keys_seals_what_the_guard_stores() {
    use idempotency_guard::store::{AnyStore, StoreKind, StoreOptions};

    let url = idempotency_tests::fixtures::redis_url();
    let prefix = format!("test-enc-config-{}", uuid::Uuid::new_v4().simple());
    let keys = keys(KEY_A);
    let mut options = StoreOptions::sql("");
    options.kind = StoreKind::Redis;
    options.redis_url = Some(&url);
    options.redis_prefix = &prefix;
    options.encryption = Some(&keys);
    let store = AnyStore::open(&options).await.unwrap();
    assert!(store.is_encrypted());
    let (router, runs) =
        crate::support::app(idempotency_guard::IdempotencyLayer::new(store.clone()));
    let body = r#"{"card":"4242424242424242"}"#;
    let first = crate::support::send(&router, "configured-1", body).await;
    let replay = crate::support::send(&router, "configured-1", body).await;
    assert_eq!(runs.get(), 1);
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(replay.body, first.body);
    assert!(contains(&first.body, "4242424242424242"));
    assert_eq!(replay.header("location"), Some("/things/1"));

    let client = redis::Client::open(url.as_str()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let names = scan(&mut connection, &format!("{prefix}:r:*")).await;
    assert_eq!(names.len(), 1, "one record under the test's prefix");
    let mut raw = Vec::new();
    for name in &names {
        let value: Vec<u8> = redis::cmd("GET")
            .arg(name)
            .query_async(&mut connection)
            .await
            .unwrap();
        raw.extend(value);
    }
    assert!(!contains(&raw, "4242424242424242"), "body in clear");
    assert!(!contains(&raw, "/things/1"), "the Location header in clear");
    assert!(!contains(&raw, "application/json"), "a header in clear");
    assert!(contains(&raw, "v1 a"), "the key id is stored");

    let mut everything = scan(&mut connection, &format!("{prefix}:*")).await;
    everything.extend(names);
    for name in everything {
        let _: redis::RedisResult<i64> = redis::cmd("DEL")
            .arg(name)
            .query_async(&mut connection)
            .await;
    }
}

/// Completes `key` in `store` with a response in clear, for
/// `POST /things` with `body` (what the guard would fingerprint), as
/// whoever can write the store would plant it.
async fn plant_in_clear<S: Store>(store: &S, key: &str, body: &str) {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    let fingerprint =
        Fingerprint::of_request(&http::Method::POST, "/things", &headers, body.as_bytes());
    let new = NewRecord {
        scope: names::scope("default"),
        key: names::key(key),
        fingerprint: &fingerprint,
        method: "POST",
        path: "/things",
        token: LeaseToken::new(),
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
        transactional: false,
    };
    let Claim::Acquired(lease) = store.claim(&new).await.unwrap() else {
        panic!("{key} was already claimed");
    };
    let mut response_headers = HeaderMap::new();
    response_headers.insert("content-type", HeaderValue::from_static("text/plain"));
    let planted = StoredResponse {
        status: StatusCode::CREATED,
        headers: response_headers,
        body: Some(Bytes::from_static(b"planted in clear")),
    };
    store.complete(&lease, &planted).await.unwrap();
}

/// The `require_sealed` switch by configuration (`StoreOptions`, as the
/// example app, the consumers and the gateway build it): on by default, a
/// record planted in clear in the PostgreSQL behind the encrypted store is
/// refused (503, the handler not run); turned off, it is replayed. Counted
/// in `idempotency_unsealed_reads_total{refused}` either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_options_on_postgres_require_sealed_records_by_default_and_can_allow_clear_ones() {
    use idempotency_guard::IdempotencyLayer;
    use idempotency_guard::store::encrypted::UNSEALED_READS_TOTAL;
    use idempotency_guard::store::{AnyStore, StoreOptions};

    crate::metrics_probe::install();
    let database = idempotency_tests::postgres_database().await;
    let mut options = StoreOptions::sql(&database.url);
    assert!(options.require_sealed, "strict by default");
    let plain = AnyStore::open(&options).await.unwrap();
    plain.migrate().await.unwrap();
    let body = r#"{"amount":7}"#;
    plant_in_clear(&plain, "planted", body).await;
    let keys = keys(KEY_A);
    options.encryption = Some(&keys);

    let strict = AnyStore::open(&options).await.unwrap();
    assert_eq!(strict.requires_sealed(), Some(true));
    let refused = || crate::metrics_probe::counter(UNSEALED_READS_TOTAL, &[("refused", "true")]);
    let allowed = || crate::metrics_probe::counter(UNSEALED_READS_TOTAL, &[("refused", "false")]);
    let before = refused();
    let (router, runs) = crate::support::app(IdempotencyLayer::new(strict));
    let answer = crate::support::send(&router, "planted", body).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.problem(), "store-unavailable");
    assert_eq!(runs.get(), 0, "neither replayed nor run");
    assert!(refused() > before, "the refused read is counted");
    // The refusal frees nothing: asked again, the same answer, still not run.
    let again = crate::support::send(&router, "planted", body).await;
    assert_eq!(again.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(runs.get(), 0);

    options.require_sealed = false;
    let lenient = AnyStore::open(&options).await.unwrap();
    assert_eq!(lenient.requires_sealed(), Some(false));
    let before = allowed();
    let (router, runs) = crate::support::app(IdempotencyLayer::new(lenient));
    let answer = crate::support::send(&router, "planted", body).await;
    assert_eq!(answer.status, StatusCode::CREATED);
    assert_eq!(answer.body.as_ref(), b"planted in clear");
    assert_eq!(answer.header("idempotent-replayed"), Some("true"));
    assert_eq!(runs.get(), 0);
    assert!(allowed() > before, "the allowed read is counted too");
    // A key the guard stores itself is sealed, and reads under either setting.
    let fresh = crate::support::send(&router, "fresh", body).await;
    assert_eq!(fresh.status, StatusCode::CREATED);
    assert_eq!(runs.get(), 1);
    let (strict_again, _) = crate::support::app(IdempotencyLayer::new(
        AnyStore::open(&StoreOptions {
            require_sealed: true,
            ..options
        })
        .await
        .unwrap(),
    ));
    let replay = crate::support::send(&strict_again, "fresh", body).await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.body, fresh.body);
}

/// `AnyStore::with_encryption` over a store in clear refuses a record
/// planted in clear, as `AnyStore::open` does by default (fails when it
/// leaves `require_sealed` off: the planted record would be replayed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_encryption_requires_sealed_records_by_default() {
    use idempotency_guard::IdempotencyLayer;
    use idempotency_guard::store::AnyStore;
    use idempotency_guard::store::sqlite::SqliteStore;

    let plain = AnyStore::from(SqliteStore::memory().await.unwrap());
    assert_eq!(plain.requires_sealed(), None, "a store in clear");
    let body = r#"{"amount":7}"#;
    plant_in_clear(&plain, "planted", body).await;

    let sealed = plain.with_encryption(keys(KEY_A));
    assert_eq!(sealed.requires_sealed(), Some(true));
    let (router, runs) = crate::support::app(IdempotencyLayer::new(sealed.clone()));
    let answer = crate::support::send(&router, "planted", body).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.problem(), "store-unavailable");
    assert_eq!(runs.get(), 0, "neither replayed nor run");

    // Told to, it replays the records stored in clear.
    let lenient = sealed.with_require_sealed(false);
    assert_eq!(lenient.requires_sealed(), Some(false));
    let (router, runs) = crate::support::app(IdempotencyLayer::new(lenient));
    let answer = crate::support::send(&router, "planted", body).await;
    assert_eq!(answer.status, StatusCode::CREATED);
    assert_eq!(runs.get(), 0);
}
