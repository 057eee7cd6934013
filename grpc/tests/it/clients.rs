//! Python's `grpcio` (installed by `scripts/grpcio-venv`, a pinned version
//! from PyPI) as the tests drive it: a plan of calls in, what `grpcio`
//! read of each answer out (`tests/python/calls.py`), and the same calls
//! through tonic's client, both as [`Seen`].

use std::collections::BTreeMap;
use std::net::SocketAddr;

use prost::Message;
use tonic::metadata::KeyAndValueRef;

use crate::server::proto::CreatePaymentRequest;
use crate::server::proto::payments_client::PaymentsClient;

/// The repository's root.
pub(crate) const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// The venv's python, installing `grpcio` first when needed.
pub(crate) fn python() -> String {
    let venv = std::process::Command::new(format!("{ROOT}/scripts/grpcio-venv"))
        .output()
        .expect("scripts/grpcio-venv could not start: it installs grpcio for this test");
    assert!(
        venv.status.success(),
        "scripts/grpcio-venv failed to install grpcio (PyPI must be reachable): {}",
        String::from_utf8_lossy(&venv.stderr)
    );
    String::from_utf8(venv.stdout).unwrap().trim().to_owned()
}

/// One call of a plan.
#[derive(Debug, Clone)]
pub(crate) struct CallSpec {
    pub(crate) account: String,
    pub(crate) amount_cents: i64,
    /// Metadata entries, in order (a name may repeat).
    pub(crate) metadata: Vec<(String, String)>,
}

impl CallSpec {
    /// A call for `account` with `key` as its `idempotency-key` (none when
    /// `None`).
    pub(crate) fn new(account: &str, key: Option<&str>) -> Self {
        Self {
            account: account.to_owned(),
            amount_cents: 1250,
            metadata: key
                .map(|key| vec![("idempotency-key".to_owned(), key.to_owned())])
                .unwrap_or_default(),
        }
    }
}

/// What a client read of one answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Seen {
    /// The status code.
    pub(crate) code: i32,
    /// The status message.
    pub(crate) message: String,
    /// `grpc-status-details-bin`, decoded (empty when absent).
    pub(crate) details: Vec<u8>,
    /// The metadata entries that are neither gRPC's own nor HTTP's
    /// (initial and trailing together), values as bytes.
    pub(crate) metadata: BTreeMap<String, Vec<Vec<u8>>>,
    /// The response message, for an `OK` answer.
    pub(crate) body: Option<Vec<u8>>,
}

impl Seen {
    /// The one value of metadata entry `name`, as text.
    pub(crate) fn entry(&self, name: &str) -> Option<String> {
        let values = self.metadata.get(name)?;
        assert_eq!(values.len(), 1, "{name} repeated: {self:?}");
        Some(String::from_utf8(values[0].clone()).unwrap())
    }
}

/// Whether a metadata entry is the application's or the guard's (what
/// the tests compare), not one of gRPC's or HTTP's own.
fn compared(name: &str) -> bool {
    name.starts_with("x-") || name == "idempotent-replayed" || name == "grpc-retry-pushback-ms"
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

/// Runs `calls` against `target` from `grpcio`, `parallel` at a time, with
/// `service_config` (its `retryPolicy`) or with retries off.
pub(crate) async fn grpcio_calls(
    target: SocketAddr,
    calls: &[CallSpec],
    parallel: usize,
    service_config: Option<serde_json::Value>,
) -> Vec<Seen> {
    let plan = serde_json::json!({
        "target": target.to_string(),
        "service_config": service_config,
        "parallel": parallel,
        "calls": calls.iter().map(|call| serde_json::json!({
            "account": call.account,
            "amount_cents": call.amount_cents,
            "metadata": call.metadata,
        })).collect::<Vec<_>>(),
    });
    let python = tokio::task::spawn_blocking(python).await.unwrap();
    let mut child = tokio::process::Command::new(python)
        .arg(format!("{ROOT}/grpc/tests/python/calls.py"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, plan.to_string().as_bytes())
        .await
        .unwrap();
    drop(stdin);
    let output = child.wait_with_output().await.unwrap();
    assert!(
        output.status.success(),
        "the grpcio client failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: Vec<serde_json::Value> = serde_json::from_slice(&output.stdout).unwrap();
    seen.iter()
        .map(|answer| {
            let mut metadata: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
            let mut details = Vec::new();
            for part in ["initial", "trailing"] {
                for pair in answer[part].as_array().unwrap() {
                    let name = pair[0].as_str().unwrap();
                    let value = hex(pair[1].as_str().unwrap());
                    if name == "grpc-status-details-bin" {
                        details = value;
                    } else if compared(name) {
                        metadata.entry(name.to_owned()).or_default().push(value);
                    }
                }
            }
            Seen {
                code: i32::try_from(answer["code"].as_i64().unwrap()).unwrap(),
                message: answer["details"].as_str().unwrap().to_owned(),
                details,
                metadata,
                body: answer["message"].as_str().map(hex),
            }
        })
        .collect()
}

fn metadata_of(map: &tonic::metadata::MetadataMap) -> BTreeMap<String, Vec<Vec<u8>>> {
    let mut metadata: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
    for entry in map.iter() {
        let (name, value) = match entry {
            KeyAndValueRef::Ascii(name, value) => (name.as_str(), value.as_bytes().to_vec()),
            KeyAndValueRef::Binary(name, value) => {
                (name.as_str(), value.to_bytes().unwrap().to_vec())
            }
        };
        if compared(name) {
            metadata.entry(name.to_owned()).or_default().push(value);
        }
    }
    metadata
}

/// Runs `calls` against `target` one after the other from tonic's client.
pub(crate) async fn tonic_calls(target: SocketAddr, calls: &[CallSpec]) -> Vec<Seen> {
    let mut client = PaymentsClient::connect(format!("http://{target}"))
        .await
        .unwrap();
    let mut seen = Vec::new();
    for call in calls {
        let mut request = tonic::Request::new(CreatePaymentRequest {
            account: call.account.clone(),
            amount_cents: call.amount_cents,
            currency: "EUR".to_owned(),
        });
        for (name, value) in &call.metadata {
            let name = tonic::metadata::AsciiMetadataKey::from_bytes(name.as_bytes()).unwrap();
            request.metadata_mut().append(name, value.parse().unwrap());
        }
        seen.push(match client.create_payment(request).await {
            Ok(response) => Seen {
                code: 0,
                message: String::new(),
                details: Vec::new(),
                metadata: metadata_of(response.metadata()),
                body: Some(response.get_ref().encode_to_vec()),
            },
            Err(status) => Seen {
                code: status.code() as i32,
                message: status.message().to_owned(),
                details: status.details().to_vec(),
                metadata: metadata_of(status.metadata()),
                body: None,
            },
        });
    }
    seen
}
