//! Which primary of a Redis Cluster serves which hash slot, so that a batch
//! of claims or completions goes as one pipeline per primary (each command
//! answered on its own) instead of one round trip per key.
//!
//! The map is read with `CLUSTER SLOTS` when the store connects, and again
//! after a pipelined command answered `MOVED` or `ASK` (a resharding or a
//! failover moved its slot): such a command did not run, and the store
//! sends it again on its own, routed by redis-rs, which follows the
//! redirection. A stale map therefore costs round trips, never a result.

use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};

use redis::Value;

/// The number of hash slots of a Redis Cluster.
const SLOTS: u16 = 16384;

/// The hash slot of `key`, as Redis Cluster computes it: CRC16 (XMODEM)
/// of the key's hash tag (the bytes between its first `{` and the next
/// `}`, when not empty), else of the whole key, modulo 16384.
pub(super) fn slot(key: &[u8]) -> u16 {
    let tag = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tag.unwrap_or(key)) % SLOTS
}

/// The primaries' slot ranges: `(first, last, node)`, sorted by `first`.
#[derive(Debug, Default)]
pub(super) struct SlotMap {
    ranges: RwLock<Vec<(u16, u16, String)>>,
}

impl SlotMap {
    /// Replaces the map with what `CLUSTER SLOTS` answered. An answer of
    /// another shape leaves the map empty: every key then goes on its own.
    pub(super) fn update(&self, answer: &Value) {
        let ranges = parse(answer);
        *self.ranges.write().unwrap_or_else(PoisonError::into_inner) = ranges;
    }

    /// The node (`host:port`) serving `key`'s slot, if the map knows it.
    fn node_of(&self, key: &[u8]) -> Option<String> {
        let slot = slot(key);
        let ranges = self.ranges.read().unwrap_or_else(PoisonError::into_inner);
        let index = ranges.partition_point(|&(first, _, _)| first <= slot);
        let (first, last, node) = ranges.get(index.checked_sub(1)?)?;
        (*first..=*last).contains(&slot).then(|| node.clone())
    }

    /// Groups `keys` (by their index) per node: keys the map does not
    /// place get a group each.
    pub(super) fn groups(&self, keys: impl Iterator<Item = impl AsRef<[u8]>>) -> Vec<Vec<usize>> {
        let mut by_node: HashMap<String, usize> = HashMap::new();
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for (index, key) in keys.enumerate() {
            match self.node_of(key.as_ref()) {
                Some(node) => {
                    let group = *by_node.entry(node).or_insert_with(|| {
                        groups.push(Vec::new());
                        groups.len() - 1
                    });
                    groups[group].push(index);
                }
                None => groups.push(vec![index]),
            }
        }
        groups
    }
}

/// The ranges of a `CLUSTER SLOTS` answer: each entry is the first and
/// last slot, then the primary as `[host, port, id, …]`, then replicas.
fn parse(answer: &Value) -> Vec<(u16, u16, String)> {
    let Value::Array(entries) = answer else {
        return Vec::new();
    };
    let mut ranges: Vec<(u16, u16, String)> = entries
        .iter()
        .filter_map(|entry| {
            let Value::Array(parts) = entry else {
                return None;
            };
            let [
                Value::Int(first),
                Value::Int(last),
                Value::Array(primary),
                ..,
            ] = parts.as_slice()
            else {
                return None;
            };
            let host = match primary.first()? {
                Value::BulkString(host) => String::from_utf8(host.clone()).ok()?,
                Value::SimpleString(host) => host.clone(),
                _ => return None,
            };
            let Value::Int(port) = primary.get(1)? else {
                return None;
            };
            Some((
                u16::try_from(*first).ok()?,
                u16::try_from(*last).ok()?,
                format!("{host}:{port}"),
            ))
        })
        .collect();
    ranges.sort_by_key(|&(first, _, _)| first);
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_clusters() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot(b"123456789"), 0x31C3 % SLOTS);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
    }

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    #[test]
    fn keys_group_by_the_primary_of_their_slot() {
        let map = SlotMap::default();
        map.update(&Value::Array(vec![
            Value::Array(vec![
                Value::Int(8192),
                Value::Int(16383),
                node("127.0.0.1", 7102),
                node("127.0.0.1", 7202),
            ]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(8191),
                node("127.0.0.1", 7101),
            ]),
        ]));
        // "foo" is slot 12182, "bar" 5061, "hello" 866.
        let keys: [&[u8]; 4] = [b"foo", b"bar", b"hello", b"{foo}x"];
        assert_eq!(map.groups(keys.into_iter()), vec![vec![0, 3], vec![1, 2]]);
        // An answer it cannot read: every key on its own.
        map.update(&Value::Nil);
        assert_eq!(
            map.groups(keys.into_iter()),
            vec![vec![0], vec![1], vec![2], vec![3]]
        );
    }
}
