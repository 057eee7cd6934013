//! The gateway on every store `AnyStore::open` offers (SQLite is the
//! default of the other tests): a payment runs once, its retry is a
//! replay, the same key with another body is refused.

use std::time::Duration;

use idempotency_tests::names;

use crate::support::{pay, stack};

const ROUTES: &str = "[[routes]]\npath = \"/payments\"\n";

/// The configuration for a Redis store under `redis`'s prefix, whose keys
/// are deleted when `redis` is dropped (the test leaves nothing behind).
fn under_prefix<S>(redis: &idempotency_tests::TestDb<S>) -> String {
    let prefix = redis.redis_prefix().expect("a Redis fixture");
    format!("redis_prefix = \"{prefix}\"\n{ROUTES}")
}

/// Runs a payment once, replays it, refuses another body under its key;
/// returns the key and the first answer's body.
async fn once_then_replay(config: &str, env: &[(&str, &str)]) -> (String, bytes::Bytes) {
    let stack = stack(config, env).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("an HTTP client");
    let ready = http.get(stack.url("/readyz")).send().await.expect("readyz");
    assert_eq!(ready.status(), 200, "store and upstream answer");
    let key = uuid::Uuid::new_v4().to_string();
    let url = stack.url("/payments");
    let first = pay(&http, &url, &key, r#"{"amount":5}"#)
        .send()
        .await
        .expect("an answer");
    assert_eq!(first.status(), 201);
    assert!(!first.headers().contains_key("idempotent-replayed"));
    let first_body = first.bytes().await.expect("a body");
    let again = pay(&http, &url, &key, r#"{ "amount": 5 }"#)
        .send()
        .await
        .expect("an answer");
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(
        again.bytes().await.expect("a body"),
        first_body,
        "byte for byte"
    );
    let other = pay(&http, &url, &key, r#"{"amount":6}"#)
        .send()
        .await
        .expect("an answer");
    assert_eq!(other.status(), 409);
    assert!(
        other
            .text()
            .await
            .unwrap_or_default()
            .contains("key-reused")
    );
    assert_eq!(stack.executions("/payments").await, 1);
    (key, first_body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres() {
    let database = idempotency_tests::postgres_database().await;
    once_then_replay(ROUTES, &[("DATABASE_URL", database.url.as_str())]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis() {
    let redis = idempotency_tests::redis().await; // fails with what to start when Redis is down
    let url = idempotency_tests::fixtures::redis_url();
    once_then_replay(
        &under_prefix(&redis),
        &[("STORE_KIND", "redis"), ("REDIS_URL", url.as_str())],
    )
    .await;
}

/// Encryption at rest by configuration (`IDEMPOTENCY_ENCRYPTION_KEYS`):
/// the gateway replays as before, and what Redis holds is sealed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_with_encryption_at_rest() {
    use idempotency_guard::Store as _;
    use idempotency_guard::store::{AnyStore, StoreKind, StoreOptions};

    let redis = idempotency_tests::redis().await;
    let url = idempotency_tests::fixtures::redis_url();
    let (key, first_body) = once_then_replay(
        &under_prefix(&redis),
        &[
            ("STORE_KIND", "redis"),
            ("REDIS_URL", url.as_str()),
            (
                "IDEMPOTENCY_ENCRYPTION_KEYS",
                "k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
            ),
        ],
    )
    .await;
    // Read the record without the key: sealed, no plaintext of the body.
    let mut options = StoreOptions::sql("");
    options.kind = StoreKind::Redis;
    options.redis_url = Some(&url);
    options.redis_prefix = redis.redis_prefix().expect("a Redis fixture");
    let plain = AnyStore::open(&options).await.expect("Redis");
    let record = plain
        .get(names::scope("default"), names::key(&key))
        .await
        .expect("a read")
        .expect("the record");
    let response = record.response.expect("a stored response");
    assert_eq!(
        response.headers[&idempotency_guard::store::encrypted::SEALED],
        "v1 k1"
    );
    let stored = response.body.expect("a sealed body");
    assert!(!first_body.is_empty());
    assert!(
        !stored
            .windows(first_body.len())
            .any(|window| window == first_body.as_ref()),
        "the body is stored in clear"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_cluster() {
    let cluster = idempotency_tests::redis_cluster().await;
    let urls = idempotency_tests::fixtures::redis_cluster_urls().join(",");
    once_then_replay(
        &under_prefix(&cluster),
        &[("STORE_KIND", "redis"), ("REDIS_URL", urls.as_str())],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_tiered_store() {
    let redis = idempotency_tests::redis().await;
    let database = idempotency_tests::postgres_database().await;
    let url = idempotency_tests::fixtures::redis_url();
    once_then_replay(
        &under_prefix(&redis),
        &[
            ("STORE_KIND", "tiered"),
            ("DATABASE_URL", database.url.as_str()),
            ("REDIS_URL", url.as_str()),
        ],
    )
    .await;
}

/// NATS JetStream (`STORE_KIND=nats`) on a fresh bucket of the test
/// process's NATS 2.15 server, deleted with the fixture.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_nats() {
    use idempotency_guard::Store as _;

    let nats = idempotency_tests::nats().await;
    let url = tokio::task::spawn_blocking(idempotency_tests::nats_server::nats_store_url)
        .await
        .expect("the NATS server");
    let config = format!("nats_bucket = \"{}\"\n{ROUTES}", nats.store.bucket());
    let (key, first_body) = once_then_replay(
        &config,
        &[("STORE_KIND", "nats"), ("NATS_URL", url.as_str())],
    )
    .await;
    // The gateway wrote the test's bucket: the record is there, completed.
    let record = nats
        .store
        .get(names::scope("default"), names::key(&key))
        .await
        .expect("a read")
        .expect("the gateway's record in the test's bucket");
    assert_eq!(
        record.response.expect("a stored response").body,
        Some(first_body)
    );
}

/// Plants a completed record in clear for `POST /payments` with `body`
/// under `key` in the store at `url`, as whoever can write the store could.
async fn plant_in_clear(url: &str, key: &str, body: &str) {
    use idempotency_guard::store::{AnyStore, Claim, LeaseToken, NewRecord};
    use idempotency_guard::{Fingerprint, Store as _, StoredResponse};

    let store = AnyStore::connect(url).await.expect("the gateway's store");
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    let fingerprint =
        Fingerprint::of_request(&http::Method::POST, "/payments", &headers, body.as_bytes());
    let new = NewRecord {
        scope: names::scope("default"),
        key: names::key(key),
        fingerprint: &fingerprint,
        method: "POST",
        path: "/payments",
        token: LeaseToken::new(),
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
        transactional: false,
    };
    let Claim::Acquired(lease) = store.claim(&new).await.expect("a claim") else {
        panic!("{key} was already claimed");
    };
    let mut response_headers = http::HeaderMap::new();
    response_headers.insert("content-type", http::HeaderValue::from_static("text/plain"));
    let planted = StoredResponse {
        status: http::StatusCode::CREATED,
        headers: response_headers,
        body: Some(bytes::Bytes::from_static(b"planted in clear")),
    };
    store.complete(&lease, &planted).await.expect("completed");
}

/// A configuration, its environment, and whether unsealed records are refused.
type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], bool);

/// The gateway's `require_sealed`: with encryption at rest configured, a
/// record planted in clear in its store is refused (503, not forwarded) by
/// default; `require_sealed = false` in the TOML, or
/// `IDEMPOTENCY_REQUIRE_SEALED=false`, replays it. Counted on `/metrics`
/// either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_planted_in_clear_is_refused_unless_require_sealed_is_off() {
    const KEYS: &str = "k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("an HTTP client");
    let body = r#"{"amount":9}"#;
    let cases: [Case<'_>; 4] = [
        (ROUTES, &[("IDEMPOTENCY_ENCRYPTION_KEYS", KEYS)], true),
        (
            "require_sealed = true\n[[routes]]\npath = \"/payments\"\n",
            &[("IDEMPOTENCY_ENCRYPTION_KEYS", KEYS)],
            true,
        ),
        (
            "require_sealed = false\n[[routes]]\npath = \"/payments\"\n",
            &[("IDEMPOTENCY_ENCRYPTION_KEYS", KEYS)],
            false,
        ),
        (
            ROUTES,
            &[
                ("IDEMPOTENCY_ENCRYPTION_KEYS", KEYS),
                ("IDEMPOTENCY_REQUIRE_SEALED", "false"),
            ],
            false,
        ),
    ];
    for (config, env, strict) in cases {
        let stack = stack(config, env).await;
        let key = uuid::Uuid::new_v4().to_string();
        plant_in_clear(&stack.store_url, &key, body).await;
        let answer = pay(&http, &stack.url("/payments"), &key, body)
            .send()
            .await
            .expect("an answer");
        let status = answer.status();
        let replayed = answer.headers().contains_key("idempotent-replayed");
        let text = answer.text().await.expect("a body");
        if strict {
            assert_eq!(status, 503, "{config} {env:?}: {text}");
            assert!(text.contains("store-unavailable"), "{text}");
        } else {
            assert_eq!(status, 201, "{config} {env:?}: {text}");
            assert!(replayed, "replayed");
            assert_eq!(text, "planted in clear");
        }
        assert_eq!(stack.executions("/payments").await, 0, "never forwarded");
        let metrics = reqwest::get(stack.url("/metrics"))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text");
        let series = format!("idempotency_unsealed_reads_total{{refused=\"{strict}\"}}");
        assert!(
            metrics.lines().any(|line| line.starts_with(&series)),
            "{series} on /metrics"
        );
    }
}
