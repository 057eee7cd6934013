//! [`RetryClient`]: a `reqwest::Client` that retries by policy, within a
//! deadline and a budget, and that asks the key-status service before it
//! sends a write again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::HeaderValue;
use reqwest::{Method, Request, Response};

use crate::breaker::BreakerState;
use crate::budget::{self, Denial, TokenBucket};
use crate::deadline::Deadline;
use crate::decision::{self, Class, Decision, GuardConflict, Observed, Situation};
use crate::key::{IDEMPOTENCY_KEY, RETRY_ATTEMPT};
use crate::late::{Late, Pending, Sent};
use crate::signal::Signal;
use crate::status::{Advice, StatusClient};
use crate::{ErrorKind, Failure, Kind, Policy, RetryBudget, RetryError, new_key, telemetry};

/// The largest guard problem body read to tell a 409's kind.
const PROBLEM_LIMIT: u64 = 16 * 1024;

/// A `reqwest::Client` that retries what is safe to retry, and only that.
///
/// - Reads (GET, HEAD, OPTIONS, TRACE, or an endpoint marked idempotent)
///   are retried on connect errors, timeouts, dropped connections, 408,
///   429 (with `Retry-After`), 500, 502, 503 and 504.
/// - Writes to an endpoint declared guarded ([`Policy::guarded_write`])
///   get an `Idempotency-Key` (a UUID v7, or the caller's own), made once
///   per call and sent with every attempt. After a failure that leaves the
///   outcome unknown (a timeout, a dropped connection, 502, 504) the
///   client asks the key-status service first and follows its advice;
///   without one, it resends with the same key, which the guard makes
///   safe. Fetching an answer the guard stored (after `replay` advice or
///   its `409 request-in-flight`) takes nothing from the retry budget.
/// - Writes without a key (an undeclared endpoint) are retried only on a
///   `429` with `Retry-After`, the server's word that it did nothing.
/// - Pauses are exponential with full jitter, drawn from the schedule
///   alone; one deadline covers the whole call, and a retry whose pause
///   and attempt do not fit in it is not made; retries draw on one retry
///   budget (the client's shared one, or the endpoint's own when its
///   policy sets one); an endpoint may have a circuit breaker.
/// - Every attempt carries `X-Retry-Attempt: <n>`, and is built afresh by
///   the closure given to [`RetryClient::send`], so no body is ever
///   reused after it was consumed.
///
/// Clones share their budgets and breakers.
///
/// ```no_run
/// use idempotency_client::{Policy, RetryClient, StatusClient};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = RetryClient::new(reqwest::Client::new())
///     .with_endpoint("create-payment", Policy::guarded_write())
///     .with_status_client(StatusClient::new("http://127.0.0.1:8080", "token-of-tenant-a"));
/// let payment = serde_json::json!({"amount": 4200, "currency": "EUR"});
/// let response = client
///     .send("create-payment", |http| {
///         http.post("http://127.0.0.1:3000/payments").json(&payment)
///     })
///     .await?;
/// println!("{}", response.status());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RetryClient {
    http: reqwest::Client,
    status: Option<StatusClient>,
    reads: Policy,
    writes: Policy,
    endpoints: HashMap<String, Policy>,
    budget: RetryBudget,
    state: Arc<State>,
}

/// What the client's calls share: the shared budget, and each endpoint's
/// bucket and breaker.
#[derive(Debug)]
struct State {
    budget: Arc<Mutex<TokenBucket>>,
    endpoints: Mutex<HashMap<String, Arc<EndpointState>>>,
}

#[derive(Debug)]
struct EndpointState {
    /// The one bucket the endpoint's calls fill and its retries drain: the
    /// client's shared one, or the endpoint's own.
    budget: Arc<Mutex<TokenBucket>>,
    /// Whether `budget` is the endpoint's own (the metric label).
    own_budget: bool,
    breaker: Option<Mutex<BreakerState>>,
}

impl State {
    fn new(budget: &RetryBudget) -> Arc<Self> {
        Arc::new(Self {
            budget: Arc::new(Mutex::new(TokenBucket::new(budget))),
            endpoints: Mutex::new(HashMap::new()),
        })
    }

    /// The endpoint's state, made from `policy` on its first call.
    fn endpoint(&self, name: &str, policy: &Policy) -> Arc<EndpointState> {
        let mut endpoints = lock(&self.endpoints);
        if let Some(state) = endpoints.get(name) {
            return Arc::clone(state);
        }
        let budget = match &policy.budget {
            Some(own) => Arc::new(Mutex::new(TokenBucket::new(own))),
            None => Arc::clone(&self.budget),
        };
        let state = Arc::new(EndpointState {
            budget,
            own_budget: policy.budget.is_some(),
            breaker: policy.breaker.map(|b| Mutex::new(BreakerState::new(b))),
        });
        endpoints.insert(name.to_owned(), Arc::clone(&state));
        state
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl RetryClient {
    /// A retrying client over `http`, with the default policies (no
    /// endpoint guarded), the default shared budget and no status service.
    pub fn new(http: reqwest::Client) -> Self {
        telemetry::describe();
        let budget = RetryBudget::default();
        Self {
            http,
            status: None,
            reads: Policy::new(Kind::Read),
            writes: Policy::new(Kind::Write),
            endpoints: HashMap::new(),
            budget,
            state: State::new(&budget),
        }
    }

    /// Sets the key-status service to ask after a write's outcome is
    /// unknown. Its token must belong to the scope the writes are made in.
    ///
    /// The default value is none: such writes are resent with the same
    /// key, which the guard makes safe, but an abandoned write then shows
    /// only as the guard's `409 outcome-unknown`.
    ///
    /// ```
    /// use idempotency_client::{RetryClient, StatusClient};
    ///
    /// let client = RetryClient::new(reqwest::Client::new())
    ///     .with_status_client(StatusClient::new("http://127.0.0.1:8080", "token-of-tenant-a"));
    /// # drop(client);
    /// ```
    #[must_use]
    pub fn with_status_client(mut self, status: StatusClient) -> Self {
        self.status = Some(status);
        self
    }

    /// Sets the client's retry budget, shared by every endpoint whose
    /// policy has no budget of its own ([`Policy::with_budget`]). Each
    /// retry takes a token from exactly one bucket: the endpoint's own if
    /// it has one, else this one.
    ///
    /// The default value is a share of 0.1 (one retry per ten calls), at
    /// most 10 saved up, full at start: over the first `n` calls, at most
    /// `0.1 × n + 10` retries.
    ///
    /// ```
    /// use idempotency_client::{RetryBudget, RetryClient};
    ///
    /// let client = RetryClient::new(reqwest::Client::new()).with_budget(RetryBudget::new(0.05));
    /// assert_eq!(client.budget().share(), 0.05);
    /// ```
    #[must_use]
    pub fn with_budget(mut self, budget: RetryBudget) -> Self {
        self.budget = budget;
        self.state = State::new(&budget);
        self
    }

    /// Sets the policy of reads on endpoints without a policy of their
    /// own.
    ///
    /// The default value is `Policy::new(Kind::Read)`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotency_client::{Kind, Policy, RetryClient};
    ///
    /// let client = RetryClient::new(reqwest::Client::new())
    ///     .with_read_policy(Policy::new(Kind::Read).with_deadline(Duration::from_secs(1)));
    /// # drop(client);
    /// ```
    #[must_use]
    pub fn with_read_policy(mut self, policy: Policy) -> Self {
        self.reads = policy;
        self.state = State::new(&self.budget);
        self
    }

    /// Sets the policy of writes on endpoints without a policy of their
    /// own.
    ///
    /// The default value is `Policy::new(Kind::Write)`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotency_client::{Kind, Policy, RetryClient};
    ///
    /// let client = RetryClient::new(reqwest::Client::new())
    ///     .with_write_policy(Policy::new(Kind::Write).with_deadline(Duration::from_secs(5)));
    /// # drop(client);
    /// ```
    #[must_use]
    pub fn with_write_policy(mut self, policy: Policy) -> Self {
        self.writes = policy;
        self.state = State::new(&self.budget);
        self
    }

    /// Sets the policy of one endpoint, whatever the method of its calls.
    ///
    /// The default value is the read or the write policy, by method. An
    /// endpoint without a policy of its own takes its budget and breaker
    /// from the policy of its first call.
    ///
    /// ```
    /// use idempotency_client::{CircuitBreaker, Policy, RetryClient};
    ///
    /// let client = RetryClient::new(reqwest::Client::new()).with_endpoint(
    ///     "create-payment",
    ///     Policy::guarded_write().with_circuit_breaker(CircuitBreaker::new(5)),
    /// );
    /// # drop(client);
    /// ```
    #[must_use]
    pub fn with_endpoint(mut self, endpoint: impl Into<String>, policy: Policy) -> Self {
        self.endpoints.insert(endpoint.into(), policy);
        self.state = State::new(&self.budget);
        self
    }

    /// Returns the `reqwest::Client` requests are sent with.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// Returns the client-wide retry budget.
    pub fn budget(&self) -> RetryBudget {
        self.budget
    }

    /// Returns the policy a call to `endpoint` with `method` follows.
    pub fn policy(&self, endpoint: &str, method: &Method) -> &Policy {
        self.endpoints.get(endpoint).unwrap_or(if is_safe(method) {
            &self.reads
        } else {
            &self.writes
        })
    }

    /// Sends one logical request to `endpoint` (a name of your choosing,
    /// such as `create-payment`: it selects the policy, the budget and the
    /// breaker, and labels the metrics), retrying it by the endpoint's
    /// policy. `request` builds the request afresh for every attempt, so
    /// bodies are never reused; give it the same request every time.
    ///
    /// A write to an endpoint declared guarded gets an `Idempotency-Key`
    /// (a UUID v7) unless `request` sets one; that key is sent with every
    /// attempt. A write to another endpoint is sent without one (unless
    /// `request` sets it) and retried only on a `429` with `Retry-After`.
    ///
    /// Any answer the policy does not retry (success, a 4xx other than 408
    /// and 429, a 429 without `Retry-After`) comes back as `Ok`, as does a
    /// retried call's final answer.
    ///
    /// # Errors
    ///
    /// A [`RetryError`] when the call gives up: its [`ErrorKind`] says why
    /// (budget exhausted, deadline exceeded, attempts exhausted, circuit
    /// open, outcome unknown, outcome still running, a failed write without
    /// a key, an invalid request), and [`RetryError::last`] holds the last failure (an
    /// answer, or a transport error).
    pub async fn send<F>(&self, endpoint: &str, request: F) -> Result<Response, RetryError>
    where
        F: Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    {
        let started = Instant::now();
        let mut call = Call::new(endpoint);
        let first = match request(&self.http).build() {
            Ok(first) => first,
            Err(error) => {
                call.last = Some(Failure::Transport(error));
                return Err(call.stop(ErrorKind::InvalidRequest));
            }
        };
        let policy = self.policy(endpoint, first.method());
        let (class, key) = identify(&first, policy);
        call.class = Some(class);
        call.key = key
            .as_ref()
            .map(|k| String::from_utf8_lossy(k.as_bytes()).into_owned());
        let endpoint_state = self.state.endpoint(endpoint, policy);
        lock(&endpoint_state.budget).deposit();
        let deadline = Deadline::after(started, policy.deadline);
        let status_service = match (&self.status, class) {
            (Some(status), Class::KeyedWrite) => Some(status),
            _ => None,
        };

        let accept = Accept {
            class,
            status_service: status_service.is_some(),
            policy,
            deadline,
        };
        let mut late = Late::default();
        let mut pending = Some(first);
        // What the last attempt said about the server: which tokens a
        // retry after it may take.
        let mut signal = Signal::ServerError;
        loop {
            if let Some(breaker) = &endpoint_state.breaker
                && lock(breaker).admit(Instant::now()).is_err()
            {
                return match last_chance(&mut late, &accept, deadline).await {
                    Some(answer) => Ok(call.answer(answer)),
                    None => Err(call.stop(ErrorKind::CircuitOpen)),
                };
            }
            let mut attempt = match pending
                .take()
                .map_or_else(|| request(&self.http).build(), Ok)
            {
                Ok(attempt) => attempt,
                Err(error) => {
                    call.last = Some(Failure::Transport(error));
                    return Err(call.stop(ErrorKind::InvalidRequest));
                }
            };
            // reqwest cuts the attempt off at the deadline (or the
            // request's own timeout); the call waits `patience` for it
            // before it goes on, and keeps it running (late.rs).
            let remaining = deadline.remaining();
            let patience = policy.attempt_room().min(remaining);
            prepare(&mut attempt, call.attempts, key.as_ref(), remaining);
            let mut running: Pending = Box::pin(self.http.execute(attempt));
            let waited = beside(
                &mut late,
                &accept,
                tokio::time::timeout(patience, &mut running),
            )
            .await;
            let (mut outcome, result) = match waited {
                Err(answer) => return Ok(call.answer(answer)),
                Ok(Ok(sent)) => {
                    let (outcome, result) = classify(sent, class).await;
                    (outcome, Some(result))
                }
                Ok(Err(_)) => {
                    late.keep(running);
                    call.last = Some(Failure::TimedOut);
                    (Observed::TimedOut, None)
                }
            };
            telemetry::attempt(endpoint, call.attempts, outcome);
            call.attempts += 1;
            if let Some(seen) = Signal::of(outcome) {
                signal = seen;
                lock(&endpoint_state.budget).observe(seen);
            }
            if let Some(breaker) = &endpoint_state.breaker {
                lock(breaker).record(!outcome.is_failure(), Instant::now());
            }
            let mut current = result;
            loop {
                if class != Class::Read && outcome.may_have_run() {
                    call.may_have_run = true;
                }
                let at = Situation {
                    class,
                    status_service: status_service.is_some(),
                    attempts: call.attempts,
                    remaining: deadline.remaining(),
                    policy,
                    sample: rand::random::<f64>(),
                };
                let decision = decision::decide(outcome, &at);
                tracing::debug!(
                    endpoint,
                    attempts = call.attempts,
                    ?outcome,
                    ?decision,
                    "retry decision"
                );
                match (decision, current.take()) {
                    (Decision::Return, Some(Ok(response))) => return Ok(call.answer(response)),
                    (_, result) => call.keep(result),
                }
                let stop = match decision {
                    Decision::Return => ErrorKind::NotRetryable,
                    Decision::Stop(kind) => kind,
                    Decision::AskStatus { after } => {
                        let asked = beside(&mut late, &accept, async {
                            pause(after).await;
                            match (status_service, &call.key) {
                                (Some(status), Some(key)) => {
                                    ask(status, key, endpoint, deadline).await
                                }
                                _ => Observed::StatusUnavailable,
                            }
                        })
                        .await;
                        match asked {
                            Ok(advice) => outcome = advice,
                            Err(answer) => return Ok(call.answer(answer)),
                        }
                        continue;
                    }
                    Decision::Resend { after } => {
                        match budget::take_retry(&endpoint_state.budget, signal) {
                            Ok(()) => {
                                if let Err(answer) = beside(&mut late, &accept, pause(after)).await
                                {
                                    return Ok(call.answer(answer));
                                }
                                break;
                            }
                            Err(Denial::Budget) => {
                                let label = if endpoint_state.own_budget {
                                    "endpoint"
                                } else {
                                    "shared"
                                };
                                telemetry::budget_refusal(endpoint, label);
                                ErrorKind::BudgetExhausted
                            }
                            Err(Denial::Overload) => {
                                telemetry::overload_refusal(endpoint);
                                ErrorKind::Overloaded
                            }
                        }
                    }
                    // The answer is stored (or about to be): no retry budget.
                    Decision::Fetch { after } => {
                        if let Err(answer) = beside(&mut late, &accept, pause(after)).await {
                            return Ok(call.answer(answer));
                        }
                        break;
                    }
                };
                // Giving up: an attempt still running may yet answer.
                return match last_chance(&mut late, &accept, deadline).await {
                    Some(answer) => Ok(call.answer(answer)),
                    None => Err(call.stop(stop)),
                };
            }
        }
    }
}

/// The bookkeeping of one call, for its error and its metrics.
struct Call<'a> {
    endpoint: &'a str,
    /// Known once the first request is built.
    class: Option<Class>,
    attempts: u32,
    key: Option<String>,
    may_have_run: bool,
    last: Option<Failure>,
}

impl<'a> Call<'a> {
    fn new(endpoint: &'a str) -> Self {
        Self {
            endpoint,
            class: None,
            attempts: 0,
            key: None,
            may_have_run: false,
            last: None,
        }
    }

    /// Keeps what an attempt got as the last failure.
    fn keep(&mut self, result: Option<Result<Response, reqwest::Error>>) {
        match result {
            Some(Ok(response)) => self.last = Some(Failure::Answer(response)),
            Some(Err(error)) => self.last = Some(Failure::Transport(error)),
            None => {}
        }
    }

    fn answer(self, response: Response) -> Response {
        let outcome = telemetry::answered(response.status().as_u16());
        telemetry::call(self.endpoint, outcome, self.attempts > 1);
        response
    }

    fn stop(self, kind: ErrorKind) -> RetryError {
        telemetry::call(self.endpoint, kind.as_str(), self.attempts > 1);
        let class = match self.class {
            Some(Class::Read) => "read",
            Some(Class::KeyedWrite | Class::UnkeyedWrite) => "write",
            None => "unknown",
        };
        telemetry::given_up(self.endpoint, class, kind);
        RetryError {
            kind,
            endpoint: self.endpoint.to_owned(),
            attempts: self.attempts,
            key: self.key,
            may_have_run: self.may_have_run,
            last: self.last,
        }
    }
}

/// How a call is retried, and the key its attempts carry: the caller's,
/// or a new one for a write to an endpoint declared guarded.
fn identify(first: &Request, policy: &Policy) -> (Class, Option<HeaderValue>) {
    if is_safe(first.method()) || policy.idempotent {
        return (Class::Read, None);
    }
    let key = match first.headers().get(IDEMPOTENCY_KEY) {
        Some(theirs) => Some(theirs.clone()),
        None if policy.guarded => HeaderValue::from_str(&new_key()).ok(),
        None => None,
    };
    match key {
        Some(key) => (Class::KeyedWrite, Some(key)),
        None => (Class::UnkeyedWrite, None),
    }
}

/// GET, HEAD, OPTIONS and TRACE: the safe methods of RFC 9110.
fn is_safe(method: &Method) -> bool {
    [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE].contains(method)
}

/// Numbers the attempt, sets the key, and bounds its time.
fn prepare(request: &mut Request, attempt: u32, key: Option<&HeaderValue>, room: Duration) {
    let headers = request.headers_mut();
    headers.insert(RETRY_ATTEMPT, HeaderValue::from(attempt));
    if let Some(key) = key {
        headers.insert(IDEMPOTENCY_KEY, key.clone());
    }
    let timeout = request.timeout().map_or(room, |theirs| room.min(*theirs));
    *request.timeout_mut() = Some(timeout);
}

/// What a late attempt's answer must be to end the call: one the policy
/// hands back at once (late.rs).
struct Accept<'a> {
    class: Class,
    status_service: bool,
    policy: &'a Policy,
    deadline: Deadline,
}

impl Accept<'_> {
    /// The answer to hand back, if `sent` is one.
    async fn take(&self, sent: Sent) -> Option<Response> {
        let (outcome, result) = classify(sent, self.class).await;
        let at = Situation {
            class: self.class,
            status_service: self.status_service,
            attempts: 1,
            remaining: self.deadline.remaining(),
            policy: self.policy,
            sample: 0.0,
        };
        match (decision::decide(outcome, &at), result) {
            (Decision::Return, Ok(response)) => Some(response),
            _ => None,
        }
    }
}

/// Runs `work` while the late attempts go on; the first late answer to
/// hand back ends it (`Err`).
async fn beside<T>(
    late: &mut Late,
    accept: &Accept<'_>,
    work: impl Future<Output = T>,
) -> Result<T, Response> {
    let mut work = std::pin::pin!(work);
    loop {
        if late.is_empty() {
            return Ok(work.await);
        }
        tokio::select! {
            biased;
            done = &mut work => return Ok(done),
            Some(sent) = late.next() => {
                if let Some(answer) = accept.take(sent).await {
                    return Err(answer);
                }
            }
        }
    }
}

/// Waits, until the deadline, for a late attempt's answer to hand back.
async fn last_chance(late: &mut Late, accept: &Accept<'_>, deadline: Deadline) -> Option<Response> {
    let until = tokio::time::sleep(deadline.remaining());
    let mut until = std::pin::pin!(until);
    while !late.is_empty() {
        tokio::select! {
            biased;
            Some(sent) = late.next() => {
                if let Some(answer) = accept.take(sent).await {
                    return Some(answer);
                }
            }
            () = &mut until => return None,
        }
    }
    None
}

async fn pause(after: Duration) {
    if !after.is_zero() {
        tokio::time::sleep(after).await;
    }
}

/// What an attempt got, reduced to what the policy needs. A guard's 409
/// for a keyed write is read (it is small) to tell in-flight from
/// outcome-unknown, and handed back rebuilt.
async fn classify(
    sent: Result<Response, reqwest::Error>,
    class: Class,
) -> (Observed, Result<Response, reqwest::Error>) {
    let response = match sent {
        Ok(response) => response,
        Err(error) => {
            let outcome = if error.is_connect() {
                Observed::ConnectFailed
            } else if error.is_timeout() {
                Observed::TimedOut
            } else if error.is_redirect() || error.is_builder() || error.is_decode() {
                Observed::Broken
            } else {
                Observed::Dropped
            };
            return (outcome, Err(error));
        }
    };
    let status = response.status().as_u16();
    let retry_after = crate::retry_after::of(response.headers());
    let (conflict, response) = if status == 409 && class == Class::KeyedWrite {
        match guard_conflict(response).await {
            Ok(read) => read,
            Err(error) => return (Observed::Dropped, Err(error)),
        }
    } else {
        (None, response)
    };
    let outcome = Observed::Answer {
        status,
        retry_after,
        conflict,
    };
    (outcome, Ok(response))
}

#[derive(serde::Deserialize)]
struct ProblemType {
    #[serde(rename = "type")]
    problem_type: String,
}

/// Reads a small `application/problem+json` 409 to learn whether it is
/// one of the guard's, and rebuilds the response around the body read.
async fn guard_conflict(
    response: Response,
) -> Result<(Option<GuardConflict>, Response), reqwest::Error> {
    let is_problem = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/problem+json"));
    let small = response
        .content_length()
        .is_some_and(|n| n <= PROBLEM_LIMIT);
    if !(is_problem && small) {
        return Ok((None, response));
    }
    let (status, version, url) = (
        response.status(),
        response.version(),
        response.url().clone(),
    );
    let headers = response.headers().clone();
    let body = response.bytes().await?;
    let conflict = serde_json::from_slice::<ProblemType>(&body)
        .ok()
        .and_then(|problem| match problem.problem_type.as_str() {
            "urn:idempotency:request-in-flight" => Some(GuardConflict::InFlight),
            "urn:idempotency:outcome-unknown" => Some(GuardConflict::OutcomeUnknown),
            _ => None,
        });
    use reqwest::ResponseBuilderExt as _;
    let mut rebuilt = http::Response::builder()
        .status(status)
        .version(version)
        .url(url)
        .body(body.clone())
        .unwrap_or_else(|_| http::Response::new(body));
    *rebuilt.status_mut() = status;
    *rebuilt.headers_mut() = headers;
    Ok((conflict, Response::from(rebuilt)))
}

/// Asks the key-status service what became of `key`.
async fn ask(status: &StatusClient, key: &str, endpoint: &str, deadline: Deadline) -> Observed {
    let remaining = deadline.remaining();
    let answer = tokio::time::timeout(remaining, status.details(key, None)).await;
    let (outcome, label) = match answer {
        Ok(Ok(None)) => (
            Observed::Advised {
                advice: Advice::Retry,
                retry_after: Duration::ZERO,
            },
            "retry",
        ),
        Ok(Ok(Some(details))) => {
            let label = match details.advice {
                Advice::Wait => "wait",
                Advice::Replay => "replay",
                Advice::Reconcile => "reconcile",
                Advice::Retry => "retry",
            };
            let retry_after = Duration::from_secs(details.retry_after_seconds.unwrap_or(1));
            (
                Observed::Advised {
                    advice: details.advice,
                    retry_after,
                },
                label,
            )
        }
        Ok(Err(error)) => {
            tracing::warn!(endpoint, %error, "the key-status service failed; resending with the same key");
            (Observed::StatusUnavailable, "unavailable")
        }
        Err(_) => (Observed::StatusUnavailable, "unavailable"),
    };
    telemetry::status_check(endpoint, label);
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_methods_are_reads() {
        for method in [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE] {
            assert!(is_safe(&method), "{method}");
        }
        for method in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            assert!(!is_safe(&method), "{method}");
        }
    }

    #[test]
    fn endpoints_pick_their_policy_else_one_by_method() {
        let special = Policy::new(Kind::Write).with_max_attempts(7);
        let client = RetryClient::new(reqwest::Client::new()).with_endpoint("special", special);
        assert_eq!(client.policy("special", &Method::GET).max_attempts(), 7);
        assert_eq!(client.policy("other", &Method::GET).kind(), Kind::Read);
        assert_eq!(client.policy("other", &Method::POST).kind(), Kind::Write);
    }

    #[test]
    fn only_guarded_writes_get_a_key() {
        let http = reqwest::Client::new();
        let writes = Policy::guarded_write();
        let post = http.post("http://127.0.0.1:1/").build().unwrap();
        let (class, key) = identify(&post, &writes);
        assert_eq!(class, Class::KeyedWrite);
        assert_eq!(key.unwrap().len(), 36, "a UUID");
        let theirs = http
            .post("http://127.0.0.1:1/")
            .header("Idempotency-Key", "order-1")
            .build()
            .unwrap();
        assert_eq!(
            identify(&theirs, &writes),
            (Class::KeyedWrite, Some(HeaderValue::from_static("order-1")))
        );
        // Undeclared: no key of ours; the caller's own is kept.
        let undeclared = Policy::new(Kind::Write);
        assert_eq!(identify(&post, &undeclared), (Class::UnkeyedWrite, None));
        assert_eq!(
            identify(&theirs, &undeclared),
            (Class::KeyedWrite, Some(HeaderValue::from_static("order-1")))
        );
        assert_eq!(
            identify(&post, &writes.clone().with_idempotent(true)),
            (Class::Read, None)
        );
        let get = http.get("http://127.0.0.1:1/").build().unwrap();
        assert_eq!(identify(&get, &writes), (Class::Read, None));
    }

    #[test]
    fn attempts_are_numbered_keyed_and_bounded() {
        let http = reqwest::Client::new();
        let mut request = http
            .post("http://127.0.0.1:1/")
            .timeout(Duration::from_secs(9))
            .build()
            .unwrap();
        let key = HeaderValue::from_static("k-1");
        prepare(&mut request, 2, Some(&key), Duration::from_millis(300));
        assert_eq!(request.headers()[RETRY_ATTEMPT], "2");
        assert_eq!(request.headers()[IDEMPOTENCY_KEY], "k-1");
        assert_eq!(request.timeout(), Some(&Duration::from_millis(300)));
        // A shorter timeout of the caller's is kept.
        let mut request = http
            .get("http://127.0.0.1:1/")
            .timeout(Duration::from_millis(50))
            .build()
            .unwrap();
        prepare(&mut request, 0, None, Duration::from_millis(300));
        assert_eq!(request.timeout(), Some(&Duration::from_millis(50)));
        assert!(request.headers().get(IDEMPOTENCY_KEY).is_none());
    }
}
