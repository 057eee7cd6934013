//! The operators' operations on Redis ([`AdminStore`]): a listing walks
//! the scope's keys with `SCAN` (on a cluster, on every primary in turn;
//! never `KEYS`) and reads them in chunks; a forget is one script that
//! decides and deletes.

use super::call::ScriptCall;
use super::connection::Connection;
use super::scripts::ADMIN_FORGET;
use super::{RECORDS, RedisRecords, parse_record_key};
use crate::key::Scope;
use crate::record::{CorruptRecord, RecordState};
use crate::store::admin::{ForgetRule, Forgotten, Page, PageRequest, StateFilter};
use crate::store::{AdminStore, Store, StoreError};

/// How many records a listing reads per round of scripts.
const ADMIN_READ_CHUNK: usize = 100;

/// Escapes the glob characters of `text` for `SCAN ... MATCH`.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

impl RedisRecords {
    /// Every Redis key matching `pattern`: `SCAN` on one Redis; on a
    /// cluster, `SCAN` on every primary in turn (the primaries named by
    /// `CLUSTER NODES`), never `KEYS`, so no node is blocked while it
    /// walks its keys.
    async fn admin_keys(&self, pattern: &str) -> Result<Vec<Vec<u8>>, StoreError> {
        use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        let scan = |cursor: u64| {
            let mut command = redis::cmd("SCAN");
            command
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000);
            command
        };
        let shape = || CorruptRecord("SCAN returned an unexpected shape");
        let mut keys = Vec::new();
        match &self.connection {
            Connection::Single(connection) => {
                let mut connection = connection.clone();
                let mut cursor: u64 = 0;
                loop {
                    let (next, batch): (u64, Vec<Vec<u8>>) =
                        scan(cursor).query_async(&mut connection).await?;
                    keys.extend(batch);
                    if next == 0 {
                        return Ok(keys);
                    }
                    cursor = next;
                }
            }
            Connection::Cluster(connection) => {
                let mut connection = connection.clone();
                let mut nodes = redis::cmd("CLUSTER");
                nodes.arg("NODES");
                let nodes: String = redis::from_redis_value(
                    connection
                        .route_command(
                            nodes,
                            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
                        )
                        .await?,
                )
                .map_err(|_| CorruptRecord("CLUSTER NODES returned an unexpected shape"))?;
                for (host, port) in primaries(&nodes) {
                    let mut cursor: u64 = 0;
                    loop {
                        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port,
                        });
                        let (next, batch): (u64, Vec<Vec<u8>>) = redis::from_redis_value(
                            connection.route_command(scan(cursor), route).await?,
                        )
                        .map_err(|_| shape())?;
                        keys.extend(batch);
                        if next == 0 {
                            break;
                        }
                        cursor = next;
                    }
                }
                Ok(keys)
            }
        }
    }
}

/// The addresses of the live primaries in a `CLUSTER NODES` answer (one
/// line per node: id, `host:port@bus-port`, flags, …).
fn primaries(nodes: &str) -> Vec<(String, u16)> {
    nodes
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let (_id, address, flags) = (fields.next()?, fields.next()?, fields.next()?);
            let flags: Vec<&str> = flags.split(',').collect();
            if !flags.contains(&"master") || flags.iter().any(|flag| flag.starts_with("fail")) {
                return None;
            }
            let address = address.split('@').next()?;
            let (host, port) = address.rsplit_once(':')?;
            Some((host.to_owned(), port.parse().ok()?))
        })
        .collect()
}

impl AdminStore for RedisRecords {
    async fn list(
        &self,
        scope: &str,
        filter: StateFilter,
        page: PageRequest<'_>,
    ) -> Result<Page, StoreError> {
        let limit = page.clamped_limit();
        // A scope that breaks the rule holds no record.
        let Ok(typed_scope) = Scope::try_from(scope) else {
            return Ok(Page::from_overfetch(Vec::new(), limit));
        };
        let wanted = usize::try_from(limit).unwrap_or(usize::MAX) + 1;
        let pattern = format!(
            "{}:{RECORDS}:{}:{}:*",
            glob_escape(&self.prefix),
            scope.len(),
            glob_escape(scope)
        );
        let mut keys: Vec<String> = self
            .admin_keys(&pattern)
            .await?
            .iter()
            .filter_map(|raw| parse_record_key(&self.prefix, raw))
            .filter(|(found_scope, key)| {
                found_scope == scope && page.after.is_none_or(|after| key.as_str() > after)
            })
            .map(|(_, key)| key)
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let mut records = Vec::new();
        for chunk in keys.chunks(ADMIN_READ_CHUNK) {
            let chunk = chunk
                .iter()
                .map(|key| crate::record::stored_key(key))
                .collect::<Result<Vec<_>, _>>()?;
            let read = futures_util::future::try_join_all(
                chunk.iter().map(|key| self.get(&typed_scope, key)),
            )
            .await?;
            records.extend(read.into_iter().flatten().filter(|r| filter.accepts(r)));
            if records.len() >= wanted {
                break;
            }
        }
        Ok(Page::from_overfetch(records, limit))
    }

    async fn forget(
        &self,
        scope: &str,
        key: &str,
        rule: ForgetRule,
    ) -> Result<Forgotten, StoreError> {
        let flag = |state| if rule.allows(state) { "1" } else { "0" };
        let mut call = ScriptCall::new(&ADMIN_FORGET, 1, 80);
        call.arg(self.key_arg(RECORDS, scope, key))
            .arg(flag(RecordState::Completed))
            .arg(flag(RecordState::Abandoned))
            .arg(&*self.channel);
        let reply: (i64, String) = redis::from_redis_value(self.invoke(&call).await?)
            .map_err(|_| CorruptRecord("the forget script returned an unexpected shape"))?;
        let state = match reply.1.as_str() {
            "c" => RecordState::Completed,
            "a" => RecordState::Abandoned,
            _ => RecordState::InFlight,
        };
        match reply.0 {
            0 => Ok(Forgotten::Missing),
            1 => {
                // Other processes hear of it by pub/sub; this one at once
                // (its replay cache must not answer for the deleted record
                // while the message is on its way back).
                self.events.publish(scope, key);
                Ok(Forgotten::Deleted(state))
            }
            2 => Ok(Forgotten::Refused(state)),
            _ => Err(CorruptRecord("the forget script returned an unexpected shape").into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_name_their_live_primaries() {
        let nodes = "a1 127.0.0.1:7101@17101 myself,master - 0 0 1 connected 0-5460\n\
                     b2 127.0.0.1:7102@17102 master - 0 0 2 connected 5461-10922\n\
                     c3 127.0.0.1:7104@17104 slave a1 0 0 1 connected\n\
                     d4 10.0.0.9:7103@17103 master,fail - 0 0 3 disconnected\n";
        assert_eq!(
            primaries(nodes),
            vec![
                ("127.0.0.1".to_owned(), 7101),
                ("127.0.0.1".to_owned(), 7102)
            ]
        );
    }
}
