//! What two clients nobody here wrote read on every path of a guarded
//! method: Python's `grpcio` (gRPC C-core) and tonic's own client, over
//! every row of the outcome table and every refusal, fresh and replayed.
//! The status code, message and `grpc-status-details-bin` (`ErrorInfo`,
//! `RetryInfo`) each reads must equal what the handler or the refusal set,
//! byte for byte; so must the metadata the handler or the guard added.
//!
//! (Before the fix, `grpcio` read every handler error of a guarded method,
//! and every replay of a stored one, as `UNKNOWN` "Stream removed": the
//! guard ended the stream with an empty DATA frame after a status in the
//! headers.)

use std::time::Duration;

use idempotency_grpc::refusal::{RETRY_PUSHBACK, to_status};
use idempotency_guard::engine::Refusal;
use idempotency_guard::{Engine, IdempotencyKey, KeyError, Store};
use idempotency_tests::TestDb;
use tonic::Code;

use crate::clients::{CallSpec, Seen, grpcio_calls, tonic_calls};
use crate::server::{TestServer, handler_status, start, start_limited};

/// Which client a pass of the matrix goes through.
#[derive(Debug, Clone, Copy)]
enum Client {
    Grpcio,
    Tonic,
}

impl Client {
    async fn calls(self, server: &TestServer, calls: &[CallSpec]) -> Vec<Seen> {
        match self {
            Self::Grpcio => grpcio_calls(server.address, calls, 1, None).await,
            Self::Tonic => tonic_calls(server.address, calls).await,
        }
    }
}

/// What a call must read.
#[derive(Debug)]
struct Expect {
    code: Code,
    message: String,
    details: Vec<u8>,
    replayed: bool,
    /// The handler's `x-run` entry, for a handler's status.
    run: Option<u64>,
    /// `grpc-retry-pushback-ms`, for a refusal with `RetryInfo`.
    pushback: Option<u128>,
}

impl Expect {
    fn handler(code: Code, run: u64, replayed: bool) -> Self {
        let status = handler_status(code, run);
        Self {
            code,
            message: status.message().to_owned(),
            details: status.details().to_vec(),
            replayed,
            run: Some(run),
            pushback: None,
        }
    }

    fn refusal(refusal: &Refusal) -> Self {
        let status = to_status(refusal);
        Self {
            code: status.code(),
            message: status.message().to_owned(),
            details: status.details().to_vec(),
            replayed: false,
            run: None,
            pushback: status
                .metadata()
                .get(RETRY_PUSHBACK)
                .and_then(|millis| millis.to_str().ok()?.parse().ok()),
        }
    }

    fn check(&self, seen: &Seen, what: &str) {
        assert_eq!(seen.code, self.code as i32, "{what}: code, {seen:?}");
        assert_eq!(seen.message, self.message, "{what}: message");
        assert_eq!(
            seen.details, self.details,
            "{what}: grpc-status-details-bin"
        );
        let replayed = seen.entry("idempotent-replayed");
        assert_eq!(
            replayed.as_deref(),
            self.replayed.then_some("true"),
            "{what}: idempotent-replayed"
        );
        if let Some(run) = self.run {
            assert_eq!(seen.entry("x-run"), Some(run.to_string()), "{what}: x-run");
        }
        assert_eq!(
            seen.entry("grpc-retry-pushback-ms"),
            self.pushback.map(|ms| ms.to_string()),
            "{what}: grpc-retry-pushback-ms"
        );
        // The details decode as the refusal's or the handler's.
        let status = tonic::Status::with_details(self.code, "", seen.details.clone().into());
        let info = tonic_types::StatusExt::get_details_error_info(&status);
        assert!(info.is_some(), "{what}: no ErrorInfo");
    }
}

/// The stored codes of the outcome table (the others release the key).
const STORED: [i32; 5] = [5, 6, 7, 9, 11];

/// The outcome table's rows, the key refusals and `key-reused`, through
/// `client`: each call twice under one key (fresh, then replayed or run
/// again).
async fn rows(server: &TestServer, client: Client, tag: &str) {
    let mut calls = Vec::new();
    let mut expects = Vec::new();
    let key = |what: &str| format!("{tag}-{what}");
    // Every code, as the handler's status, then marked final (UNAVAILABLE,
    // 14, is never stored: marked final, it releases the key all the same).
    for code in 1..=16 {
        let stored = STORED.contains(&code);
        for (verb, kept) in [("code", stored), ("final", code != 14)] {
            let account = format!("{verb}:{code}:{tag}");
            let call = CallSpec::new(&account, Some(&key(&account)));
            calls.extend([call.clone(), call]);
            let code = Code::from_i32(code);
            expects.push((Expect::handler(code, 1, false), format!("{account} fresh")));
            let again = if kept {
                Expect::handler(code, 1, true)
            } else {
                Expect::handler(code, 2, false)
            };
            expects.push((again, format!("{account} again")));
        }
    }
    // The key refusals, twice each.
    let account = format!("refused:{tag}");
    let mut two = CallSpec::new(&account, Some("k1"));
    two.metadata.push(("idempotency-key".into(), "k2".into()));
    let long = "x".repeat(256);
    let long_error = IdempotencyKey::parse_bytes(long.as_bytes()).unwrap_err();
    for (call, refusal, what) in [
        (
            CallSpec::new(&account, None),
            Refusal::KeyMissing,
            "key-missing",
        ),
        (two, Refusal::KeyInvalid(KeyError::Repeated), "two keys"),
        (
            CallSpec::new(&account, Some(&long)),
            Refusal::KeyInvalid(long_error),
            "a key too long",
        ),
    ] {
        calls.extend([call.clone(), call]);
        for attempt in ["fresh", "again"] {
            expects.push((Expect::refusal(&refusal), format!("{what} {attempt}")));
        }
    }
    // Another message under a used key.
    let reused = key("reused");
    let account = format!("ok:{tag}");
    let mut other = CallSpec::new(&account, Some(&reused));
    other.amount_cents = 99;
    calls.extend([CallSpec::new(&account, Some(&reused)), other.clone(), other]);
    let first = calls.len() - 3;
    let refusal = Refusal::KeyReused {
        key: IdempotencyKey::from_raw(&reused).expect("a key"),
    };

    let seen = client.calls(server, &calls).await;
    assert_eq!(seen.len(), calls.len());
    for ((expect, what), seen) in expects.iter().zip(&seen) {
        expect.check(seen, &format!("{client:?}: {what}"));
    }
    assert_eq!(seen[first].code, 0, "{client:?}: {:?}", seen[first]);
    for seen in &seen[first + 1..] {
        Expect::refusal(&refusal).check(seen, &format!("{client:?}: key-reused"));
    }
    assert_eq!(server.runs.of(&account), 1);
    // The stored codes ran once, the released ones twice, final ones once
    // (but UNAVAILABLE's, released).
    for code in 1..=16 {
        let runs = if STORED.contains(&code) { 1 } else { 2 };
        assert_eq!(
            server.runs.of(&format!("code:{code}:{tag}")),
            runs,
            "{code}"
        );
        let final_runs = if code == 14 { 2 } else { 1 };
        assert_eq!(
            server.runs.of(&format!("final:{code}:{tag}")),
            final_runs,
            "{code} final"
        );
    }
    assert_eq!(server.runs.of(&format!("refused:{tag}")), 0);
}

/// An `OK` answer and its replay: the same message and metadata, the
/// replay marked.
async fn ok_and_replay(server: &TestServer, client: Client, tag: &str) {
    let account = format!("ok:{tag}-2");
    let call = CallSpec::new(&account, Some(&format!("{tag}-ok")));
    let seen = client.calls(server, &[call.clone(), call]).await;
    let what = format!("{client:?}: OK");
    for answer in &seen {
        assert_eq!(answer.code, 0, "{what}: {answer:?}");
        assert_eq!(
            answer.entry("x-payment-cost").as_deref(),
            Some("3"),
            "{what}"
        );
        assert_eq!(
            answer.metadata.get("x-trace-bin"),
            Some(&vec![vec![0u8, 1]]),
            "{what}"
        );
    }
    assert!(seen[0].body.is_some());
    assert_eq!(seen[0].body, seen[1].body, "{what}: the replay's message");
    assert_eq!(seen[0].entry("idempotent-replayed"), None, "{what}");
    assert_eq!(
        seen[1].entry("idempotent-replayed").as_deref(),
        Some("true")
    );
    assert_eq!(server.runs.of(&account), 1);
}

/// `request-in-flight`, twice while the first call runs, then the replay.
async fn in_flight(server: &TestServer, retry_after: Duration, client: Client, tag: &str) {
    let account = format!("hold:{tag}");
    let key = format!("{tag}-held");
    let first = {
        let call = vec![CallSpec::new(&account, Some(&key))];
        let address = server.address;
        tokio::spawn(async move {
            let server = (address, call);
            tonic_calls(server.0, &server.1).await
        })
    };
    server.started(&account, 1).await;
    let call = CallSpec::new(&account, Some(&key));
    let seen = client.calls(server, &[call.clone(), call.clone()]).await;
    let refusal = Refusal::RequestInFlight {
        key: IdempotencyKey::from_raw(&key).expect("a key"),
        retry_after,
    };
    for (answer, attempt) in seen.iter().zip(["fresh", "again"]) {
        Expect::refusal(&refusal).check(answer, &format!("{client:?}: in flight {attempt}"));
    }
    server.open(&account);
    let first = first.await.unwrap();
    assert_eq!(first[0].code, 0);
    let replay = client.calls(server, &[call]).await;
    assert_eq!(replay[0].code, 0, "{client:?}: {:?}", replay[0]);
    assert_eq!(replay[0].body, first[0].body);
    assert_eq!(
        replay[0].entry("idempotent-replayed").as_deref(),
        Some("true")
    );
    assert_eq!(server.runs.of(&account), 1);
}

/// `handler-timeout`: this call cut off at the maximum handler time (its
/// outcome unknown), then `outcome-unknown`: the abandoned record.
async fn outcome_unknown(server: &TestServer, client: Client, tag: &str) {
    let account = format!("sleep:3000:{tag}");
    let key = format!("{tag}-cut");
    let call = CallSpec::new(&account, Some(&key));
    let seen = client.calls(server, &[call.clone(), call]).await;
    let key = IdempotencyKey::from_raw(&key).expect("a key");
    let cut_off = Refusal::HandlerTimeout {
        key: key.clone(),
        rolled_back: false,
    };
    let abandoned = Refusal::OutcomeUnknown { key };
    for (answer, refusal) in seen.iter().zip([cut_off, abandoned]) {
        Expect::refusal(&refusal).check(answer, &format!("{client:?}: {}", refusal.name()));
    }
    assert_eq!(server.runs.of(&account), 0);
}

/// `body-too-large` (a request message over the layer's limit) and
/// `response-not-stored` (the first call's answer over the stored-answer
/// limit: sent to it whole, later calls refused), twice each, on a server
/// whose limits are those of [`LIMITS`].
async fn over_the_limits(server: &TestServer, client: Client, tag: &str) {
    let (request_limit, _) = LIMITS;
    let mut large = CallSpec::new(&format!("ok:{tag}-large"), Some(&format!("{tag}-large")));
    large.account.push_str(&"x".repeat(request_limit));
    let account = format!("ok:{tag}-big-answer");
    let key = format!("{tag}-big-answer");
    let call = CallSpec::new(&account, Some(&key));
    let seen = client
        .calls(
            server,
            &[large.clone(), large, call.clone(), call.clone(), call],
        )
        .await;
    let too_large = Refusal::BodyTooLarge {
        limit: request_limit,
    };
    for (answer, attempt) in seen[..2].iter().zip(["fresh", "again"]) {
        Expect::refusal(&too_large).check(answer, &format!("{client:?}: body-too-large {attempt}"));
    }
    assert_eq!(
        seen[2].code, 0,
        "{client:?}: the first caller gets its answer: {:?}",
        seen[2]
    );
    assert!(seen[2].body.is_some());
    let not_stored = Refusal::ResponseNotStored {
        key: IdempotencyKey::from_raw(&key).expect("a key"),
    };
    for (answer, attempt) in seen[3..].iter().zip(["fresh", "again"]) {
        Expect::refusal(&not_stored).check(
            answer,
            &format!("{client:?}: response-not-stored {attempt}"),
        );
    }
    assert_eq!(server.runs.of(&account), 1);
}

/// The request limit and the stored-answer limit of the server of
/// [`over_the_limits`]: a payment's answer (about 60 bytes) is over the
/// second.
const LIMITS: (usize, usize) = (200, 20);

/// `store-unavailable`, twice.
async fn store_unavailable(server: &TestServer, retry_after: Duration, client: Client, tag: &str) {
    let account = format!("ok:{tag}-broken");
    let key = format!("{tag}-broken");
    let call = CallSpec::new(&account, Some(&key));
    let seen = client.calls(server, &[call.clone(), call]).await;
    let refusal = Refusal::StoreUnavailable {
        key: Some(IdempotencyKey::from_raw(&key).expect("a key")),
        retry_after,
    };
    for (answer, attempt) in seen.iter().zip(["fresh", "again"]) {
        Expect::refusal(&refusal)
            .check(answer, &format!("{client:?}: store unavailable {attempt}"));
    }
    assert_eq!(server.runs.of(&account), 0);
}

/// The whole matrix, through `grpcio` and through tonic's client, on the
/// store of `db` (broken at the end for `store-unavailable`).
pub(crate) async fn every_path_reads_the_same_through_grpcio_and_tonic<S: Store>(db: TestDb<S>) {
    let retry_after = Duration::from_millis(700);
    let engine = Engine::new(db.store.clone()).with_retry_after(retry_after);
    let server = start(engine).await;
    let cut_off = Engine::new(db.store.clone()).with_max_handler_time(Duration::from_millis(300));
    let cut_off = start(cut_off).await;
    let limited = start_limited(Engine::new(db.store.clone()), LIMITS.0, LIMITS.1).await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    for client in [Client::Grpcio, Client::Tonic] {
        let tag = format!("{run}-{client:?}");
        rows(&server, client, &tag).await;
        ok_and_replay(&server, client, &tag).await;
        in_flight(&server, retry_after, client, &tag).await;
        outcome_unknown(&cut_off, client, &tag).await;
        over_the_limits(&limited, client, &tag).await;
    }
    db.break_store().await;
    let store_timeout = Duration::from_millis(500);
    let broken = Engine::new(db.store.clone())
        .with_retry_after(retry_after)
        .with_store_timeout(store_timeout);
    let broken = start(broken).await;
    for client in [Client::Grpcio, Client::Tonic] {
        let tag = format!("{run}-{client:?}");
        store_unavailable(&broken, retry_after, client, &tag).await;
    }
}
