//! A fake payment service provider (PSP) that honours `Idempotency-Key`,
//! served in-process: what the payments example's resumable debit route
//! (`POST /debits`) charges, and what the lab and the crash tests count.
//!
//! - `POST /charges` with an `Idempotency-Key` header and a JSON body
//!   `{"amount": <int>, "currency": <str>}`: the first request of a key
//!   makes a charge (`201`, `{"id": "ch_<n>", "amount", "currency"}`); a
//!   later one with the same key makes none and answers the first charge
//!   again (`200`, `Idempotent-Replayed: true`); the same key with another
//!   amount or currency is refused (`422`), as a PSP does. No key: `400`.
//! - `GET /counts`: every charge (its id, key, amount, and how many
//!   requests came with its key), as JSON: [`FakePsp::charges`] over HTTP.
//!
//! ```no_run
//! # async fn f() {
//! let psp = idempotency_tests::FakePsp::start().await;
//! // PSP_URL=<psp.url()> for the payments example; then:
//! let charges = psp.charges();
//! assert!(charges.iter().all(|charge| charge.requests >= 1));
//! # }
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

/// One charge the PSP made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// Its id (`ch_1`, `ch_2`, ... in the order they were made).
    pub id: String,
    /// The `Idempotency-Key` it was made with.
    pub key: String,
    /// The amount charged.
    pub amount: i64,
    /// The currency.
    pub currency: String,
    /// Requests that came with its key: the charge step's executions (1,
    /// or more when a step the crash interrupted ran again).
    pub requests: u64,
}

/// The charges, by key.
#[derive(Debug, Default)]
struct Book {
    charges: Vec<Charge>,
    by_key: HashMap<String, usize>,
}

type Shared = Arc<Mutex<Book>>;

/// The PSP, listening on loopback until dropped.
#[derive(Debug)]
pub struct FakePsp {
    /// Where it listens.
    pub address: SocketAddr,
    book: Shared,
    server: tokio::task::JoinHandle<()>,
}

impl FakePsp {
    /// Starts it on a free port.
    ///
    /// # Panics
    ///
    /// When no port on loopback can be bound.
    pub async fn start() -> Self {
        let book = Shared::default();
        let app = Router::new()
            .route("/charges", post(charge))
            .route("/counts", get(counts))
            .with_state(Arc::clone(&book));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a port for the fake PSP");
        let address = listener.local_addr().expect("the fake PSP's address");
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            address,
            book,
            server,
        }
    }

    /// Its base URL (`PSP_URL` for the payments example).
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Every charge made so far, in the order they were made.
    pub fn charges(&self) -> Vec<Charge> {
        lock(&self.book).charges.clone()
    }
}

impl Drop for FakePsp {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn lock(book: &Shared) -> std::sync::MutexGuard<'_, Book> {
    book.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn charge(State(book): State<Shared>, headers: HeaderMap, body: String) -> Response {
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .filter(|k| !k.is_empty())
    else {
        return (StatusCode::BAD_REQUEST, "Idempotency-Key is required").into_response();
    };
    let body: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let (Some(amount), Some(currency)) = (body["amount"].as_i64(), body["currency"].as_str())
    else {
        return (StatusCode::BAD_REQUEST, "amount and currency are required").into_response();
    };
    let mut book = lock(&book);
    let book = &mut *book;
    let (status, charge) = match book.by_key.get(key) {
        Some(&index) => {
            let charge = &mut book.charges[index];
            if charge.amount != amount || charge.currency != currency {
                return (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "this Idempotency-Key was used for another charge",
                )
                    .into_response();
            }
            charge.requests += 1;
            (StatusCode::OK, charge.clone())
        }
        None => {
            let charge = Charge {
                id: format!("ch_{}", book.charges.len() + 1),
                key: key.to_owned(),
                amount,
                currency: currency.to_owned(),
                requests: 1,
            };
            book.by_key.insert(key.to_owned(), book.charges.len());
            book.charges.push(charge.clone());
            (StatusCode::CREATED, charge)
        }
    };
    let body = json!({"id": charge.id, "amount": charge.amount, "currency": charge.currency});
    let mut response = (status, Json(body)).into_response();
    if status == StatusCode::OK {
        response.headers_mut().insert(
            "idempotent-replayed",
            axum::http::HeaderValue::from_static("true"),
        );
    }
    response
}

async fn counts(State(book): State<Shared>) -> Json<serde_json::Value> {
    let charges: Vec<_> = lock(&book)
        .charges
        .iter()
        .map(|c| {
            json!({"id": c.id, "key": c.key, "amount": c.amount, "currency": c.currency, "requests": c.requests})
        })
        .collect();
    Json(json!({ "charges": charges }))
}
