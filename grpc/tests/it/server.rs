//! The test server: the `payments.v1.Payments` service behind the layer,
//! whose `CreatePayment` does what its `account` says (anything after a
//! second `:` only makes the account unique):
//! `code:N` answers status N (message `answered <Code>`, an `ErrorInfo`
//! with reason `handler-N` and the run's count in `x-run`), `final:N` the
//! same marked final, `once:N` answers status N on its first run and the
//! payment on later ones, `sleep:MS` sleeps that long first, `hold:NAME`
//! waits until the test opens its gate ([`TestServer::open`]), `step:NAME`
//! records the step `charge` through the run's handle from the request's
//! extensions (counted at `NAME/charge` when it runs) and on its first run
//! answers `FAILED_PRECONDITION` marked outcome unknown (it lost track: the key is
//! left abandoned with the step), on later ones the payment; every run
//! is counted per account (a held run when it starts).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::Stream;
use idempotency_grpc::GrpcIdempotencyLayer;
use idempotency_guard::{Engine, Store};
use tonic::metadata::MetadataValue;
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

pub(crate) mod proto {
    #![allow(missing_docs, unreachable_pub, clippy::all)]
    tonic::include_proto!("payments.v1");
}

use proto::payments_server::{Payments, PaymentsServer};
use proto::{CreatePaymentRequest, ListPaymentsRequest, Payment, Refund, RefundPaymentRequest};

pub(crate) const CREATE: &str = "/payments.v1.Payments/CreatePayment";

/// Runs per account (or per refund's payment).
#[derive(Clone, Default)]
pub(crate) struct Runs(Arc<Mutex<HashMap<String, u64>>>);

impl Runs {
    fn bump(&self, account: &str) -> u64 {
        let mut runs = self.0.lock().unwrap();
        let n = runs.entry(account.to_owned()).or_default();
        *n += 1;
        *n
    }

    pub(crate) fn of(&self, account: &str) -> u64 {
        self.0.lock().unwrap().get(account).copied().unwrap_or(0)
    }
}

/// The gates held runs wait on, per account.
#[derive(Clone, Default)]
pub(crate) struct Gates(Arc<Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>>);

impl Gates {
    fn of(&self, account: &str) -> Arc<tokio::sync::Semaphore> {
        let mut gates = self.0.lock().unwrap();
        Arc::clone(
            gates
                .entry(account.to_owned())
                .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(0))),
        )
    }
}

/// The status the handler answers for `code:N` (and `final:N`, `once:N`)
/// on its `run`-th run.
pub(crate) fn handler_status(code: Code, run: u64) -> Status {
    let details = ErrorDetails::with_error_info(
        format!("handler-{}", code as i32),
        "payments.test",
        HashMap::new(),
    );
    let mut status = Status::with_error_details(code, format!("answered {code:?}"), details);
    status
        .metadata_mut()
        .insert("x-run", MetadataValue::from(run));
    status
}

struct Service<S> {
    runs: Runs,
    gates: Gates,
    engine: Engine<S>,
}

impl<S> Service<S> {
    /// `tx:MODE`: writes a row for the account through `tx` (in table
    /// `grpc_tx_writes`, which the transactional test creates), then, by
    /// MODE: `ok` answers the payment, `14` answers `UNAVAILABLE`,
    /// `slowonce` sleeps 3 s on its first run (to be cut off) and answers
    /// the payment on later ones.
    async fn write_in(
        &self,
        mut tx: idempotency_guard::Tx,
        message: CreatePaymentRequest,
    ) -> Result<Response<Payment>, Status> {
        let account = message.account.clone();
        let run = self.runs.bump(&account);
        sqlx::query("insert into grpc_tx_writes (account) values ($1)")
            .bind(&account)
            .execute(&mut *tx)
            .await
            .map_err(|error| Status::internal(error.to_string()))?;
        match account.split(':').nth(1) {
            Some("14") => return Err(handler_status(Code::Unavailable, run)),
            Some("slowonce") if run == 1 => tokio::time::sleep(Duration::from_secs(3)).await,
            _ => {}
        }
        drop(tx);
        Ok(Response::new(Payment {
            id: format!("pay-{}", uuid::Uuid::new_v4()),
            account,
            amount_cents: message.amount_cents,
            currency: message.currency,
            executions: run,
        }))
    }
}

impl<S> Service<S> {
    /// `step:NAME`: the step `charge` (counted at `NAME/charge` when it
    /// runs), then, on the first run, a status marked outcome unknown.
    async fn with_step(
        &self,
        run: Option<idempotency_guard::engine::Run>,
        message: CreatePaymentRequest,
    ) -> Result<Response<Payment>, Status> {
        let account = message.account.clone();
        let executions = self.runs.bump(&account);
        let run = run.ok_or_else(|| Status::internal("no run in the request's extensions"))?;
        let (runs, charged) = (self.runs.clone(), format!("{account}/charge"));
        let charge: u64 = run
            .step("charge", || async move { runs.bump(&charged) })
            .await
            .map_err(idempotency_grpc::step_status)?;
        if executions == 1 {
            // A code the outcome table would store: the marker abandons it.
            return Err(idempotency_grpc::mark_outcome_unknown(
                Status::failed_precondition("lost track after the charge"),
            ));
        }
        Ok(Response::new(Payment {
            id: format!("pay-charge-{charge}-{}", run.derived_key("charge")),
            account,
            amount_cents: message.amount_cents,
            currency: message.currency,
            executions,
        }))
    }
}

#[tonic::async_trait]
impl<S: Store> Payments for Service<S> {
    async fn create_payment(
        &self,
        request: Request<CreatePaymentRequest>,
    ) -> Result<Response<Payment>, Status> {
        // Transactional mode: `tx:MODE` writes a row through the call's
        // transaction, then answers as MODE says.
        let tx = if request.get_ref().account.starts_with("tx:") {
            Some(idempotency_grpc::tx(&request).await?)
        } else {
            None
        };
        let run = request
            .extensions()
            .get::<idempotency_guard::engine::Run>()
            .cloned();
        let message = request.into_inner();
        let account = message.account.clone();
        if account.starts_with("step:") {
            return self.with_step(run, message).await;
        }
        if let Some(tx) = tx {
            return self.write_in(tx, message).await;
        }
        let (verb, arg) = account.split_once(':').unwrap_or((account.as_str(), ""));
        let arg = arg.split(':').next().unwrap_or_default();
        if verb == "sleep" {
            tokio::time::sleep(Duration::from_millis(arg.parse().unwrap_or(0))).await;
        }
        if verb == "hold" {
            self.runs.bump(&account);
            let gate = self.gates.of(&account);
            let _ = gate.acquire().await.unwrap();
        }
        let executions = if verb == "hold" {
            self.runs.of(&account)
        } else {
            self.runs.bump(&account)
        };
        if verb == "code" || verb == "final" || (verb == "once" && executions == 1) {
            let status = handler_status(Code::from_i32(arg.parse().unwrap_or(2)), executions);
            return Err(if verb == "final" {
                idempotency_grpc::mark_final(status)
            } else {
                status
            });
        }
        let mut response = Response::new(Payment {
            id: format!("pay-{}", uuid::Uuid::new_v4()),
            account: message.account,
            amount_cents: message.amount_cents,
            currency: message.currency,
            executions,
        });
        response
            .metadata_mut()
            .insert("x-payment-cost", MetadataValue::from_static("3"));
        response.metadata_mut().insert_bin(
            "x-trace-bin",
            tonic::metadata::MetadataValue::from_bytes(b"\x00\x01"),
        );
        Ok(response)
    }

    async fn refund_payment(
        &self,
        request: Request<RefundPaymentRequest>,
    ) -> Result<Response<Refund>, Status> {
        let runs = self.runs.clone();
        let payment = request.get_ref().payment_id.clone();
        let amount = request.get_ref().amount_cents;
        idempotency_grpc::run(
            &self.engine,
            &request,
            |m| m.request_id.clone(),
            move || async move {
                let n = runs.bump(&payment);
                Ok(Response::new(Refund {
                    id: format!("refund-{n}"),
                    payment_id: payment,
                    amount_cents: amount,
                }))
            },
        )
        .await
    }

    type ListPaymentsStream = Pin<Box<dyn Stream<Item = Result<Payment, Status>> + Send>>;

    async fn list_payments(
        &self,
        _request: Request<ListPaymentsRequest>,
    ) -> Result<Response<Self::ListPaymentsStream>, Status> {
        self.runs.bump("list");
        let payments = (1..=3).map(|n| {
            Ok(Payment {
                id: format!("pay-{n}"),
                ..Payment::default()
            })
        });
        Ok(Response::new(Box::pin(futures_util::stream::iter(
            payments,
        ))))
    }
}

/// A running test server.
pub(crate) struct TestServer {
    pub(crate) address: SocketAddr,
    pub(crate) runs: Runs,
    gates: Gates,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    /// A client of the server.
    pub(crate) async fn client(
        &self,
    ) -> proto::payments_client::PaymentsClient<tonic::transport::Channel> {
        proto::payments_client::PaymentsClient::connect(format!("http://{}", self.address))
            .await
            .unwrap()
    }

    /// Lets the runs held at `account`'s gate (`hold:NAME`) go on.
    pub(crate) fn open(&self, account: &str) {
        self.gates
            .of(account)
            .add_permits(tokio::sync::Semaphore::MAX_PERMITS / 2);
    }

    /// Waits until `account` has started `runs` runs.
    pub(crate) async fn started(&self, account: &str, runs: u64) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while self.runs.of(account) < runs {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{account} never started its run {runs}"));
    }
}

/// Starts the same service with no guard in front: tonic's own framing.
pub(crate) async fn start_plain<S: Store>(engine: Engine<S>) -> TestServer {
    let (runs, gates) = (Runs::default(), Gates::default());
    let service = PaymentsServer::new(Service {
        runs: runs.clone(),
        gates: gates.clone(),
        engine,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    TestServer {
        address,
        runs,
        gates,
        task,
    }
}

/// Starts the server over `engine`, guarding `CreatePayment`.
pub(crate) async fn start<S: Store>(engine: Engine<S>) -> TestServer {
    start_behind(engine, tower::layer::util::Identity::new()).await
}

/// [`start`] with the layer's limits set: the largest request message and
/// the largest answer kept for replay.
pub(crate) async fn start_limited<S: Store>(
    engine: Engine<S>,
    request_limit: usize,
    stored_limit: usize,
) -> TestServer {
    start_configured(engine, tower::layer::util::Identity::new(), move |layer| {
        layer
            .with_request_limit(request_limit)
            .with_stored_response_limit(stored_limit)
    })
    .await
}

/// [`start`] with `outer` in front of the guard.
pub(crate) async fn start_behind<S, L>(engine: Engine<S>, outer: L) -> TestServer
where
    S: Store,
    L: tower::Layer<idempotency_grpc::GrpcIdempotencyService<S, tonic::service::Routes>>
        + Clone
        + Send
        + 'static,
    L::Service: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    <L::Service as tower::Service<http::Request<tonic::body::Body>>>::Future: Send,
{
    start_configured(engine, outer, |layer| layer).await
}

/// [`start_behind`], the layer as `configure` sets it.
async fn start_configured<S, L>(
    engine: Engine<S>,
    outer: L,
    configure: impl FnOnce(GrpcIdempotencyLayer<S>) -> GrpcIdempotencyLayer<S>,
) -> TestServer
where
    S: Store,
    L: tower::Layer<idempotency_grpc::GrpcIdempotencyService<S, tonic::service::Routes>>
        + Clone
        + Send
        + 'static,
    L::Service: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    <L::Service as tower::Service<http::Request<tonic::body::Body>>>::Future: Send,
{
    let (runs, gates) = (Runs::default(), Gates::default());
    let layer = GrpcIdempotencyLayer::new(engine.clone())
        .with_methods([CREATE, "/payments.v1.Payments/ListPayments-not-unary"])
        .with_scope(|metadata, _| {
            metadata
                .get("x-tenant")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("default")
                .to_owned()
        });
    let layer = configure(layer);
    let service = PaymentsServer::new(Service {
        runs: runs.clone(),
        gates: gates.clone(),
        engine,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(outer)
            .layer(layer)
            .add_service(service)
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    TestServer {
        address,
        runs,
        gates,
        task,
    }
}
