//! The clients of the two runs: the naive SDK and the retry client.

use idempotency_client::{Policy, RetryClient, StatusClient};
use idempotency_guard::Fingerprint;
use serde_json::json;

use crate::config::NaivePolicy;
use crate::traffic::{Kind, Operation};

/// The endpoint names the retry client knows the API by.
const READ: &str = "read-payment";
const WRITE: &str = "create-payment";

/// Where a debit is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DebitRoute {
    /// `POST /payments`: one handler, one write.
    Payments,
    /// `POST /debits`: the resumable route (steps `reserve`, `charge` at
    /// the PSP, `record`), its abandoned runs resumed by the retry.
    Resumable,
}

impl DebitRoute {
    /// The route's path.
    pub fn path(self) -> &'static str {
        match self {
            Self::Payments => "/payments",
            Self::Resumable => "/debits",
        }
    }
}

/// How one logical operation ended, as its client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallOutcome {
    /// An answer was handed back (its status).
    Answered(u16),
    /// The client gave up (why: the naive client's last failure, or the
    /// retry client's error kind).
    GaveUp(String),
}

/// The clients that make the population's calls.
#[derive(Debug, Clone)]
pub enum Caller {
    /// The story's SDK: no key, fixed pauses, no budget.
    Naive {
        /// One HTTP client with the attempt timeout.
        http: reqwest::Client,
        /// The pauses between attempts.
        policy: NaivePolicy,
    },
    /// One retry client per client instance (each its own budget), with
    /// its defaults, debits declared guarded, the status service set (not
    /// on the resumable route: see [`Caller::resumable`]).
    Guarded {
        /// The instances.
        clients: Vec<RetryClient>,
        /// Where their debits go.
        debits: DebitRoute,
    },
}

impl Caller {
    /// The naive SDK.
    ///
    /// # Errors
    ///
    /// When the HTTP client cannot be built.
    pub fn naive(policy: NaivePolicy) -> reqwest::Result<Self> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .timeout(policy.timeout)
            .build()?;
        Ok(Self::Naive { http, policy })
    }

    /// `clients` retry clients, each asking the status service at
    /// `status_url` with `token`.
    ///
    /// # Errors
    ///
    /// When an HTTP client cannot be built.
    pub fn guarded(clients: usize, status_url: &str, token: &str) -> reqwest::Result<Self> {
        let instances = (0..clients.max(1))
            .map(|_| {
                let http = reqwest::Client::builder()
                    .pool_max_idle_per_host(0)
                    .build()?;
                Ok(RetryClient::new(http)
                    .with_endpoint(WRITE, Policy::guarded_write())
                    .with_status_client(StatusClient::new(status_url, token)))
            })
            .collect::<reqwest::Result<_>>()?;
        Ok(Self::Guarded {
            clients: instances,
            debits: DebitRoute::Payments,
        })
    }

    /// `clients` retry clients whose debits go to the resumable route,
    /// declared guarded with a deadline of `deadline` (past the lease of a
    /// crashed run), and without the status service: it advises
    /// `reconcile` for an abandoned key, on which the client stops, while
    /// this route resumes the key on the retry. So the client resends
    /// after a lost answer, and fetches while the key is in flight, until
    /// the resumed run answers.
    ///
    /// # Errors
    ///
    /// When an HTTP client cannot be built.
    pub fn resumable(clients: usize, deadline: std::time::Duration) -> reqwest::Result<Self> {
        let instances = (0..clients.max(1))
            .map(|_| {
                let http = reqwest::Client::builder()
                    .pool_max_idle_per_host(0)
                    .build()?;
                let policy = Policy::guarded_write()
                    .with_deadline(deadline)
                    .with_max_attempts(12);
                Ok(RetryClient::new(http).with_endpoint(WRITE, policy))
            })
            .collect::<reqwest::Result<_>>()?;
        Ok(Self::Guarded {
            clients: instances,
            debits: DebitRoute::Resumable,
        })
    }

    /// Where this caller's debits go.
    pub fn debit_route(&self) -> DebitRoute {
        match self {
            Self::Naive { .. } => DebitRoute::Payments,
            Self::Guarded { debits, .. } => *debits,
        }
    }

    /// Makes one logical operation against the API at `base` (the proxy).
    pub async fn call(&self, operation: &Operation, base: &str) -> CallOutcome {
        match self {
            Self::Naive { http, policy } => naive_call(http, policy, operation, base).await,
            Self::Guarded { clients, debits } => {
                let client = &clients[operation.client % clients.len()];
                let sent = match operation.kind {
                    Kind::Read => {
                        let url = format!("{base}/payments/{}", operation.payment);
                        client
                            .send(READ, |http| {
                                http.get(&url).header("x-lab-operation", operation.index)
                            })
                            .await
                    }
                    Kind::Write => {
                        let url = format!("{base}{}", debits.path());
                        let body = debit(operation);
                        client
                            .send(WRITE, |http| {
                                http.post(&url)
                                    .json(&body)
                                    .header("x-lab-operation", operation.index)
                            })
                            .await
                    }
                };
                match sent {
                    Ok(answer) => {
                        let status = answer.status().as_u16();
                        let _ = answer.bytes().await;
                        CallOutcome::Answered(status)
                    }
                    Err(error) => CallOutcome::GaveUp(error.kind().as_str().to_owned()),
                }
            }
        }
    }
}

/// A debit's body (`POST /payments`, JSON): its amount is unique to it.
pub fn debit(operation: &Operation) -> serde_json::Value {
    let mut body = json!({"amount": operation.amount(), "currency": "EUR"});
    if !operation.handler_time.is_zero() {
        body["delay_ms"] = json!(operation.handler_time.as_millis() as u64);
    }
    body
}

/// The fingerprint the guard gives a debit's request on `route` (the
/// key's record holds it), so that an abandoned key can be traced to its
/// debit.
pub fn debit_fingerprint(operation: &Operation, route: DebitRoute) -> Fingerprint {
    use axum::http::{HeaderMap, HeaderValue, Method, header};
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let body = debit(operation).to_string();
    Fingerprint::of_request(&Method::POST, route.path(), &headers, body.as_bytes())
}

/// The story's SDK: every 5xx, timeout and connection error retried after
/// the policy's pauses; no key.
async fn naive_call(
    http: &reqwest::Client,
    policy: &NaivePolicy,
    operation: &Operation,
    base: &str,
) -> CallOutcome {
    let mut last = String::new();
    for attempt in 0..=policy.pauses.len() {
        if let Some(pause) = attempt.checked_sub(1).map(|i| policy.pauses[i]) {
            tokio::time::sleep(pause).await;
        }
        let request = match operation.kind {
            Kind::Read => http.get(format!("{base}/payments/{}", operation.payment)),
            Kind::Write => http
                .post(format!("{base}/payments"))
                .json(&debit(operation)),
        };
        let sent = request
            .header("x-lab-operation", operation.index)
            .header("x-retry-attempt", attempt)
            .send()
            .await;
        match sent {
            Ok(answer) if answer.status().as_u16() < 500 => {
                let status = answer.status().as_u16();
                let _ = answer.bytes().await;
                return CallOutcome::Answered(status);
            }
            Ok(answer) => last = answer.status().as_u16().to_string(),
            Err(error) if error.is_timeout() => last = "timeout".into(),
            Err(_) => last = "connection-error".into(),
        }
    }
    CallOutcome::GaveUp(last)
}
