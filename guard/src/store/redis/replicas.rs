//! Replica acknowledgements: `WAIT` after every claim, take-over and
//! completion, for deployments where a replica may be promoted
//! ([`RedisStore::with_replica_acks`]).
//!
//! Redis replicates asynchronously: a primary answers a write before any
//! replica has it. If the primary dies then and a replica is promoted, the
//! write is gone: a claim lost so lets the client's retry run the work a
//! second time; a completion lost so leaves the promoted replica with an
//! in-flight record, which answers 409 and then `outcome-unknown`.
//!
//! With replica acknowledgements on, each of those scripts goes out in one
//! pipeline with `WAIT <replicas> <timeout>` behind it, on the same
//! connection (on a cluster: to the primary of the record's hash slot), so
//! that the `WAIT` counts exactly the replicas that hold this write (a
//! `WAIT` on another connection, or on a fresh one after a reconnect,
//! waits for nothing and answers at once with every connected replica).
//! When fewer acknowledge within the timeout, the operation fails with
//! [`StoreError::NotReplicated`]: the engine releases such a claim (fenced
//! by its token) and answers 503 `store-unavailable`, so the work never
//! runs on a write a failover may lose. A completion that fails so has run:
//! its caller gets the reply, and the error is logged.
//!
//! The `WAIT` goes with every call, whatever the script answers: a claim
//! that finds another's record (a replay, a 409) waits too, which costs
//! nothing while the replicas keep up and up to the timeout while fewer
//! than asked for are connected (then every new claim fails anyway). A
//! script Redis does not know yet (after a restart or a failover) costs a
//! second pipeline, so two timeouts at worst: keep the engine's store
//! timeout above twice the replicas' timeout (the defaults, 5 s and at
//! most 1 s, are).
//!
//! What remains (docs/GUARANTEES.md, "Replicated Redis"): `WAIT` counts
//! replicas that *received* the write, in memory. A failover that promotes
//! another replica (one that did not acknowledge), or a replica that
//! restarts without the write before it is promoted, still loses it.

use std::time::Duration;

use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::{RedisError, ServerErrorKind, Value};

use super::RedisRecords;
use super::call::{RecordKey, ScriptCall};
use super::connection::Connection;
use crate::record::CorruptRecord;
use crate::store::StoreError;

/// The longest a write waits for its replicas: below a cluster's command
/// timeout (2 s) and the engine's default store timeout (5 s), so that a
/// `WAIT` answers before either gives up on it.
pub(super) const MAX_WAIT: Duration = Duration::from_secs(1);

/// How many replicas must acknowledge each claim, take-over and
/// completion, and how long to wait for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ReplicaAcks {
    replicas: u32,
    timeout_ms: u64,
}

impl ReplicaAcks {
    /// `None` for zero replicas (off). The timeout is clamped to 1 ms ..=
    /// [`MAX_WAIT`] (`WAIT` with 0 ms would wait forever).
    pub(super) fn new(replicas: u32, timeout: Duration) -> Option<Self> {
        let timeout = timeout.clamp(Duration::from_millis(1), MAX_WAIT);
        (replicas > 0).then(|| Self {
            replicas,
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(1000),
        })
    }
}

/// A pipeline's answers (server errors as values), and how many replicas
/// acknowledged its writes.
pub(super) struct Acked {
    /// One answer per command sent, `WAIT`'s excepted.
    pub(super) values: Vec<Value>,
    /// `WAIT`'s answer and what it was asked for; `None` when the store
    /// does not wait for replicas.
    acks: Option<(i64, ReplicaAcks)>,
}

impl Acked {
    /// The answer of a call sent without `WAIT` behind it.
    pub(super) fn unacked() -> Self {
        Self {
            values: Vec::new(),
            acks: None,
        }
    }

    /// `Ok` when the store does not wait for replicas or enough of them
    /// acknowledged the write; call it only for an answer that says this
    /// call wrote (a claim acquired, a completion stored).
    ///
    /// # Errors
    ///
    /// [`StoreError::NotReplicated`] when too few did.
    pub(super) fn replicated(&self) -> Result<(), StoreError> {
        match self.acks {
            Some((acked, wanted)) if acked < i64::from(wanted.replicas) => {
                Err(StoreError::NotReplicated {
                    wanted: wanted.replicas,
                    acked: u32::try_from(acked.max(0)).unwrap_or(0),
                })
            }
            _ => Ok(()),
        }
    }
}

impl RedisRecords {
    /// Sends `pipe` (commands on the one key `route`, a record's), with
    /// `WAIT` behind it on the same connection when the store waits for
    /// replicas and `writes` says the commands may write; answers one
    /// value per command, a command's server error as a value.
    pub(super) async fn send(
        &self,
        mut pipe: redis::Pipeline,
        route: &RecordKey<'_>,
        writes: bool,
    ) -> Result<Acked, StoreError> {
        let commands = pipe.len();
        let wanted = self.replica_acks.filter(|_| writes);
        if let Some(wanted) = wanted {
            pipe.cmd("WAIT").arg(wanted.replicas).arg(wanted.timeout_ms);
        }
        pipe.ignore_errors();
        let total = pipe.len();
        let mut values: Vec<Value> = match &self.connection {
            // The manager's own method (no boxed future, see `query`);
            // with `ignore_errors` a server error stays in its place.
            Connection::Single(connection) => {
                connection
                    .clone()
                    .send_packed_commands(&pipe, 0, total)
                    .await?
            }
            Connection::Cluster(connection) => {
                let route = SingleNodeRoutingInfo::SpecificNode(Route::with_key(
                    route.to_bytes(),
                    SlotAddr::Master,
                ));
                connection
                    .clone()
                    .route_pipeline(pipe, 0, total, route)
                    .await?
            }
        };
        if values.len() != total {
            return Err(CorruptRecord("a pipeline answered another number of commands").into());
        }
        let acks = match wanted {
            None => None,
            Some(wanted) => match values.pop() {
                Some(Value::Int(acked)) => Some((acked, wanted)),
                Some(Value::ServerError(error)) => {
                    return Err(RedisError::from(error).into());
                }
                _ => return Err(CorruptRecord("WAIT answered no count").into()),
            },
        };
        debug_assert_eq!(values.len(), commands);
        Ok(Acked { values, acks })
    }

    /// Calls a script that writes (a claim's take-over, a completion), with
    /// `WAIT` behind it when the store waits for replicas; loads the script
    /// and calls again when Redis does not know it (`NOSCRIPT`: a script
    /// that did not run).
    pub(super) async fn invoke_acked(
        &self,
        call: &ScriptCall,
        route: &RecordKey<'_>,
    ) -> Result<(Value, Acked), StoreError> {
        if self.replica_acks.is_none() {
            // No `WAIT` to send behind it: the call goes on its own, not
            // copied into a pipeline of one.
            let value = self.invoke(call).await?;
            return Ok((value, Acked::unacked()));
        }
        let pipe = || {
            let mut pipe = redis::pipe();
            pipe.add_command(call.command().clone());
            pipe
        };
        let mut acked = self.send(pipe(), route, true).await?;
        if matches!(acked.values.first(), Some(Value::ServerError(error)) if error.kind() == Some(ServerErrorKind::NoScript))
        {
            self.load(call).await?;
            acked = self.send(pipe(), route, true).await?;
        }
        match acked.values.first() {
            Some(Value::ServerError(error)) => Err(RedisError::from(error.clone()).into()),
            Some(value) => Ok((value.clone(), acked)),
            None => Err(CorruptRecord("a script call answered nothing").into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_replicas_is_off_and_the_timeout_is_clamped() {
        assert_eq!(ReplicaAcks::new(0, Duration::from_millis(100)), None);
        let timeout_ms = |timeout| ReplicaAcks::new(1, timeout).map(|acks| acks.timeout_ms);
        // `WAIT n 0` would block forever.
        assert_eq!(timeout_ms(Duration::ZERO), Some(1));
        assert_eq!(timeout_ms(Duration::from_micros(300)), Some(1));
        assert_eq!(timeout_ms(Duration::from_millis(250)), Some(250));
        assert_eq!(timeout_ms(Duration::from_secs(30)), Some(1000));
    }

    #[test]
    fn too_few_acknowledgements_are_not_replicated() {
        let wanted = ReplicaAcks::new(2, Duration::from_millis(100));
        let acked = |count: Option<i64>| Acked {
            values: vec![Value::Int(1)],
            acks: count.zip(wanted),
        };
        assert!(acked(None).replicated().is_ok(), "acknowledgements off");
        assert!(acked(Some(2)).replicated().is_ok());
        assert!(acked(Some(3)).replicated().is_ok());
        for (count, reported) in [(1, 1), (0, 0), (-1, 0)] {
            match acked(Some(count)).replicated() {
                Err(StoreError::NotReplicated { wanted: 2, acked }) => assert_eq!(acked, reported),
                other => panic!("{count} of 2 acknowledgements: {other:?}"),
            }
        }
    }
}
