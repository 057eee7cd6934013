//! The test server: the `payments.v1.Payments` service behind the layer,
//! whose `CreatePayment` does what its `account` says:
//! `code:N` answers status N, `final:N` answers status N marked final,
//! `sleep:MS` sleeps that long first; every run is counted per account.

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

struct Service<S> {
    runs: Runs,
    engine: Engine<S>,
}

#[tonic::async_trait]
impl<S: Store> Payments for Service<S> {
    async fn create_payment(
        &self,
        request: Request<CreatePaymentRequest>,
    ) -> Result<Response<Payment>, Status> {
        let message = request.into_inner();
        let account = message.account.clone();
        let (verb, arg) = account.split_once(':').unwrap_or((account.as_str(), ""));
        if verb == "sleep" {
            tokio::time::sleep(Duration::from_millis(arg.parse().unwrap_or(0))).await;
        }
        let executions = self.runs.bump(&account);
        if verb == "code" || verb == "final" {
            let code = Code::from_i32(arg.parse().unwrap_or(2));
            let mut status = Status::new(code, format!("answered {code:?}"));
            status
                .metadata_mut()
                .insert("x-run", MetadataValue::from(executions));
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
}

/// Starts the server over `engine`, guarding `CreatePayment`.
pub(crate) async fn start<S: Store>(engine: Engine<S>) -> TestServer {
    start_behind(engine, tower::layer::util::Identity::new()).await
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
    let runs = Runs::default();
    let layer = GrpcIdempotencyLayer::new(engine.clone())
        .with_methods([CREATE, "/payments.v1.Payments/ListPayments-not-unary"])
        .with_scope(|metadata, _| {
            metadata
                .get("x-tenant")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("default")
                .to_owned()
        });
    let service = PaymentsServer::new(Service {
        runs: runs.clone(),
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
        task,
    }
}
