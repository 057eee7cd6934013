//! Starting the backend and the gateway, and reading what they did.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use idempotency_guard::Store;
use idempotency_guard::store::AnyStore;
use idempotency_tests::{Process, names};
use tempfile::TempDir;

/// The Python backend's script.
pub(crate) fn backend_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/backend.py")
}

/// A backend, a gateway in front of it, and their files.
pub(crate) struct Stack {
    /// The Python backend (`None` once killed).
    pub(crate) backend: Option<Process>,
    /// The backend's address (kept when it is killed, to restart it there).
    pub(crate) backend_address: SocketAddr,
    /// The gateway process.
    pub(crate) gateway: Process,
    /// The gateway's store (an SQLite file).
    pub(crate) store_url: String,
    /// The backend's execution log (an SQLite file).
    pub(crate) backend_db: PathBuf,
    /// Holds the files.
    pub(crate) _dir: TempDir,
}

/// Starts the backend and a gateway whose configuration is `routes_and_more`
/// after the `upstream` and `store` lines (which the test does not write).
pub(crate) async fn stack(routes_and_more: &str, env: &[(&str, &str)]) -> Stack {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let backend_db = dir.path().join("backend.db");
    let backend = start_backend(&backend_db, None).await;
    let backend_address = backend.address;
    let store_url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("gateway.db").display()
    );
    let gateway = start_gateway(&dir, backend_address, &store_url, routes_and_more, env).await;
    Stack {
        backend: Some(backend),
        backend_address,
        gateway,
        store_url,
        backend_db,
        _dir: dir,
    }
}

/// Starts the Python backend (at `address`, or a free one).
pub(crate) async fn start_backend(db: &Path, address: Option<SocketAddr>) -> Process {
    let script = backend_script();
    let script = script.to_str().expect("a UTF-8 path");
    let db = db.to_str().expect("a UTF-8 path");
    let env = [("BACKEND_DB", db)];
    match address {
        Some(address) => Process::start_at(script, address, &env, "/healthz").await,
        None => Process::start(script, &env, "/healthz").await,
    }
}

/// Writes a configuration and starts the gateway binary with it.
pub(crate) async fn start_gateway(
    dir: &TempDir,
    upstream: SocketAddr,
    store_url: &str,
    rest: &str,
    env: &[(&str, &str)],
) -> Process {
    let config = dir.path().join("gateway.toml");
    let text = format!("upstream = \"http://{upstream}\"\nstore = \"{store_url}\"\n{rest}");
    std::fs::write(&config, text).expect("write the configuration");
    let config = config.to_str().expect("a UTF-8 path").to_owned();
    let mut all = vec![("GATEWAY_CONFIG", config.as_str()), ("RUST_LOG", "warn")];
    all.extend_from_slice(env);
    Process::start(env!("CARGO_BIN_EXE_idempotency-gateway"), &all, "/healthz").await
}

impl Stack {
    /// `http://<gateway><path>`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.gateway.address)
    }

    /// Rows the backend wrote for `path` (one per execution).
    pub(crate) async fn executions(&self, path: &str) -> i64 {
        let pool = sqlite(&self.backend_db).await;
        let n = sqlx::query_scalar("select count(*) from payments where path = ?")
            .bind(path)
            .fetch_one(&pool)
            .await
            .expect("count executions");
        pool.close().await;
        n
    }

    /// The amounts the backend recorded, one per execution.
    pub(crate) async fn amounts(&self) -> Vec<i64> {
        let pool = sqlite(&self.backend_db).await;
        let rows = sqlx::query_scalar("select amount from payments where path = '/payments'")
            .fetch_all(&pool)
            .await
            .expect("read amounts");
        pool.close().await;
        rows
    }

    /// The gateway's records: `(scope, key, state)`.
    pub(crate) async fn records(&self) -> Vec<(String, String, String)> {
        let pool = sqlx::SqlitePool::connect(&self.store_url)
            .await
            .expect("open the gateway's store");
        let rows =
            sqlx::query_as("select scope, key, state from idempotency_records order by scope, key")
                .fetch_all(&pool)
                .await
                .expect("read records");
        pool.close().await;
        rows
    }

    /// What the key-status service answers about `key` in the default
    /// scope, from its own status logic on the gateway's store: `(200,
    /// advice)`, or `(404, "retry")` for a key with no record.
    pub(crate) async fn advice(&self, key: &str) -> (u16, String) {
        let store = AnyStore::connect(&self.store_url)
            .await
            .expect("open the gateway's store");
        let record = store
            .get(names::scope("default"), names::key(key))
            .await
            .expect("read the record");
        let status = record.as_ref().and_then(|record| {
            idempotency_service::key_status(record, None, Duration::from_secs(1))
        });
        match status {
            Some(status) => {
                let advice = serde_json::to_value(status.advice).expect("advice as JSON");
                (200, advice.as_str().unwrap_or("").to_owned())
            }
            None => (404, "retry".to_owned()),
        }
    }
}

pub(crate) async fn sqlite(path: &Path) -> sqlx::SqlitePool {
    sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display()))
        .await
        .expect("open the backend's database")
}

/// A JSON POST with an idempotency key.
pub(crate) fn pay(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    body: &str,
) -> reqwest::RequestBuilder {
    client
        .post(url)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(body.to_owned())
}
