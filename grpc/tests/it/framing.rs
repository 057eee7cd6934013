//! The HTTP/2 frames of each answer, read with a raw `h2` client: a
//! guarded method's answers, fresh and replayed, are framed as tonic's own
//! server frames the same answers without the guard. An error without a
//! message is trailers-only (one HEADERS frame with END_STREAM); an answer
//! with a message is headers, the message, then trailers.

use std::net::SocketAddr;

use bytes::{BufMut, Bytes, BytesMut};
use http::HeaderMap;
use idempotency_guard::{Engine, Store};
use prost::Message;

use crate::server::proto::CreatePaymentRequest;
use crate::server::{CREATE, start, start_plain};

/// The shape of one answer on the wire.
#[derive(Debug, PartialEq)]
struct Shape {
    /// The lengths of the DATA frames' payloads (an empty DATA frame with
    /// END_STREAM shows as a 0; a trailers-only answer has none).
    data: Vec<usize>,
    /// Whether a trailers HEADERS frame ended the stream.
    trailers: bool,
    /// `grpc-status`, `grpc-message` and `grpc-status-details-bin`, from
    /// the trailers or (trailers-only) the headers.
    status: [Option<String>; 3],
}

impl Shape {
    fn trailers_only(&self) -> bool {
        self.data.is_empty() && !self.trailers
    }
}

fn status_of(map: &HeaderMap) -> [Option<String>; 3] {
    ["grpc-status", "grpc-message", "grpc-status-details-bin"]
        .map(|name| map.get(name).map(|v| v.to_str().unwrap().to_owned()))
}

/// One call of `CreatePayment` for `account`, with `key` (if any).
async fn shape(address: SocketAddr, account: &str, key: Option<&str>) -> Shape {
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let connection = tokio::spawn(connection);
    let mut request = http::Request::post(format!("http://{address}{CREATE}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let message = CreatePaymentRequest {
        account: account.to_owned(),
        amount_cents: 1250,
        currency: "EUR".to_owned(),
    }
    .encode_to_vec();
    let mut frame = BytesMut::new();
    frame.put_u8(0);
    frame.put_u32(u32::try_from(message.len()).unwrap());
    frame.put_slice(&message);
    let mut client = client.ready().await.unwrap();
    let (response, mut send) = client
        .send_request(request.body(()).unwrap(), false)
        .unwrap();
    // A refusal that needs no body (a missing or invalid key) may answer,
    // and end the stream, before the message is sent: the answer is what
    // is checked below, so a stream already closed here is no failure.
    if let Err(error) = send.send_data(frame.freeze(), true) {
        assert!(
            format!("{error:?}").contains("InactiveStreamId"),
            "sending the message failed: {error:?}"
        );
    }
    let response = response.await.unwrap();
    let (parts, mut body) = response.into_parts();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk: Bytes = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        data.push(chunk.len());
    }
    let trailers = body.trailers().await.unwrap();
    connection.abort();
    Shape {
        data,
        status: status_of(trailers.as_ref().unwrap_or(&parts.headers)),
        trailers: trailers.is_some(),
    }
}

/// Every row of the outcome table and the `OK` answer: the guarded
/// answer, fresh and replayed (or run again), has tonic's own framing;
/// the guard's refusals are trailers-only.
pub(crate) async fn each_answer_is_framed_as_tonic_frames_it<S: Store>(store: S) {
    let guarded = start(Engine::new(store.clone())).await;
    let plain = start_plain(Engine::new(store)).await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let mut accounts = vec![format!("ok:{run}")];
    for code in 1..=16 {
        accounts.push(format!("code:{code}:{run}"));
        accounts.push(format!("final:{code}:{run}"));
    }
    for account in &accounts {
        let tonic = shape(plain.address, account, None).await;
        let key = format!("{account}-frames");
        for attempt in ["fresh", "again"] {
            // (A payment's id differs from run to run, not its length.)
            let guarded = shape(guarded.address, account, Some(&key)).await;
            assert_eq!(guarded, tonic, "{account} {attempt}");
        }
        if account.starts_with("ok:") {
            assert!(!tonic.trailers_only() && tonic.trailers, "{tonic:?}");
        } else {
            assert!(tonic.trailers_only(), "{account}: {tonic:?}");
        }
    }
    // The guard's own refusals: trailers-only, as tonic sends a status.
    let refused = shape(guarded.address, &format!("ok:{run}"), None).await;
    assert!(refused.trailers_only(), "{refused:?}");
    assert_eq!(refused.status[0].as_deref(), Some("3"));
    let key = format!("ok:{run}-frames");
    let mut reused = shape(guarded.address, &format!("ok:{run}"), Some(&key)).await;
    assert!(!reused.trailers_only());
    reused = shape(guarded.address, &format!("ok:{run}-other"), Some(&key)).await;
    assert!(reused.trailers_only(), "{reused:?}");
    assert_eq!(reused.status[0].as_deref(), Some("9"));
}
