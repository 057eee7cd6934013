//! The payments example's `IDEMPOTENCY_REQUIRE_SEALED`: with encryption at
//! rest on, a record planted in clear in its database is refused by
//! default and replayed only when the switch is off; counted on `/metrics`
//! either way.

use std::time::Duration;

use idempotency_guard::store::{AnyStore, Claim, LeaseToken, NewRecord};
use idempotency_guard::{Fingerprint, Store as _, StoredResponse};
use idempotency_tests::programs::{self, Program};
use idempotency_tests::{Process, names};

const KEYS: &str = "k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const PAYMENT: &str = r#"{"amount":42,"currency":"EUR"}"#;

/// Completes `key` for `POST /payments` with [`PAYMENT`] in the store at
/// `url`, its response in clear, as whoever can write the database could.
async fn plant_in_clear(url: &str, key: &str) {
    let store = AnyStore::connect(url).await.unwrap();
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    let fingerprint = Fingerprint::of_request(
        &http::Method::POST,
        "/payments",
        &headers,
        PAYMENT.as_bytes(),
    );
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
    let Claim::Acquired(lease) = store.claim(&new).await.unwrap() else {
        panic!("{key} was already claimed");
    };
    let mut response_headers = http::HeaderMap::new();
    response_headers.insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    let planted = StoredResponse {
        status: http::StatusCode::CREATED,
        headers: response_headers,
        body: Some(bytes::Bytes::from_static(br#"{"planted":true}"#)),
    };
    store.complete(&lease, &planted).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_payments_example_refuses_a_record_planted_in_clear_unless_told_otherwise() {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    for switch in [None, Some("true"), Some("false")] {
        let dir = tempfile::tempdir().unwrap();
        let url = format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("payments.db").display()
        );
        let mut env = vec![
            ("DATABASE_URL", url.as_str()),
            ("IDEMPOTENCY_ENCRYPTION_KEYS", KEYS),
        ];
        if let Some(value) = switch {
            env.push(("IDEMPOTENCY_REQUIRE_SEALED", value));
        }
        let app = Process::start(&programs::path(Program::Payments), &env, "/metrics").await;
        let key = format!("planted-{}", uuid::Uuid::new_v4().simple());
        plant_in_clear(&url, &key).await;
        let answer = http
            .post(format!("http://{}/payments", app.address))
            .header("content-type", "application/json")
            .header("idempotency-key", &key)
            .body(PAYMENT)
            .send()
            .await
            .unwrap();
        let status = answer.status();
        let replayed = answer.headers().contains_key("idempotent-replayed");
        let text = answer.text().await.unwrap();
        let strict = switch != Some("false");
        if strict {
            assert_eq!(status, 503, "{switch:?}: {text}");
            assert!(text.contains("store-unavailable"), "{text}");
        } else {
            assert_eq!(status, 201, "{switch:?}: {text}");
            assert!(replayed);
            assert_eq!(text, r#"{"planted":true}"#);
        }
        let metrics = http
            .get(format!("http://{}/metrics", app.address))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let series = format!("idempotency_unsealed_reads_total{{refused=\"{strict}\"}}");
        assert!(
            metrics.lines().any(|line| line.starts_with(&series)),
            "{series} on /metrics"
        );
        let payments = sqlx::SqlitePool::connect(&url).await.unwrap();
        let count: i64 = sqlx::query_scalar("select count(*) from payments")
            .fetch_one(&payments)
            .await
            .unwrap();
        payments.close().await;
        assert_eq!(count, 0, "{switch:?}: no payment ran");
    }
}
