//! `grpc-overhead`: the guard's cost on a tonic server, in a few seconds:
//! a bare `CreatePayment` against the guarded one, fresh keys and
//! replays, over loopback HTTP/2, printing calls per second.
//!
//! ```text
//! cargo run --release -p idempotency-grpc --example grpc-overhead
//! ```
//!
//! `DATABASE_URL` picks the store (default: SQLite in a temporary file);
//! `CALLS` (default 4000) and `CONCURRENCY` (default 32) size the run.

use std::net::SocketAddr;
use std::time::Instant;

use idempotency_grpc::GrpcIdempotencyLayer;
use idempotency_guard::Engine;
use idempotency_guard::store::AnyStore;
use tonic::{Request, Response, Status};

mod proto {
    #![allow(missing_docs, unreachable_pub, clippy::all)]
    tonic::include_proto!("payments.v1");
}

use proto::payments_client::PaymentsClient;
use proto::payments_server::{Payments, PaymentsServer};
use proto::{CreatePaymentRequest, ListPaymentsRequest, Payment, Refund, RefundPaymentRequest};

struct Bare;

#[tonic::async_trait]
impl Payments for Bare {
    async fn create_payment(
        &self,
        request: Request<CreatePaymentRequest>,
    ) -> Result<Response<Payment>, Status> {
        let request = request.into_inner();
        Ok(Response::new(Payment {
            id: "pay".into(),
            account: request.account,
            amount_cents: request.amount_cents,
            currency: request.currency,
            executions: 1,
        }))
    }

    async fn refund_payment(
        &self,
        _request: Request<RefundPaymentRequest>,
    ) -> Result<Response<Refund>, Status> {
        Err(Status::unimplemented("not measured"))
    }

    type ListPaymentsStream = futures_util::stream::Empty<Result<Payment, Status>>;

    async fn list_payments(
        &self,
        _request: Request<ListPaymentsRequest>,
    ) -> Result<Response<Self::ListPaymentsStream>, Status> {
        Ok(Response::new(futures_util::stream::empty()))
    }
}

async fn serve(layer: Option<GrpcIdempotencyLayer<AnyStore>>) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(async move {
        let mut builder = tonic::transport::Server::builder();
        let result = match layer {
            Some(layer) => {
                builder
                    .layer(layer)
                    .add_service(PaymentsServer::new(Bare))
                    .serve_with_incoming(incoming)
                    .await
            }
            None => {
                builder
                    .add_service(PaymentsServer::new(Bare))
                    .serve_with_incoming(incoming)
                    .await
            }
        };
        if let Err(error) = result {
            eprintln!("server failed: {error}");
        }
    });
    Ok(address)
}

/// Sends `calls` calls, `concurrency` at a time; `key(i)` is call i's key
/// (`None`: no key). Answers calls per second.
async fn load(
    address: SocketAddr,
    calls: usize,
    concurrency: usize,
    key: impl Fn(usize) -> Option<String> + Send + Sync + Clone + 'static,
) -> anyhow::Result<f64> {
    let client = PaymentsClient::connect(format!("http://{address}")).await?;
    let started = Instant::now();
    let mut workers = Vec::new();
    for worker in 0..concurrency {
        let mut client = client.clone();
        let key = key.clone();
        workers.push(tokio::spawn(async move {
            let mut i = worker;
            while i < calls {
                let mut request = Request::new(CreatePaymentRequest {
                    account: "acct".into(),
                    amount_cents: 100,
                    currency: "EUR".into(),
                });
                if let Some(key) = key(i) {
                    request
                        .metadata_mut()
                        .insert("idempotency-key", key.parse()?);
                }
                client.create_payment(request).await?;
                i += concurrency;
            }
            anyhow::Ok(())
        }));
    }
    for worker in workers {
        worker.await??;
    }
    Ok(calls as f64 / started.elapsed().as_secs_f64())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let calls: usize = std::env::var("CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4000);
    let concurrency: usize = std::env::var("CONCURRENCY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    let dir = tempfile_dir()?;
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| format!("sqlite://{}/overhead.db?mode=rwc", dir.display()));
    let store = AnyStore::connect(&url).await?;
    store.migrate().await?;
    let layer = GrpcIdempotencyLayer::new(Engine::new(store))
        .with_methods(["/payments.v1.Payments/CreatePayment"]);
    let bare = serve(None).await?;
    let guarded = serve(Some(layer)).await?;
    let run = uuid::Uuid::new_v4();

    // Warm-up: connections, the store's pool, the allocator.
    load(bare, calls / 4, concurrency, |_| None).await?;
    load(guarded, calls / 4, concurrency, move |i| {
        Some(format!("warm-{run}-{i}"))
    })
    .await?;
    let bare_rate = load(bare, calls, concurrency, |_| None).await?;
    let fresh_rate = load(guarded, calls, concurrency, move |i| {
        Some(format!("{run}-{i}"))
    })
    .await?;
    // Replays: every key of the fresh run again.
    let replay_rate = load(guarded, calls, concurrency, move |i| {
        Some(format!("{run}-{i}"))
    })
    .await?;
    println!("store: {}", url.split(':').next().unwrap_or("?"));
    println!("calls: {calls}, concurrency: {concurrency}");
    println!("bare:            {bare_rate:>9.0} calls/s");
    println!("guarded fresh:   {fresh_rate:>9.0} calls/s");
    println!("guarded replay:  {replay_rate:>9.0} calls/s");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A fresh directory for the SQLite file.
fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("grpc-overhead-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
