//! The snippets of the READMEs and the guide's main pages (`docs/guide/`),
//! compiled as a user compiles them: outside the workspace, with the
//! guard's and the client's default features only. Each snippet sits
//! between a `// README: <file>, "<section>"` line and a `// README: end`
//! line, verbatim (less the indentation): the workspace's `tests/readme.rs`
//! fails when a page's block and this copy differ.

use axum::http::{StatusCode, request::Parts};
use idempotency_guard::store::AnyStore;

/// The handler the mount snippet names.
async fn create_payment(body: String) -> (StatusCode, String) {
    (StatusCode::CREATED, body)
}

/// The scope function the mount snippet names: the `X-Tenant` header.
fn tenant_of(parts: &Parts) -> String {
    parts
        .headers
        .get("x-tenant")
        .and_then(|value| value.to_str().ok())
        .unwrap_or("default")
        .to_owned()
}

/// docs/guide/axum.md, "Mount the guard": an SQLite file `app.db` in the working
/// directory, and the guarded router.
///
/// # Errors
///
/// When the store cannot be opened or migrated.
pub async fn mount() -> Result<axum::Router, Box<dyn std::error::Error>> {
    // README: docs/guide/axum.md, "Mount the guard"
    use axum::{Router, routing::post};
    use idempotency_guard::{IdempotencyLayer, store::AnyStore};

    let store = AnyStore::connect("sqlite://app.db").await?; // or postgres://… (feature `postgres`)
    store.migrate().await?;
    let app = Router::new()
        .route("/payments", post(create_payment))
        .route_layer(IdempotencyLayer::new(store).with_scope(|parts| tenant_of(parts)));
    // README: end
    Ok(app)
}

/// client/README.md: one payment through the retry client, `api` the
/// guarded API's base URL and `status_url` the key-status service's.
///
/// # Errors
///
/// When the call fails after the retries the policy allows.
pub async fn pay(
    api: &str,
    status_url: &str,
) -> Result<reqwest::Response, idempotency_client::RetryError> {
    // README: client/README.md, "idempotency-client"
    use idempotency_client::{Policy, RetryClient, StatusClient};

    let client = RetryClient::new(reqwest::Client::new())
        // Declare the endpoints behind the guard: only their writes get a key.
        .with_endpoint("create-payment", Policy::guarded_write())
        .with_status_client(StatusClient::new(status_url, "token-of-tenant-a"));
    let payment = serde_json::json!({"amount": 4200, "currency": "EUR"});
    let response = client
        .send("create-payment", |http| {
            http.post(format!("{api}/payments")).json(&payment)
        })
        .await?;
    // README: end
    Ok(response)
}

/// docs/guide/client.md, "Calling a guarded API safely": the same payment
/// with the page's fixed URLs (`http://api`, `http://status:8080`), so it
/// is compiled, not run.
///
/// # Errors
///
/// When the call fails after the retries the policy allows.
pub async fn pay_guide() -> Result<reqwest::Response, idempotency_client::RetryError> {
    // README: docs/guide/client.md, "Calling a guarded API safely"
    use idempotency_client::{Policy, RetryClient, StatusClient};

    let client = RetryClient::new(reqwest::Client::new())
        // Only endpoints declared guarded get keys (and retries of ambiguous failures).
        .with_endpoint("create-payment", Policy::guarded_write())
        .with_status_client(StatusClient::new("http://status:8080", "token-of-tenant-a"));
    let payment = serde_json::json!({"amount": 4200, "currency": "EUR"});
    // One logical write: one Idempotency-Key (a UUID v7), sent with every attempt;
    // the closure rebuilds the request for each attempt.
    let response = client
        .send("create-payment", |http| {
            http.post("http://api/payments").json(&payment)
        })
        .await?; // RetryError::kind(): budget exhausted, deadline, outcome unknown, ...
    // README: end
    Ok(response)
}

/// What the engine snippet's work returns.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    /// The amount charged.
    pub charged: u64,
}

/// The work the engine snippet runs once.
async fn charge(payload: &[u8]) -> Receipt {
    Receipt {
        charged: payload.len() as u64,
    }
}

/// docs/guide/engine.md, "Beyond axum: the run-once engine": one message's work, run
/// at most once per message id.
///
/// # Errors
///
/// When the id is not a valid key, or the engine refuses to run the work
/// (see `idempotency_guard::engine::Refusal`).
pub async fn consume(
    store: AnyStore,
    message_id: &str,
    payload: Vec<u8>,
) -> Result<Receipt, Box<dyn std::error::Error + Send + Sync>> {
    // README: docs/guide/engine.md, "Beyond axum: the run-once engine"
    use idempotency_guard::engine::{Engine, Job};
    use idempotency_guard::{Fingerprint, Scope};

    let engine = Engine::new(store);
    let fingerprint = Fingerprint::of_bytes(&payload);
    let job = Job::new(
        Scope::new("orders-queue")?,
        message_id.parse()?,
        fingerprint,
    );
    // `?` takes a refusal (key reused, in flight, store down, ...) as an error.
    let receipt: Receipt = engine
        .run_json(job, |_run| async move { charge(&payload).await })
        .await?;
    // README: end
    Ok(receipt)
}
