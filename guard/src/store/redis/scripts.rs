//! The Lua scripts of the Redis store, each assembled once from the
//! codec's positions and its files under `lua/` (habit 17: scripts in
//! their own files). Every write that needs a decision on the server
//! (fenced renewal, release, take-over, a completion without `IFEQ`, the
//! operators' forget) and the read that marks a record watched is one of
//! these.

use std::sync::LazyLock;

use redis::Script;

use super::codec;

/// A script: the codec's positions (`codec::lua_layout`) first, then the
/// files under `store/redis/lua/`, in order (shared pieces first).
macro_rules! script {
    ($($file:literal),+) => {
        LazyLock::new(|| {
            let mut source = codec::lua_layout();
            $(source.push_str(include_str!(concat!("lua/", $file)));)+
            Script::new(&source)
        })
    };
}

pub(super) static COMPLETE: LazyLock<Script> = script!("fence.lua", "complete.lua");
pub(super) static RENEW: LazyLock<Script> = script!("fence.lua", "renew.lua");
pub(super) static RELEASE: LazyLock<Script> = script!("fence.lua", "release.lua");
pub(super) static GET: LazyLock<Script> = script!("legacy_pack.lua", "legacy.lua", "get.lua");
pub(super) static TAKE_OVER: LazyLock<Script> = script!(
    "legacy_pack.lua",
    "legacy.lua",
    "steps.lua",
    "take_over.lua"
);
pub(super) static RECORD_STEPS: LazyLock<Script> =
    script!("fence.lua", "steps.lua", "record_steps.lua");
pub(super) static RECORD_REQUEST: LazyLock<Script> =
    script!("fence.lua", "steps.lua", "record_request.lua");
pub(super) static ADMIN_FORGET: LazyLock<Script> =
    script!("legacy_pack.lua", "legacy.lua", "admin_forget.lua");

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tests::raw;
    use super::super::{RECORDS, RedisStore};
    use super::codec;
    use crate::fingerprint::Fingerprint;
    use crate::key::{IdempotencyKey, Scope};
    use crate::record::{LeaseToken, RecordState, StoredResponse};
    use crate::store::{Claim, NewRecord, Store};

    /// The scripts write what the codec reads, byte for byte: a claim's
    /// value, a renewal's lease end, a reader's watched mark and a
    /// scripted completion are exactly the values `codec` builds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_redis_scripts_write_the_codec_layout() {
        let url = idempotency_tests::fixtures::redis_url();
        let prefix = format!("test-codec-{}", uuid::Uuid::new_v4().simple());
        let store = RedisStore::connect(&url, &prefix)
            .await
            .unwrap()
            .with_native_fence(false);
        let fingerprint = Fingerprint::from_bytes([3; 32]);
        let new = NewRecord {
            scope: Scope::leaked("s"),
            key: IdempotencyKey::leaked("k"),
            fingerprint: &fingerprint,
            method: "POST",
            path: "/orders?x=1",
            token: LeaseToken::new(),
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(3600),
            transactional: false,
        };
        let Claim::Acquired(lease) = store.claim(&new).await.unwrap() else {
            panic!("a fresh key is acquired");
        };
        let request = codec::encode_request(&fingerprint, false, "POST", "/orders?x=1");
        let claimed = raw(&store, "s", "k").await;
        assert_eq!(
            claimed,
            codec::in_flight(new.token, new.lease, new.retention, &request)
        );

        store.renew(&lease, Duration::from_secs(120)).await.unwrap();
        let renewed = raw(&store, "s", "k").await;
        let view = codec::View::parse(&renewed).unwrap();
        assert!(
            (120_000..125_000).contains(&view.lease_end),
            "{}",
            view.lease_end
        );
        assert_eq!(renewed[..28], claimed[..28]);
        assert_eq!(renewed[36..], claimed[36..]);

        let read = store
            .get(Scope::leaked("s"), IdempotencyKey::leaked("k"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read.state(), RecordState::InFlight);
        let watched = raw(&store, "s", "k").await;
        assert!(codec::View::parse(&watched).unwrap().watched);
        assert_eq!(watched[..3], renewed[..3]);
        assert_eq!(watched[4..], renewed[4..]);

        let response = StoredResponse::from_bytes("done");
        store.complete(&lease, &response).await.unwrap();
        let completed = raw(&store, "s", "k").await;
        let view = codec::View::parse(&completed).unwrap();
        assert_eq!(view.state, codec::COMPLETED);
        assert!(view.completion < 5_000, "{}", view.completion);
        assert_eq!(
            completed,
            codec::completed(
                &renewed,
                Duration::from_millis(view.completion),
                &codec::encode_response(&response)
            )
            .unwrap()
        );
        let record = store
            .get(Scope::leaked("s"), IdempotencyKey::leaked("k"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.response, Some(response));
        let mut del = redis::cmd("DEL");
        del.arg(store.direct().key_arg(RECORDS, "s", "k"));
        store.direct().query(&del).await.unwrap();
    }

    /// Recorded steps ride in the packed request where a reader of the
    /// layout before them still reads the record (the value parses, the
    /// flag byte is not `1`, so not transactional, and the path's end is
    /// text) while this one reads the path and the steps apart; a
    /// take-over and a completion keep them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn recorded_steps_are_read_apart_here_and_ignored_by_a_reader_before_them() {
        use crate::record::Step;
        let url = idempotency_tests::fixtures::redis_url();
        let prefix = format!("test-steps-{}", uuid::Uuid::new_v4().simple());
        let store = RedisStore::connect(&url, &prefix).await.unwrap();
        let fingerprint = Fingerprint::from_bytes([0; 32]);
        let mut new = NewRecord {
            scope: Scope::leaked("s"),
            key: IdempotencyKey::leaked("k"),
            fingerprint: &fingerprint,
            method: "POST",
            path: "/debits?x=1",
            token: LeaseToken::new(),
            lease: Duration::from_millis(300),
            retention: Duration::from_secs(3600),
            transactional: false,
        };
        let Claim::Acquired(lease) = store.claim(&new).await.unwrap() else {
            panic!("a fresh key is acquired");
        };
        let steps = [Step {
            name: "charge".into(),
            input: None,
            value: serde_json::json!({"id": "ch_1"}),
        }];
        store.record_steps(&lease, &steps).await.unwrap();
        let value = raw(&store, "s", "k").await;
        let view = codec::View::parse(&value).unwrap();
        // The reader before steps: `== 1` for transactional, the rest of
        // the request as the path.
        assert_ne!(view.request[32], 1);
        let method_len = usize::from(view.request[33]);
        let old_path = std::str::from_utf8(&view.request[34 + method_len..]).unwrap();
        assert!(old_path.starts_with("/debits?x=1"), "{old_path}");
        let (_, transactional, method, path) = codec::decode_request(view.request).unwrap();
        assert_eq!(
            (transactional, method.as_str(), path.as_str()),
            (false, "POST", "/debits?x=1")
        );
        let record = store.get(new.scope, new.key).await.unwrap().unwrap();
        assert_eq!(record.steps, steps);
        assert_eq!(record.path, "/debits?x=1");

        // Lapsed: the runner records nothing; taken over, the steps stay.
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(store.record_steps(&lease, &[]).await.is_err());
        new.token = LeaseToken::new();
        new.lease = Duration::from_secs(30);
        let fresh = store.take_over(lease.token, &new).await.unwrap().unwrap();
        let record = store.get(new.scope, new.key).await.unwrap().unwrap();
        assert_eq!(record.state(), RecordState::InFlight);
        assert_eq!(
            (record.steps.as_slice(), record.path.as_str()),
            (&steps[..], "/debits?x=1")
        );
        store
            .complete(&fresh, &StoredResponse::from_bytes("done"))
            .await
            .unwrap();
        let record = store.get(new.scope, new.key).await.unwrap().unwrap();
        assert_eq!(record.state(), RecordState::Completed);
        assert_eq!(record.steps, steps);
        assert_eq!(record.response, Some(StoredResponse::from_bytes("done")));
        let mut del = redis::cmd("DEL");
        del.arg(store.direct().key_arg(RECORDS, "s", "k"));
        store.direct().query(&del).await.unwrap();
    }

    /// A stored request rides after the steps (or alone), behind its own
    /// flag bit: release 1 reads the record's path as its start; this one
    /// reads the path, the steps and the request apart; a steps rewrite,
    /// a take-over and a completion keep it; clearing it keeps the steps.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stored_request_rides_beside_the_steps_and_survives_their_rewrites() {
        use crate::record::Step;
        use crate::record::StoredRequest;
        let url = idempotency_tests::fixtures::redis_url();
        let prefix = format!("test-request-{}", uuid::Uuid::new_v4().simple());
        let store = RedisStore::connect(&url, &prefix).await.unwrap();
        let fingerprint = Fingerprint::from_bytes([0; 32]);
        let mut new = NewRecord {
            scope: Scope::leaked("s"),
            key: IdempotencyKey::leaked("k"),
            fingerprint: &fingerprint,
            method: "POST",
            path: "/debits?x=1",
            token: LeaseToken::new(),
            lease: Duration::from_millis(300),
            retention: Duration::from_secs(3600),
            transactional: false,
        };
        let Claim::Acquired(lease) = store.claim(&new).await.unwrap() else {
            panic!("a fresh key is acquired");
        };
        let mut headers = http::HeaderMap::new();
        headers.insert("idempotency-key", "k".parse().unwrap());
        // A body with NULs: the request is the value's last part.
        let request = StoredRequest::new("POST", "/debits?x=1", headers, &b"a\0b\0"[..]);
        store.record_request(&lease, Some(&request)).await.unwrap();
        let record = store.get(new.scope, new.key).await.unwrap().unwrap();
        assert_eq!(record.request.as_deref(), Some(&request));
        assert!(record.steps.is_empty());
        assert_eq!(record.path, "/debits?x=1");
        let steps = [Step {
            name: "charge".into(),
            input: None,
            value: serde_json::json!({"id": "ch_1"}),
        }];
        store.record_steps(&lease, &steps).await.unwrap();
        let value = raw(&store, "s", "k").await;
        let view = codec::View::parse(&value).unwrap();
        // Release 1: `== 1` for transactional, the rest as the path.
        assert_ne!(view.request[32], 1);
        let method_len = usize::from(view.request[33]);
        assert!(view.request[34 + method_len..].starts_with(b"/debits?x=1"));
        let record = store.get(new.scope, new.key).await.unwrap().unwrap();
        assert_eq!(
            (
                record.steps.as_slice(),
                record.request.as_deref(),
                record.path.as_str()
            ),
            (&steps[..], Some(&request), "/debits?x=1")
        );

        // Lapsed: nothing kept; taken over: both stay; completed: both stay.
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(store.record_request(&lease, None).await.is_err());
        new.token = LeaseToken::new();
        new.lease = Duration::from_secs(30);
        let fresh = store.take_over(lease.token, &new).await.unwrap().unwrap();
        let record = store.get(new.scope, new.key).await.unwrap().unwrap();
        assert_eq!(record.state(), RecordState::InFlight);
        assert_eq!(
            (record.steps.as_slice(), record.request.as_deref()),
            (&steps[..], Some(&request))
        );
        store.record_request(&fresh, None).await.unwrap();
        let record = store.get(new.scope, new.key).await.unwrap().unwrap();
        assert_eq!(
            (record.steps.as_slice(), record.request),
            (&steps[..], None)
        );
        store.record_request(&fresh, Some(&request)).await.unwrap();
        store
            .complete(&fresh, &StoredResponse::from_bytes("done"))
            .await
            .unwrap();
        let record = store.get(new.scope, new.key).await.unwrap().unwrap();
        assert_eq!(record.state(), RecordState::Completed);
        assert_eq!(
            (record.steps.as_slice(), record.request.as_deref()),
            (&steps[..], Some(&request))
        );
        let mut del = redis::cmd("DEL");
        del.arg(store.direct().key_arg(RECORDS, "s", "k"));
        store.direct().query(&del).await.unwrap();
    }
}
