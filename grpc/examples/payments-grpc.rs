//! `payments-grpc`: one unary method, `CreatePayment`, guarded by the
//! `idempotency-key` metadata entry, counting its executions.
//!
//! ```text
//! cargo run -p idempotency-grpc --example payments-grpc
//! ```
//!
//! Reads `DATABASE_URL` (default `sqlite://payments-grpc.db?mode=rwc`;
//! `postgres://...` works too) and `LISTEN` (default `127.0.0.1:50051`).
//! The scope is the `x-tenant` metadata entry, `default` when absent.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idempotency_grpc::GrpcIdempotencyLayer;
use idempotency_guard::Engine;
use idempotency_guard::store::AnyStore;
use tonic::{Request, Response, Status};

mod proto {
    #![allow(missing_docs, unreachable_pub, clippy::all)]
    tonic::include_proto!("payments.v1");
}

use proto::payments_server::{Payments, PaymentsServer};
use proto::{CreatePaymentRequest, ListPaymentsRequest, Payment, Refund, RefundPaymentRequest};

struct PaymentsService {
    executions: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl Payments for PaymentsService {
    async fn create_payment(
        &self,
        request: Request<CreatePaymentRequest>,
    ) -> Result<Response<Payment>, Status> {
        let request = request.into_inner();
        if request.amount_cents <= 0 {
            // Refused before any work: not stored, the corrected call runs.
            return Err(Status::invalid_argument("amount_cents must be positive"));
        }
        let executions = self.executions.fetch_add(1, Ordering::SeqCst) + 1;
        tracing::info!(executions, account = %request.account, "payment created");
        Ok(Response::new(Payment {
            id: format!("pay_{}", uuid::Uuid::new_v4().simple()),
            account: request.account,
            amount_cents: request.amount_cents,
            currency: request.currency,
            executions,
        }))
    }

    async fn refund_payment(
        &self,
        _request: Request<RefundPaymentRequest>,
    ) -> Result<Response<Refund>, Status> {
        Err(Status::unimplemented(
            "refunds are not part of this example",
        ))
    }

    type ListPaymentsStream = futures_util::stream::Empty<Result<Payment, Status>>;

    async fn list_payments(
        &self,
        _request: Request<ListPaymentsRequest>,
    ) -> Result<Response<Self::ListPaymentsStream>, Status> {
        Ok(Response::new(futures_util::stream::empty()))
    }
}

/// The exit code of a configuration error (as clap's own usage errors).
const CONFIGURATION_ERROR: u8 = 2;

/// Configuration errors exit 2 and runtime failures 1, each with one line
/// on standard error (no backtrace).
#[tokio::main]
async fn main() -> std::process::ExitCode {
    // Colours only on a terminal and without NO_COLOR: a log file stays plain.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stdout())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt().with_ansi(colour).init();
    let settings = match settings() {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("payments-grpc: {error:#}");
            return std::process::ExitCode::from(CONFIGURATION_ERROR);
        }
    };
    match run(settings).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("payments-grpc: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `DATABASE_URL` and `LISTEN`, checked.
fn settings() -> anyhow::Result<(String, std::net::SocketAddr)> {
    use idempotency_guard::store::{SettingNames, StoreOptions};
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "sqlite://payments-grpc.db?mode=rwc".to_owned());
    StoreOptions::sql(&url).check(SettingNames::ENVIRONMENT)?;
    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:50051".to_owned());
    let listen = listen.parse().map_err(|_| {
        anyhow::anyhow!("LISTEN must be an address such as 127.0.0.1:50051, not {listen:?}")
    })?;
    Ok((url, listen))
}

async fn run((url, listen): (String, std::net::SocketAddr)) -> anyhow::Result<()> {
    let store = AnyStore::connect(&url).await?;
    store.migrate().await?;
    let engine = Engine::new(store);
    let drain = engine.drain();
    let layer = GrpcIdempotencyLayer::new(engine)
        .with_methods(["/payments.v1.Payments/CreatePayment"])
        .with_scope(|metadata, _extensions| {
            metadata
                .get("x-tenant")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("default")
                .to_owned()
        });
    let service = PaymentsServer::new(PaymentsService {
        executions: Arc::new(AtomicU64::new(0)),
    });
    tracing::info!(%listen, "payments-grpc listening");
    tonic::transport::Server::builder()
        .layer(layer)
        .add_service(service)
        .serve_with_shutdown(listen, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    // Calls whose clients left go on to store their answers.
    drain.wait().await;
    Ok(())
}
