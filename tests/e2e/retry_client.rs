//! The retry client against real servers: the payments example and the
//! key-status service as processes on one SQLite file, in-process upstreams
//! on real sockets, and the fault-injecting proxy.
//!
//! The figures of `docs/retry-client.md` come from the default client
//! (`RetryClient::new`, with `Policy::guarded_write()` declared where a
//! write is guarded); a test that changes a setting says so, and why
//! (millisecond backoff where the figure is not about timing, so that a
//! thousand calls take seconds).
//!
//! The figures are printed:
//! `cargo test -p idempotency-tests --test e2e retry_client -- --nocapture`.

use idempotency_tests::programs::{self, Program};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use idempotency_client::{
    Backoff, CircuitBreaker, ErrorKind, Failure, Jitter, Kind, Policy, RetryBudget, RetryClient,
    RetryError, StatusClient,
};
use idempotency_tests::{Faults, FaultyProxy, Process};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::{Value, json};

const MS: Duration = Duration::from_millis(1);
const TOKEN: &str = "token-of-tenant-acme-0123456789";

// ---------------------------------------------------------------------------
// Fixtures

/// The client-side metrics of this test binary (one recorder per process;
/// each test uses endpoint names of its own).
fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .install_recorder()
            .expect("the only metrics recorder of this test binary")
    })
}

/// The sum of a metric's series in Prometheus text whose labels include all
/// of `labels`.
fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(&format!("{name}{{")))
        .filter(|line| {
            labels
                .iter()
                .all(|(k, v)| line.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn client_metric(name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_sum(&recorder().render(), name, labels)
}

/// A budget that never refuses, for tests about something else.
fn unlimited() -> RetryBudget {
    RetryBudget::new(1000.0).with_cap(1e9).with_initial(1000.0)
}

/// A budget with room for a few retries from the first call.
fn generous() -> RetryBudget {
    RetryBudget::new(1.0).with_initial(10.0)
}

/// Guarded writes with millisecond pauses and three attempts (not the
/// defaults: the budget stories below count three attempts a call).
fn fast_writes() -> Policy {
    Policy::guarded_write()
        .with_backoff(Backoff::new(10 * MS).with_cap(50 * MS))
        .with_deadline(Duration::from_secs(3))
        .with_attempt_timeout(Duration::from_secs(1))
        .with_max_attempts(3)
}

/// Reads with millisecond pauses and three attempts (not the defaults).
fn fast_reads() -> Policy {
    Policy::new(Kind::Read)
        .with_backoff(Backoff::new(5 * MS).with_cap(20 * MS))
        .with_deadline(Duration::from_secs(3))
        .with_attempt_timeout(Duration::from_secs(1))
        .with_max_attempts(3)
}

/// A client that opens a connection per request (for the proxy).
fn unpooled() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

fn payment(amount: i64) -> Value {
    json!({"amount": amount, "currency": "EUR"})
}

/// One request an in-process upstream received.
#[derive(Debug, Clone)]
struct Hit {
    at: Instant,
    wall: SystemTime,
    attempt: Option<u32>,
    key: Option<String>,
    body: Bytes,
}

type Answerer = Arc<dyn Fn(u64, &Hit) -> Response + Send + Sync>;

#[derive(Clone)]
struct UpstreamState {
    count: Arc<AtomicU64>,
    hits: Arc<Mutex<Vec<Hit>>>,
    answer: Answerer,
    /// When set, first tries (`X-Retry-Attempt: 0`) are held until this
    /// many have arrived, then all answered at once.
    first_tries: Option<Arc<tokio::sync::Barrier>>,
}

/// An axum server on a real loopback socket that answers the `n`-th
/// request by a function and records every request.
struct Upstream {
    address: SocketAddr,
    state: UpstreamState,
    server: tokio::task::JoinHandle<()>,
}

impl Upstream {
    async fn start(answer: impl Fn(u64, &Hit) -> Response + Send + Sync + 'static) -> Self {
        Self::start_holding(0, answer).await
    }

    /// Like [`Upstream::start`], holding the first tries until `clients`
    /// of them have arrived (none when 0).
    async fn start_holding(
        clients: usize,
        answer: impl Fn(u64, &Hit) -> Response + Send + Sync + 'static,
    ) -> Self {
        let state = UpstreamState {
            count: Arc::new(AtomicU64::new(0)),
            hits: Arc::new(Mutex::new(Vec::new())),
            answer: Arc::new(answer),
            first_tries: (clients > 0).then(|| Arc::new(tokio::sync::Barrier::new(clients))),
        };
        let app = Router::new().fallback(record).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            address,
            state,
            server,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    fn requests(&self) -> u64 {
        self.state.count.load(Ordering::SeqCst)
    }

    fn hits(&self) -> Vec<Hit> {
        self.state.hits.lock().unwrap().clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn record(State(state): State<UpstreamState>, headers: HeaderMap, body: Bytes) -> Response {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let hit = Hit {
        at: Instant::now(),
        wall: SystemTime::now(),
        attempt: text("x-retry-attempt").and_then(|v| v.parse().ok()),
        key: text("idempotency-key"),
        body,
    };
    let n = state.count.fetch_add(1, Ordering::SeqCst);
    if let (Some(first_tries), Some(0)) = (&state.first_tries, hit.attempt) {
        first_tries.wait().await;
    }
    let response = (state.answer)(n, &hit);
    state.hits.lock().unwrap().push(hit);
    response
}

fn status(code: u16) -> Response {
    StatusCode::from_u16(code).unwrap().into_response()
}

/// The payments example (and, when asked, the status service) on a fresh
/// SQLite file.
struct Stack {
    app: Option<Process>,
    app_address: SocketAddr,
    app_env: Vec<(String, String)>,
    service: Option<Process>,
    database_url: String,
    _dir: tempfile::TempDir,
}

impl Stack {
    async fn start(app_env: &[(&str, &str)], with_service: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let database_url = format!("sqlite://{}", dir.path().join("payments.db").display());
        let mut env: Vec<(String, String)> = vec![("DATABASE_URL".into(), database_url.clone())];
        env.extend(
            app_env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let app =
            Process::start(&programs::path(Program::Payments), &pairs(&env), "/metrics").await;
        let service = if with_service {
            let tokens = format!("acme {TOKEN}");
            let env = [
                ("DATABASE_URL", database_url.as_str()),
                ("TOKENS", tokens.as_str()),
                ("MIGRATE_ON_START", "false"),
            ];
            Some(Process::start(&programs::path(Program::StatusService), &env, "/readyz").await)
        } else {
            None
        };
        Self {
            app_address: app.address,
            app: Some(app),
            app_env: env,
            service,
            database_url,
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/payments", self.app_address)
    }

    fn status_client(&self) -> StatusClient {
        let service = self.service.as_ref().expect("started with the service");
        StatusClient::new(format!("http://{}", service.address), TOKEN)
    }

    async fn db(&self) -> sqlx::SqlitePool {
        sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect(&self.database_url)
            .await
            .unwrap()
    }

    /// Payments made so far.
    async fn payments(&self) -> i64 {
        let db = self.db().await;
        let (count,): (i64,) = sqlx::query_as("select count(*) from payments")
            .fetch_one(&db)
            .await
            .unwrap();
        db.close().await;
        count
    }

    /// Waits (at most 10 s) until there are at least `n` payments, and
    /// returns how many there are.
    async fn wait_for_payments(&self, n: i64) -> i64 {
        for _ in 0..200 {
            let count = self.payments().await;
            if count >= n {
                return count;
            }
            tokio::time::sleep(50 * MS).await;
        }
        panic!("fewer than {n} payments after 10 s");
    }

    /// The app's guard metrics: `idempotency_requests_total` on
    /// `/payments` with these labels.
    async fn guard_requests(&self, labels: &[(&str, &str)]) -> f64 {
        let text = reqwest::get(format!("http://{}/metrics", self.app_address))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let mut labels = labels.to_vec();
        labels.push(("route", "/payments"));
        metric_sum(&text, "idempotency_requests_total", &labels)
    }

    async fn kill_app(&mut self) {
        self.app.take().expect("the app runs").kill().await;
    }

    async fn restart_app(&mut self) {
        let app = Process::start_at(
            &programs::path(Program::Payments),
            self.app_address,
            &pairs(&self.app_env),
            "/metrics",
        )
        .await;
        self.app = Some(app);
    }
}

fn pairs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// Asks the status service until `done` holds for a key's advice (at most
/// 10 s).
async fn wait_for_advice(status: &StatusClient, key: &str, done: impl Fn(Option<&str>) -> bool) {
    for _ in 0..200 {
        let details = status.details(key, None).await.unwrap();
        let advice = details.map(|d| serde_json::to_value(d.advice).unwrap());
        if done(advice.as_ref().and_then(Value::as_str)) {
            return;
        }
        tokio::time::sleep(50 * MS).await;
    }
    panic!("the key {key} never reached the expected state");
}

// ---------------------------------------------------------------------------
// The five classic mistakes

/// Mistake 1: an endless retry loop on a permanent 500. Ours stops at the
/// budget (thirty calls make at most three retries) and at the deadline
/// (with an unlimited budget); the app's executions are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_500_stops_at_the_budget_and_at_the_deadline() {
    // The app logs every failed payment: quiet, they are expected here.
    let stack = Stack::start(&[("RUST_LOG", "off")], false).await;
    // Every payment now fails inside the handler: 500, and the guard
    // releases the key, so each attempt is one more execution.
    let db = stack.db().await;
    sqlx::query(
        "create trigger payments_down before insert on payments \
         begin select raise(abort, 'payments are down'); end",
    )
    .execute(&db)
    .await
    .unwrap();
    db.close().await;
    let url = stack.url();

    // The default budget (a tenth of a retry per call, full at start: 10);
    // millisecond pauses, which the budget does not depend on.
    let client = RetryClient::new(reqwest::Client::new()).with_write_policy(fast_writes());
    let mut attempts = 0;
    for i in 0..30 {
        let error = client
            .send("permanent-500", |http| {
                http.post(&url).json(&payment(100 + i))
            })
            .await
            .unwrap_err();
        // The first five calls spend the start allowance and their three
        // attempts; from then on the budget stops them.
        let expected = if i < 5 {
            ErrorKind::AttemptsExhausted
        } else {
            ErrorKind::BudgetExhausted
        };
        assert_eq!(error.kind(), expected, "call {i}: {error}");
        assert!(
            matches!(error.last(), Some(Failure::Answer(r)) if r.status() == 500),
            "the last failure is the 500: {:?}",
            error.last()
        );
        assert!(!error.may_have_run(), "a 500 released the key");
        attempts += error.attempts();
    }
    let executions = stack.guard_requests(&[("outcome", "released")]).await;
    assert_eq!(executions, f64::from(attempts), "every attempt ran once");
    // The start allowance (10) buys the first five calls two retries each;
    // then one call in ten retries (calls 11 and 21): 12 ≤ 0.1 × 30 + 10.
    assert_eq!(attempts, 42, "30 calls and the 12 retries the budget buys");
    // The retries were numbered.
    assert_eq!(
        stack
            .guard_requests(&[("outcome", "released"), ("attempt", "1")])
            .await,
        7.0
    );

    // An unlimited budget: the deadline stops it.
    let deadline = 500 * MS;
    let patient = RetryClient::new(reqwest::Client::new())
        .with_budget(unlimited())
        .with_write_policy(
            fast_writes()
                .with_budget(unlimited())
                .with_max_attempts(u32::MAX)
                .with_deadline(deadline)
                .with_attempt_timeout(100 * MS),
        );
    let started = Instant::now();
    let error = patient
        .send("permanent-500-deadline", |http| {
            http.post(&url).json(&payment(7))
        })
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    assert_eq!(error.kind(), ErrorKind::DeadlineExceeded, "{error}");
    assert!(error.attempts() >= 2, "it did retry: {}", error.attempts());
    // No attempt started without room for it: the call ended within its
    // deadline (plus scheduling slack).
    assert!(elapsed < deadline + 500 * MS, "took {elapsed:?}");
    // Every attempt that reached the handler ran once and released its key.
    // The last attempt may have been cut by the deadline: then the server
    // may still be finishing it (wait for it), or it may never have reached
    // the handler at all (a slow machine), but it never ran twice.
    let attempts = f64::from(error.attempts());
    let cut = matches!(error.last(), Some(Failure::Transport(_)));
    let mut ran = 0.0;
    for _ in 0..50 {
        ran = stack.guard_requests(&[("outcome", "released")]).await - executions;
        if ran == attempts {
            break;
        }
        tokio::time::sleep(100 * MS).await;
    }
    assert!(
        ran == attempts || (cut && ran == attempts - 1.0),
        "{ran} executions for {attempts} attempts (last failure: {:?})",
        error.last()
    );
    assert_eq!(stack.payments().await, 0);
}

/// Mistake 2: ignoring `Retry-After` on 429. Ours waits at least what it
/// says (seconds or a date), at least 500 ms, and not at all without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_waits_at_least_its_retry_after_and_at_least_500_ms() {
    async fn throttled_once(
        retry_after: Option<String>,
    ) -> (
        Result<reqwest::Response, idempotency_client::RetryError>,
        Vec<Hit>,
    ) {
        let upstream = Upstream::start(move |n, _| {
            let mut response = status(if n == 0 { 429 } else { 200 });
            if let (0, Some(value)) = (n, &retry_after) {
                response
                    .headers_mut()
                    .insert("retry-after", value.parse().unwrap());
            }
            response
        })
        .await;
        let client = RetryClient::new(reqwest::Client::new())
            .with_budget(generous())
            .with_read_policy(
                fast_reads()
                    .with_budget(generous())
                    .with_deadline(Duration::from_secs(5)),
            );
        let url = upstream.url("/quota");
        let result = client.send("throttled", |http| http.get(&url)).await;
        (result, upstream.hits())
    }

    // Seconds.
    let (result, hits) = throttled_once(Some("1".to_owned())).await;
    assert_eq!(result.unwrap().status(), 200);
    assert_eq!(hits.len(), 2);
    let waited = hits[1].at - hits[0].at;
    assert!(waited >= Duration::from_secs(1), "waited {waited:?}");

    // Zero seconds: the floor.
    let (result, hits) = throttled_once(Some("0".to_owned())).await;
    assert_eq!(result.unwrap().status(), 200);
    let waited = hits[1].at - hits[0].at;
    assert!(waited >= 500 * MS, "waited {waited:?}");

    // An HTTP date: the retry arrives no sooner.
    let date = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(2));
    let (result, hits) = throttled_once(Some(date.clone())).await;
    assert_eq!(result.unwrap().status(), 200);
    let not_before = httpdate::parse_http_date(&date).unwrap();
    assert!(hits[1].wall >= not_before, "retried before {date}");

    // No Retry-After: no retry; the 429 is the answer.
    let (result, hits) = throttled_once(None).await;
    assert_eq!(result.unwrap().status(), 429);
    assert_eq!(hits.len(), 1);

    // A Retry-After beyond the deadline: no pointless wait, no retry.
    let (result, hits) = throttled_once(Some("3600".to_owned())).await;
    assert_eq!(result.unwrap_err().kind(), ErrorKind::DeadlineExceeded);
    assert_eq!(hits.len(), 1);
}

/// Mistake 3: resending a write after a timeout without a key. A write
/// endpoint nobody declared guarded, on a server without the guard, with
/// the default client: no key is made up, nothing is resent; the payment
/// ran once. (A naive resend, made on purpose at the end, charges twice:
/// the setup would see the mistake.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undeclared_write_endpoint_on_an_unguarded_server_runs_once() {
    // The app without its guard: the only protection is the client's.
    let stack = Stack::start(&[("IDEMPOTENCY_GUARD", "off")], false).await;
    // A proxy without faults, to count the requests that reach the app.
    let proxy = FaultyProxy::start(stack.app_address, Faults::new(1)).await;
    let url = format!("http://{}/payments", proxy.address);
    // The defaults: an unkeyed write is never resent after a timeout; the
    // call waits for its answer until the deadline. This one takes 2.5 s,
    // past the 2 s attempt timeout: its late answer is the call's.
    let client = RetryClient::new(unpooled());
    assert!(
        !client
            .policy("unkeyed-write", &reqwest::Method::POST)
            .guarded()
    );
    let slow = json!({"amount": 7, "currency": "EUR", "delay_ms": 2500});
    let response = client
        .send("unkeyed-write", |http| http.post(&url).json(&slow))
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(stack.wait_for_payments(1).await, 1, "it ran, once");
    assert_eq!(proxy.counts().forwarded, 1, "one request reached the app");
    // A deadline it cannot meet (1 s): the error, after one attempt.
    let short = RetryClient::new(unpooled()).with_write_policy(
        Policy::new(Kind::Write)
            .with_deadline(Duration::from_secs(1))
            .with_attempt_timeout(800 * MS),
    );
    let slower = json!({"amount": 8, "currency": "EUR", "delay_ms": 1200});
    let error = short
        .send("unkeyed-write", |http| http.post(&url).json(&slower))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::UnkeyedWrite, "{error}");
    assert_eq!(error.attempts(), 1);
    assert!(error.may_have_run());
    assert_eq!(error.key(), None);
    assert!(
        matches!(error.last(), Some(Failure::TimedOut)),
        "{:?}",
        error.last()
    );
    assert_eq!(stack.wait_for_payments(2).await, 2, "it ran, once");
    assert_eq!(
        proxy.counts().forwarded,
        2,
        "one request each reached the app"
    );

    // A 503 to an unkeyed write is the answer, not a reason to resend.
    let upstream = Upstream::start(|_, _| status(503)).await;
    let url503 = upstream.url("/payments");
    let response = client
        .send("unkeyed-503", |http| http.post(&url503).json(&payment(1)))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(upstream.requests(), 1);
    assert_eq!(upstream.hits()[0].key, None, "no key made up");

    // The mistake itself: resend it blindly, and it is charged twice.
    let naive = reqwest::Client::new().post(&url).json(&slow).send().await;
    assert_eq!(naive.unwrap().status(), 201);
    assert_eq!(stack.wait_for_payments(3).await, 3, "amount 7, twice");
}

/// Seed 000's one exception: a write without a key is retried on `429`
/// (the server did nothing), after its `Retry-After`, with the floor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_to_an_unkeyed_write_is_retried_after_its_retry_after() {
    let upstream = Upstream::start(|n, _| {
        let mut response = status(if n == 0 { 429 } else { 201 });
        if n == 0 {
            response
                .headers_mut()
                .insert("retry-after", "1".parse().unwrap());
        }
        response
    })
    .await;
    let url = upstream.url("/payments");
    // The default client: the endpoint is not declared guarded.
    let client = RetryClient::new(reqwest::Client::new());
    let response = client
        .send("unkeyed-429", |http| http.post(&url).json(&payment(11)))
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let hits = upstream.hits();
    assert_eq!(hits.len(), 2, "one retry");
    assert!(hits.iter().all(|h| h.key.is_none()), "never a key");
    let waited = hits[1].at - hits[0].at;
    assert!(waited >= Duration::from_secs(1), "waited {waited:?}");
    assert_eq!(hits[1].attempt, Some(1));

    // `Retry-After: 0`: the 500 ms floor.
    let upstream = Upstream::start(|n, _| {
        let mut response = status(if n == 0 { 429 } else { 201 });
        if n == 0 {
            response
                .headers_mut()
                .insert("retry-after", "0".parse().unwrap());
        }
        response
    })
    .await;
    let url = upstream.url("/payments");
    let response = client
        .send("unkeyed-429", |http| http.post(&url).json(&payment(12)))
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let hits = upstream.hits();
    assert_eq!(hits.len(), 2);
    let waited = hits[1].at - hits[0].at;
    assert!(waited >= 500 * MS, "waited {waited:?}");

    // Without `Retry-After`: the 429 is the answer.
    let upstream = Upstream::start(|_, _| status(429)).await;
    let url = upstream.url("/payments");
    let response = client
        .send("unkeyed-429", |http| http.post(&url).json(&payment(13)))
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    assert_eq!(upstream.requests(), 1);
}

/// Mistake 4: retrying a 400. Ours hands 400-class answers back at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_400_is_answered_at_once() {
    let stack = Stack::start(&[], false).await;
    let proxy = FaultyProxy::start(stack.app_address, Faults::new(1)).await;
    let url = format!("http://{}/payments", proxy.address);
    let client = RetryClient::new(unpooled())
        .with_budget(unlimited())
        .with_write_policy(fast_writes().with_budget(unlimited()));
    // Malformed JSON: the handler's 400 (stored by the guard).
    let response = client
        .send("bad-request", |http| {
            http.post(&url)
                .header("content-type", "application/json")
                .body(r#"{"amount": "#)
        })
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    // An invalid key of the caller's: the guard's 400 key-invalid.
    let response = client
        .send("bad-request", |http| {
            http.post(&url)
                .header("idempotency-key", "not a valid key")
                .json(&payment(5))
        })
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    // An invalid amount: the handler's 422.
    let response = client
        .send("bad-request", |http| http.post(&url).json(&payment(0)))
        .await
        .unwrap();
    assert_eq!(response.status(), 422);
    assert_eq!(proxy.counts().forwarded, 3, "one request each");
    assert_eq!(stack.payments().await, 0);
}

/// Mistake 5: reusing a consumed request. Ours builds every attempt
/// afresh: each carries the whole body, its attempt number and the same
/// key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attempt_is_built_afresh_with_the_whole_body() {
    let upstream = Upstream::start(|n, _| status(if n < 2 { 503 } else { 201 })).await;
    let url = upstream.url("/payments");
    let client = RetryClient::new(reqwest::Client::new())
        .with_budget(generous())
        .with_write_policy(fast_writes().with_budget(generous()));
    let body = json!({"amount": 4200, "currency": "EUR", "note": "x".repeat(20_000)});
    let builds = AtomicU32::new(0);
    let response = client
        .send("rebuilt", |http| {
            builds.fetch_add(1, Ordering::SeqCst);
            http.post(&url).json(&body)
        })
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(builds.load(Ordering::SeqCst), 3, "one build per attempt");
    let hits = upstream.hits();
    assert_eq!(hits.len(), 3);
    for (n, hit) in hits.iter().enumerate() {
        assert_eq!(hit.attempt, Some(n as u32), "X-Retry-Attempt");
        let received: Value = serde_json::from_slice(&hit.body).unwrap();
        assert_eq!(received, body, "attempt {n} carried the whole body");
    }
    let keys: HashSet<_> = hits.iter().map(|h| h.key.clone()).collect();
    assert_eq!(keys.len(), 1, "one key for all attempts");
    let key = hits[0].key.clone().expect("a generated key");
    assert_eq!(uuid::Uuid::parse_str(&key).unwrap().get_version_num(), 7);
}

// ---------------------------------------------------------------------------
// Writes whose outcome is unknown

/// A write whose answer is late: the client asks the status service, waits
/// while it runs, and fetches the stored answer. One payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_write_asks_the_status_service_and_gets_its_own_answer() {
    recorder();
    let stack = Stack::start(&[], true).await;
    let url = stack.url();
    let client = RetryClient::new(reqwest::Client::new())
        .with_status_client(stack.status_client())
        .with_budget(generous())
        .with_write_policy(
            fast_writes()
                .with_budget(generous())
                .with_attempt_timeout(300 * MS)
                .with_deadline(Duration::from_secs(6)),
        );
    let slow = json!({"amount": 4200, "currency": "EUR", "delay_ms": 900});
    // The request's own timeout cuts each attempt off (the answer is lost,
    // as behind a proxy that drops it): only the stored answer is left.
    let response = client
        .send("late-write", |http| {
            http.post(&url)
                .header("x-tenant", "acme")
                .timeout(300 * MS)
                .json(&slow)
        })
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(response.headers()["idempotent-replayed"], "true");
    let paid: Value = response.json().await.unwrap();
    assert_eq!(paid["amount"], 4200);
    assert_eq!(stack.payments().await, 1);
    let checks = |advice| {
        client_metric(
            "idempotency_client_status_checks_total",
            &[("endpoint", "late-write"), ("advice", advice)],
        )
    };
    assert!(checks("wait") >= 1.0, "it asked while the payment ran");
    assert_eq!(checks("replay"), 1.0, "then learnt that it ran");
}

/// The default guarded write (10 s deadline, 2 s attempt timeout) on a
/// payment that takes 2.5 s: the client asks the status service at 2 s
/// (`wait`), and the first attempt, still running, answers during the
/// wait: its own answer, not a replay, one payment (issue 53's late
/// answers). With a 2 s deadline (issue 17's default), one that takes
/// longer than the deadline allows ends with `OutcomeStillRunning` and its
/// key, and that key later fetches its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_write_that_finishes_during_the_wait_is_returned_as_its_replay() {
    recorder();
    let stack = Stack::start(&[], true).await;
    let url = stack.url();
    let client = RetryClient::new(reqwest::Client::new())
        .with_status_client(stack.status_client())
        .with_endpoint("late-default", Policy::guarded_write())
        .with_endpoint(
            "late-short",
            Policy::guarded_write()
                .with_deadline(Duration::from_secs(2))
                .with_attempt_timeout(800 * MS),
        );
    let late = json!({"amount": 4300, "currency": "EUR", "delay_ms": 2500});
    let started = Instant::now();
    let response = client
        .send("late-default", |http| {
            http.post(&url).header("x-tenant", "acme").json(&late)
        })
        .await
        .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(response.status(), 201);
    assert!(
        response.headers().get("idempotent-replayed").is_none(),
        "the first attempt's own answer"
    );
    let paid: Value = response.json().await.unwrap();
    assert_eq!(paid["amount"], 4300);
    assert!(elapsed < Duration::from_secs(4), "took {elapsed:?}");
    let checks = |advice| {
        client_metric(
            "idempotency_client_status_checks_total",
            &[("endpoint", "late-default"), ("advice", advice)],
        )
    };
    assert_eq!(checks("wait"), 1.0, "it asked while the payment ran");
    assert_eq!(stack.payments().await, 1);

    // Too long for the deadline: the error says it still runs.
    let later = json!({"amount": 4400, "currency": "EUR", "delay_ms": 2500});
    let error = client
        .send("late-short", |http| {
            http.post(&url).header("x-tenant", "acme").json(&later)
        })
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::OutcomeStillRunning, "{error}");
    assert!(error.may_have_run());
    let key = error.key().expect("the key to fetch it with").to_owned();
    assert!(error.to_string().contains(&key), "{error}");
    assert_eq!(stack.wait_for_payments(2).await, 2);
    // Later, the same key fetches its answer (and runs nothing again).
    let response = client
        .send("late-default", |http| {
            http.post(&url)
                .header("x-tenant", "acme")
                .header("idempotency-key", &key)
                .json(&later)
        })
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(response.headers()["idempotent-replayed"], "true");
    assert_eq!(stack.payments().await, 2);
}

/// A 504 leaves a write's outcome unknown: the client asks the status
/// service (here it never heard of the key: `retry`), or, when the service
/// is down or not configured, resends with the same key at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_504_a_write_is_resent_with_the_same_key() {
    recorder();
    let stack = Stack::start(&[], true).await;
    let dead = format!("http://{}", idempotency_tests::process::free_address());
    let cases = [
        ("gateway-asked", Some(stack.status_client()), Some("retry")),
        (
            "gateway-down",
            Some(StatusClient::new(dead, TOKEN)),
            Some("unavailable"),
        ),
        ("gateway-alone", None, None),
    ];
    for (endpoint, status_client, advice) in cases {
        let upstream = Upstream::start(|n, _| status(if n == 0 { 504 } else { 201 })).await;
        let url = upstream.url("/payments");
        let mut client = RetryClient::new(reqwest::Client::new())
            .with_budget(generous())
            .with_write_policy(fast_writes().with_budget(generous()));
        if let Some(status_client) = status_client {
            client = client.with_status_client(status_client);
        }
        let response = client
            .send(endpoint, |http| http.post(&url).json(&payment(3)))
            .await
            .unwrap();
        assert_eq!(response.status(), 201, "{endpoint}");
        let hits = upstream.hits();
        assert_eq!(hits.len(), 2, "{endpoint}");
        assert!(
            hits[0].key.is_some() && hits[0].key == hits[1].key,
            "{endpoint}: one key"
        );
        let checks = |advice| {
            client_metric(
                "idempotency_client_status_checks_total",
                &[("endpoint", endpoint), ("advice", advice)],
            )
        };
        match advice {
            Some(advice) => assert_eq!(checks(advice), 1.0, "{endpoint}"),
            None => assert_eq!(
                client_metric(
                    "idempotency_client_status_checks_total",
                    &[("endpoint", endpoint)]
                ),
                0.0
            ),
        }
    }
}

/// A duplicate sent while the first still runs gets the guard's 409
/// in-flight: the client waits its `Retry-After` and gets the replay,
/// with an empty retry budget (a fetch is not a retry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_flight_duplicate_waits_for_the_first() {
    recorder();
    let stack = Stack::start(&[], true).await;
    let url = stack.url();
    let slow = json!({"amount": 99, "currency": "EUR", "delay_ms": 600});
    let first = {
        let (url, slow) = (url.clone(), slow.clone());
        tokio::spawn(async move {
            let response = reqwest::Client::new()
                .post(&url)
                .header("idempotency-key", "dup-1")
                .header("x-tenant", "acme")
                .json(&slow)
                .send()
                .await
                .unwrap();
            (response.status(), response.json::<Value>().await.unwrap())
        })
    };
    wait_for_advice(&stack.status_client(), "dup-1", |a| a == Some("wait")).await;
    // No retry budget at all: fetching the first call's answer needs none.
    let client = RetryClient::new(reqwest::Client::new())
        .with_budget(RetryBudget::new(0.0).with_initial(0.0))
        .with_write_policy(
            fast_writes()
                .with_max_attempts(5)
                .with_deadline(Duration::from_secs(6)),
        );
    let response = client
        .send("in-flight", |http| {
            http.post(&url)
                .header("idempotency-key", "dup-1")
                .header("x-tenant", "acme")
                .json(&slow)
        })
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(response.headers()["idempotent-replayed"], "true");
    let replayed: Value = response.json().await.unwrap();
    let (status, original) = first.await.unwrap();
    assert_eq!(status, 201);
    assert_eq!(replayed, original, "the first call's answer");
    assert_eq!(stack.payments().await, 1);
    assert!(
        client_metric(
            "idempotency_client_attempts_total",
            &[("endpoint", "in-flight"), ("outcome", "in-flight")],
        ) >= 1.0
    );
}

/// An abandoned write (its process was killed mid-payment) is reported as
/// outcome unknown, by the guard's 409 and by the status service's
/// `reconcile`, never resent blindly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_write_is_reported_as_outcome_unknown() {
    let mut stack = Stack::start(&[("LEASE_SECS", "1")], true).await;
    let url = stack.url();
    let status = stack.status_client();
    let slow = json!({"amount": 31, "currency": "EUR", "delay_ms": 30_000});
    let send = {
        let (url, slow) = (url.clone(), slow.clone());
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(&url)
                .header("idempotency-key", "abandoned-1")
                .header("x-tenant", "acme")
                .json(&slow)
                .send()
                .await
        })
    };
    wait_for_advice(&status, "abandoned-1", |a| a == Some("wait")).await;
    stack.kill_app().await;
    assert!(send.await.unwrap().is_err(), "the app died mid-payment");
    stack.restart_app().await;
    wait_for_advice(&status, "abandoned-1", |a| a == Some("reconcile")).await;

    // The guard says so itself.
    let client = RetryClient::new(unpooled())
        .with_status_client(status)
        .with_budget(unlimited())
        .with_write_policy(fast_writes().with_budget(unlimited()));
    let error = client
        .send("abandoned", |http| {
            http.post(&url)
                .header("idempotency-key", "abandoned-1")
                .header("x-tenant", "acme")
                .json(&slow)
        })
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::OutcomeUnknown, "{error}");
    assert_eq!(error.key(), Some("abandoned-1"));
    assert_eq!(error.attempts(), 1);
    assert!(error.may_have_run());
    assert!(matches!(error.last(), Some(Failure::Answer(r)) if r.status() == 409));

    // The answer is lost on the way: the status service says so.
    let proxy = FaultyProxy::start(
        stack.app_address,
        Faults::new(3).with_dropped_responses(1.0),
    )
    .await;
    let lossy = format!("http://{}/payments", proxy.address);
    let error = client
        .send("abandoned", |http| {
            http.post(&lossy)
                .header("idempotency-key", "abandoned-1")
                .header("x-tenant", "acme")
                .json(&slow)
        })
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::OutcomeUnknown, "{error}");
    assert_eq!(error.attempts(), 1, "asked instead of resending");
    assert!(matches!(error.last(), Some(Failure::Transport(_))));
    assert_eq!(proxy.counts().responses_dropped, 1);
}

/// Through a proxy that drops 30% of the answers after the payment ran
/// (and resets 5% of connections before forwarding), 1000 writes with the
/// default client (the endpoint declared guarded, a status service): no
/// payment runs twice; every call gets its own payment back or a clear
/// error with its key, and that key later fetches the payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_lossy_proxy_1000_default_writes_make_1000_payments() {
    recorder();
    let stack = Stack::start(&[], true).await;
    let proxy = FaultyProxy::start(
        stack.app_address,
        Faults::new(2026)
            .with_dropped_responses(0.3)
            .with_resets(0.05),
    )
    .await;
    let url = format!("http://{}/payments", proxy.address);
    let client = RetryClient::new(unpooled())
        .with_status_client(stack.status_client())
        .with_endpoint("lossy", Policy::guarded_write());
    const CALLS: i64 = 1000;
    const WORKERS: i64 = 16;
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..WORKERS {
        let (client, url) = (client.clone(), url.clone());
        workers.spawn(async move {
            let mut paid = Vec::new();
            let mut failed: Vec<(i64, RetryError)> = Vec::new();
            for amount in (1..=CALLS).filter(|a| a % WORKERS == worker) {
                let result = client
                    .send("lossy", |http| {
                        http.post(&url)
                            .header("x-tenant", "acme")
                            .json(&payment(amount))
                    })
                    .await;
                let response = match result {
                    Ok(response) => response,
                    Err(error) => {
                        failed.push((amount, error));
                        continue;
                    }
                };
                assert_eq!(response.status(), 201, "payment {amount}");
                let replayed = response.headers().contains_key("idempotent-replayed");
                let body: Value = response.json().await.unwrap();
                assert_eq!(body["amount"], amount, "its own payment");
                paid.push((body["id"].as_i64().unwrap(), replayed));
            }
            (paid, failed)
        });
    }
    let mut ids = HashSet::new();
    let mut replays = 0;
    let mut failed = Vec::new();
    while let Some(done) = workers.join_next().await {
        let (paid, errors) = done.unwrap();
        for (id, replayed) in paid {
            assert!(ids.insert(id), "payment id {id} twice");
            replays += usize::from(replayed);
        }
        failed.extend(errors);
    }
    let elapsed = started.elapsed();
    assert_eq!(ids.len() + failed.len(), 1000);
    let mut kinds = std::collections::BTreeMap::new();
    for (amount, error) in &failed {
        *kinds.entry(error.kind().as_str()).or_insert(0u32) += 1;
        assert!(
            matches!(
                error.kind(),
                ErrorKind::AttemptsExhausted
                    | ErrorKind::DeadlineExceeded
                    | ErrorKind::BudgetExhausted
                    | ErrorKind::OutcomeStillRunning
            ),
            "payment {amount}: {error}"
        );
        assert!(error.key().is_some(), "payment {amount}: {error}");
    }
    // Never twice, whatever the client gave up on.
    let db = stack.db().await;
    let (twice,): (i64,) = sqlx::query_as(
        "select count(*) from (select amount from payments group by amount having count(*) > 1)",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    db.close().await;
    assert_eq!(twice, 0, "no payment ran twice");
    let counts = proxy.counts();
    assert!(counts.responses_dropped >= 250, "{counts:?}");
    assert!(counts.resets >= 20, "{counts:?}");
    let checks = client_metric(
        "idempotency_client_status_checks_total",
        &[("endpoint", "lossy")],
    );
    assert!(
        checks >= counts.responses_dropped as f64,
        "asked after every loss"
    );
    println!(
        "lossy proxy, default client: 1000 writes in {elapsed:.1?}; {} connections, {} forwarded, \
         {} answers dropped, {} resets; {checks} status checks, {replays} calls ended on a replay; \
         {} ended with its own payment, {} with an error {kinds:?}",
        counts.connections,
        counts.forwarded,
        counts.responses_dropped,
        counts.resets,
        ids.len(),
        failed.len()
    );
    // The failed calls are few (about 5%: three attempts lost in a row, the
    // default limit, or a reset's pause that did not fit the deadline), and
    // each error's key fetches (or, if it never ran, makes) its payment,
    // once.
    assert!(failed.len() <= 80, "{} calls failed", failed.len());
    let direct = stack.url();
    let reconciler = RetryClient::new(reqwest::Client::new())
        .with_endpoint("lossy-later", fast_writes().with_max_attempts(10));
    for (amount, error) in &failed {
        let key = error.key().unwrap();
        let response = reconciler
            .send("lossy-later", |http| {
                http.post(&direct)
                    .header("x-tenant", "acme")
                    .header("idempotency-key", key)
                    .json(&payment(*amount))
            })
            .await
            .unwrap();
        assert_eq!(response.status(), 201, "payment {amount}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["amount"], *amount);
    }
    assert_eq!(stack.payments().await, 1000, "exactly one execution each");
}

// ---------------------------------------------------------------------------
// Budget, jitter, breaker

/// Whether the `n`-th request fails, for a failure rate in basis points:
/// exactly that share of every run of requests, spread evenly.
fn fails(n: u64, basis_points: u64) -> bool {
    (n + 1) * basis_points / 10_000 > n * basis_points / 10_000
}

struct Run {
    requests: u64,
    answered: u32,
    refused: u32,
}

/// 1000 reads through `client` against an upstream failing that share of
/// requests with 503, twenty at a time.
async fn amplification_run(client: RetryClient, endpoint: &'static str, basis_points: u64) -> Run {
    let upstream =
        Upstream::start(move |n, _| status(if fails(n, basis_points) { 503 } else { 200 })).await;
    let url = upstream.url("/items");
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let (client, url) = (client.clone(), url.clone());
        workers.spawn(async move {
            let (mut answered, mut refused) = (0, 0);
            for _ in 0..50 {
                match client.send(endpoint, |http| http.get(&url)).await {
                    Ok(response) if response.status() == 200 => answered += 1,
                    Ok(response) => panic!("a failure came back as Ok: {}", response.status()),
                    Err(error) if error.kind() == ErrorKind::BudgetExhausted => refused += 1,
                    Err(_) => {}
                }
            }
            (answered, refused)
        });
    }
    let mut run = Run {
        requests: 0,
        answered: 0,
        refused: 0,
    };
    while let Some(counts) = workers.join_next().await {
        let (answered, refused) = counts.unwrap();
        run.answered += answered;
        run.refused += refused;
    }
    run.requests = upstream.requests();
    run
}

/// Under 0.1%, 2%, 50% and 100% upstream failure, 1000 calls of the
/// default client send at most 1000 × (1 + share) + the start allowance
/// (10) requests. Without a budget (and, to keep it quick, millisecond
/// pauses: not the defaults) the same three attempts send far more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amplification_stays_within_the_budget_share() {
    recorder();
    let budget = RetryBudget::default();
    let (share, start) = (budget.share(), budget.initial());
    let rates: [(&str, u64, &'static str, &'static str); 4] = [
        ("0.1%", 10, "amplification-0.1", "unbudgeted-0.1"),
        ("2%", 200, "amplification-2", "unbudgeted-2"),
        ("50%", 5000, "amplification-50", "unbudgeted-50"),
        ("100%", 10_000, "amplification-100", "unbudgeted-100"),
    ];
    println!(
        "upstream failure | requests / 1000 calls (default client: share {share}, start {start}) \
         | answered | budget refusals | no budget, ms pauses"
    );
    for (label, basis_points, endpoint, unbudgeted) in rates {
        let client = RetryClient::new(reqwest::Client::new());
        let run = amplification_run(client, endpoint, basis_points).await;
        let amplification = run.requests as f64 / 1000.0;
        // The client's own metrics say the same.
        let attempts = client_metric(
            "idempotency_client_attempts_total",
            &[("endpoint", endpoint)],
        );
        let calls = client_metric("idempotency_client_calls_total", &[("endpoint", endpoint)]);
        let refusals = client_metric(
            "idempotency_client_budget_refusals_total",
            &[("endpoint", endpoint), ("budget", "shared")],
        );
        assert_eq!(attempts, run.requests as f64, "{label}: attempts metric");
        assert_eq!(calls, 1000.0, "{label}: calls metric");
        assert_eq!(refusals, f64::from(run.refused), "{label}: refusals metric");

        let naive = RetryClient::new(reqwest::Client::new())
            .with_budget(unlimited())
            .with_read_policy(fast_reads());
        let without = amplification_run(naive, unbudgeted, basis_points).await;
        let naive_amplification = without.requests as f64 / 1000.0;
        println!(
            "{label:>16} | {amplification:.3} | {} | {} | {naive_amplification:.3}",
            run.answered, run.refused
        );
        // The documented bound: retries ≤ share × n + start.
        assert!(
            amplification <= 1.0 + share + start / 1000.0 + 1e-9,
            "{label}: amplification {amplification}"
        );
        assert!(amplification >= 1.0);
        if basis_points == 10_000 {
            assert_eq!(run.answered, 0);
            assert!(run.refused >= 850, "{label}: {} refusals", run.refused);
            assert!(
                naive_amplification > 2.9,
                "without a budget: {naive_amplification}"
            );
        }
        if basis_points <= 200 {
            // Rare failures are retried, and the retries succeed (unless a
            // retry lands on a failing request again, twice).
            assert!(run.answered >= 995, "{label}: {} answered", run.answered);
            assert!(run.requests > 1000, "{label}: the failures were retried");
        }
    }
}

/// One budget story, one test per documented setting (millisecond pauses;
/// budgets do not depend on time). Calls are sequential, so the token
/// counts are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_documented_budget_setting_does_what_it_says() {
    recorder();
    let upstream = Upstream::start(|_, _| status(503)).await;
    let url = upstream.url("/down");
    let retries = |before: u64, calls: u64| upstream.requests() - before - calls;
    async fn calls(client: &RetryClient, endpoint: &str, url: &str, n: u32) -> Vec<RetryError> {
        let mut errors = Vec::new();
        for _ in 0..n {
            errors.push(
                client
                    .send(endpoint, |http| http.get(url))
                    .await
                    .unwrap_err(),
            );
        }
        errors
    }

    // The default: one bucket shared by every endpoint, full at start (10
    // retries). Five calls of one endpoint at total failure spend it (two
    // retries each); the next call, of another endpoint, is refused.
    let shared = RetryClient::new(reqwest::Client::new()).with_read_policy(fast_reads());
    let before = upstream.requests();
    let errors = calls(&shared, "budget-a", &url, 5).await;
    assert!(
        errors
            .iter()
            .all(|e| e.kind() == ErrorKind::AttemptsExhausted)
    );
    assert_eq!(retries(before, 5), 10, "the start allowance: 10 retries");
    let error = calls(&shared, "budget-b", &url, 1).await.remove(0);
    assert_eq!(error.kind(), ErrorKind::BudgetExhausted, "{error}");
    assert_eq!(error.attempts(), 1);
    // ... and then one retry per ten calls (the 6th call's deposit made
    // 0.5; five more make 1.0 on the 11th call of the client).
    let before = upstream.requests();
    let errors = calls(&shared, "budget-b", &url, 5).await;
    assert_eq!(retries(before, 5), 1);
    assert_eq!(
        errors
            .iter()
            .filter(|e| e.kind() == ErrorKind::BudgetExhausted)
            .count(),
        5,
        "the one retry was refused its second"
    );

    // RetryClient::with_budget alone changes the shared share: 0.5 of a
    // retry per call, 10 at start: 40 calls at total failure retry
    // exactly 29 times (10 + 20 earned, less the first call's deposit,
    // which the full bucket could not keep, less the half left over).
    let half = RetryClient::new(reqwest::Client::new())
        .with_budget(RetryBudget::new(0.5))
        .with_read_policy(fast_reads());
    let before = upstream.requests();
    calls(&half, "budget-half", &url, 40).await;
    let taken = retries(before, 40);
    assert!(taken <= 30, "≤ 0.5 × 40 + 10: {taken}");
    assert!(taken >= 29, "the share is used: {taken}");

    // RetryBudget::with_initial(0): the exact 1 + share bound, from the
    // first call: a fresh client's first failure is not retried.
    let strict = RetryClient::new(reqwest::Client::new())
        .with_budget(RetryBudget::default().with_initial(0.0))
        .with_read_policy(fast_reads());
    let before = upstream.requests();
    let errors = calls(&strict, "budget-strict", &url, 20).await;
    assert_eq!(errors[0].kind(), ErrorKind::BudgetExhausted);
    assert_eq!(retries(before, 20), 2, "0.1 × 20");

    // Policy::with_budget: an endpoint's own bucket, used instead of the
    // shared one. Here it allows nothing, and the shared bucket, which it
    // never touches, still serves the other endpoints.
    let split = RetryClient::new(reqwest::Client::new())
        .with_read_policy(fast_reads())
        .with_endpoint(
            "budget-own",
            fast_reads().with_budget(RetryBudget::new(0.0).with_initial(0.0)),
        );
    let before = upstream.requests();
    let errors = calls(&split, "budget-own", &url, 20).await;
    assert!(
        errors
            .iter()
            .all(|e| e.kind() == ErrorKind::BudgetExhausted)
    );
    assert_eq!(retries(before, 20), 0);
    let before = upstream.requests();
    calls(&split, "budget-other", &url, 5).await;
    assert_eq!(retries(before, 5), 10, "the shared bucket is still full");
    assert_eq!(
        client_metric(
            "idempotency_client_budget_refusals_total",
            &[("endpoint", "budget-own"), ("budget", "endpoint")],
        ),
        20.0
    );
}

/// 200 fresh default clients fail at the same instant (the upstream holds
/// their first tries until all have arrived, then answers 503 to all at
/// once): each retries once (its budget starts full), and the retries
/// arrive spread over the default backoff's range (full jitter, 500 ms),
/// not together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_fresh_default_clients_each_retry_once_spread_by_jitter() {
    const CLIENTS: usize = 200;
    let base = Policy::new(Kind::Read).backoff().base();
    let upstream = Upstream::start_holding(CLIENTS, |_, hit| {
        status(if hit.attempt == Some(0) { 503 } else { 200 })
    })
    .await;
    let url = upstream.url("/spread");
    let http = reqwest::Client::new();
    // Open the connections first: a burst of 200 connects on loopback loses
    // some SYNs (resent a second later), which would spread the first tries.
    let mut warm = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let request = http.get(&url).send();
        warm.spawn(async move { request.await.unwrap().bytes().await.unwrap() });
    }
    while let Some(done) = warm.join_next().await {
        done.unwrap();
    }
    let warmed = upstream.requests();
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        // Fresh, and the defaults.
        let client = RetryClient::new(http.clone());
        let url = url.clone();
        clients.spawn(async move {
            client
                .send("spread", |http| http.get(&url))
                .await
                .map(|r| r.status())
        });
    }
    while let Some(result) = clients.join_next().await {
        match result.unwrap() {
            Ok(status) => assert_eq!(status, 200),
            Err(error) => panic!("a fresh client gave up: {error}"),
        }
    }
    assert_eq!(
        upstream.requests() - warmed,
        2 * CLIENTS as u64,
        "each retried once"
    );
    let hits = upstream.hits();
    let attempts = |n| -> Vec<Instant> {
        hits.iter()
            .filter(|h| h.attempt == Some(n))
            .map(|h| h.at)
            .collect()
    };
    let (firsts, retries) = (attempts(0), attempts(1));
    assert_eq!((firsts.len(), retries.len()), (CLIENTS, CLIENTS));
    // All failed when the last first try arrived.
    let failed_at = *firsts.iter().max().unwrap();
    let mut offsets: Vec<f64> = retries
        .iter()
        .map(|t| t.duration_since(failed_at).as_secs_f64() * 1000.0)
        .collect();
    offsets.sort_by(f64::total_cmp);
    let spread = offsets[CLIENTS - 1] - offsets[0];
    let mean = offsets.iter().sum::<f64>() / CLIENTS as f64;
    let sd = (offsets.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / CLIENTS as f64).sqrt();
    // The most retries that arrived within any 20 ms.
    let busiest = (0..CLIENTS)
        .map(|i| {
            offsets[i..]
                .iter()
                .take_while(|x| **x < offsets[i] + 20.0)
                .count()
        })
        .max()
        .unwrap();
    let ceiling = base.as_secs_f64() * 1000.0;
    println!(
        "jitter: {CLIENTS} fresh default clients failed at once; each retried once; their \
         retries arrived over {spread:.1} ms (base {ceiling} ms; standard deviation {sd:.1} ms, \
         a uniform spread's is {:.1} ms); at most {busiest} retries within any 20 ms",
        ceiling / 12f64.sqrt()
    );
    assert!(spread > ceiling / 2.0, "retries spread over {spread} ms");
    assert!(sd > ceiling / 8.0, "standard deviation {sd} ms");
    assert!(busiest <= CLIENTS / 4, "{busiest} retries within 20 ms");
}

/// No two attempts of a call are closer than its backoff schedule, even
/// near the deadline: with equal jitter every pause before retry `n` is at
/// least half of `min(cap, base × 2^n)`, so a gap shorter than that would
/// be a pause shrunk to fit the deadline. Calls stop with
/// `DeadlineExceeded` instead, inside their deadline. (Millisecond bases
/// and equal jitter are settings of this test; the default is full jitter,
/// whose least pause is 0.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_two_attempts_are_closer_than_the_backoff_schedule() {
    let upstream = Upstream::start(|_, _| status(503)).await;
    let url = upstream.url("/payments");
    let backoff = Backoff::new(20 * MS)
        .with_cap(160 * MS)
        .with_jitter(Jitter::Equal);
    let deadline = 700 * MS;
    let client = RetryClient::new(reqwest::Client::new()).with_endpoint(
        "gaps",
        Policy::guarded_write()
            .with_backoff(backoff)
            .with_deadline(deadline)
            .with_attempt_timeout(100 * MS)
            .with_max_attempts(50)
            .with_budget(unlimited()),
    );
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..20 {
        let (client, url) = (client.clone(), url.clone());
        calls.spawn(async move {
            let started = Instant::now();
            let error = client
                .send("gaps", |http| http.post(&url).json(&payment(i)))
                .await
                .unwrap_err();
            (error, started.elapsed())
        });
    }
    while let Some(done) = calls.join_next().await {
        let (error, elapsed) = done.unwrap();
        assert_eq!(error.kind(), ErrorKind::DeadlineExceeded, "{error}");
        assert!(elapsed <= deadline + 50 * MS, "took {elapsed:?}");
    }
    let hits = upstream.hits();
    let mut by_key: std::collections::HashMap<String, Vec<&Hit>> = Default::default();
    for hit in &hits {
        by_key
            .entry(hit.key.clone().expect("a guarded write has a key"))
            .or_default()
            .push(hit);
    }
    assert_eq!(by_key.len(), 20);
    let (mut gaps, mut shortest_margin) = (0, f64::MAX);
    for attempts in by_key.values_mut() {
        attempts.sort_by_key(|h| h.attempt);
        assert!(attempts.len() >= 4, "{} attempts", attempts.len());
        for pair in attempts.windows(2) {
            let retry = pair[1].attempt.unwrap() - 1;
            let gap = pair[1].at - pair[0].at;
            let floor = backoff.floor(retry);
            assert!(gap >= floor, "retry {retry}: {gap:?} < {floor:?}");
            shortest_margin = shortest_margin.min((gap - floor).as_secs_f64() * 1000.0);
            gaps += 1;
        }
    }
    println!(
        "backoff: {gaps} gaps between attempts of 20 calls, none under its schedule's least \
         pause (closest: {shortest_margin:.1} ms above it)"
    );
}

/// After three consecutive failures the circuit opens: the call in
/// progress and the next fail fast, without a request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_circuit_fails_fast() {
    let upstream = Upstream::start(|_, _| status(503)).await;
    let url = upstream.url("/down");
    let client = RetryClient::new(reqwest::Client::new())
        .with_budget(unlimited())
        .with_endpoint(
            "broken",
            fast_reads()
                .with_budget(unlimited())
                .with_max_attempts(10)
                .with_circuit_breaker(
                    CircuitBreaker::new(3).with_cool_down(Duration::from_secs(60)),
                ),
        );
    let error = client
        .send("broken", |http| http.get(&url))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::CircuitOpen);
    assert_eq!(error.attempts(), 3);
    let error = client
        .send("broken", |http| http.get(&url))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::CircuitOpen);
    assert_eq!(error.attempts(), 0);
    assert!(error.last().is_none());
    assert_eq!(upstream.requests(), 3);
    // Another endpoint of the same client is not affected.
    let error = client
        .send("elsewhere", |http| http.get(&url))
        .await
        .unwrap_err();
    assert_ne!(error.kind(), ErrorKind::CircuitOpen);
}

/// Connect errors are retried, for reads and keyed writes alike (the
/// request never left); the last failure says what it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_errors_are_retried_until_the_attempts_run_out() {
    let nobody = idempotency_tests::process::free_address();
    let url = format!("http://{nobody}/x");
    let client = RetryClient::new(reqwest::Client::new())
        .with_budget(unlimited())
        .with_read_policy(fast_reads().with_budget(unlimited()))
        .with_write_policy(fast_writes().with_budget(unlimited()));
    let error = client
        .send("nobody", |http| http.get(&url))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::AttemptsExhausted);
    assert_eq!(error.attempts(), 3);
    assert!(matches!(error.last(), Some(Failure::Transport(e)) if e.is_connect()));
    let error = client
        .send("nobody-write", |http| http.post(&url).json(&payment(1)))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::AttemptsExhausted);
    assert_eq!(error.attempts(), 3);
    assert!(!error.may_have_run(), "it never left");
}
