//! The scope from a verified JWT: the same key in two tenants is two
//! records; a request without a verifiable token gets 401 and stores
//! nothing.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{EncodingKey, Header};

use crate::support::{pay, stack};

const SECRET: &str = "a-test-secret-of-32-bytes-000000";
const CONFIG: &str = r#"
[[routes]]
path = "/payments"
[scope]
from = "jwt"
jwt_algorithm = "HS256"
jwt_secret_env = "GATEWAY_TEST_JWT_SECRET"
"#;

fn token(secret: &str, sub: Option<&str>, expires_in: i64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64;
    let mut claims = serde_json::json!({ "exp": now + expires_in });
    if let Some(sub) = sub {
        claims["sub"] = sub.into();
    }
    jsonwebtoken::encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .expect("a token")
}

/// A token valid for an hour that starts being valid in an hour (`nbf`).
fn not_yet_valid(secret: &str) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64;
    let claims = serde_json::json!({ "sub": "tenant-alice", "nbf": now + 3600, "exp": now + 7200 });
    jsonwebtoken::encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .expect("a token")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_scopes_keep_tenants_apart_and_refuse_requests_without_a_scope() {
    let stack = stack(CONFIG, &[("GATEWAY_TEST_JWT_SECRET", SECRET)]).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("an HTTP client");
    let url = stack.url("/payments");
    let body = r#"{"amount":42}"#;
    let send = |bearer: Option<String>, key: &'static str| {
        let mut request = pay(&http, &url, key, body);
        if let Some(bearer) = bearer {
            request = request.header("authorization", format!("Bearer {bearer}"));
        }
        request.send()
    };

    let alice = token(SECRET, Some("tenant-alice"), 3600);
    let bob = token(SECRET, Some("tenant-bob"), 3600);
    let first = send(Some(alice.clone()), "same-key")
        .await
        .expect("an answer");
    assert_eq!(first.status(), 201);
    let other = send(Some(bob), "same-key").await.expect("an answer");
    assert_eq!(other.status(), 201);
    assert!(
        !other.headers().contains_key("idempotent-replayed"),
        "bob's own run"
    );
    let replay = send(Some(alice), "same-key").await.expect("an answer");
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(stack.executions("/payments").await, 2, "one run per tenant");

    let refused = [
        ("no token", None),
        (
            "wrong signature",
            Some(token(
                "another-secret-of-32-bytes-00000",
                Some("tenant-alice"),
                3600,
            )),
        ),
        ("expired", Some(token(SECRET, Some("tenant-alice"), -3600))),
        (
            "not valid before an hour from now",
            Some(not_yet_valid(SECRET)),
        ),
        ("no sub", Some(token(SECRET, None, 3600))),
        ("not a JWT", Some("garbage".to_owned())),
    ];
    for (name, bearer) in refused {
        let answer = send(bearer, "refused-key").await.expect("an answer");
        assert_eq!(answer.status(), 401, "{name}");
        assert_eq!(
            answer.headers()["content-type"],
            "application/problem+json",
            "{name}"
        );
        let json: serde_json::Value = answer.json().await.expect("a problem");
        assert_eq!(json["type"], "urn:idempotency:unauthorized", "{name}");
    }
    assert_eq!(
        stack.executions("/payments").await,
        2,
        "no refused request ran"
    );
    let records: Vec<(String, String)> = stack
        .records()
        .await
        .into_iter()
        .map(|(scope, key, _)| (scope, key))
        .collect();
    assert_eq!(
        records,
        [
            ("tenant-alice".to_owned(), "same-key".to_owned()),
            ("tenant-bob".to_owned(), "same-key".to_owned())
        ],
        "two records for one key in two tenants, none for refused requests"
    );
}
