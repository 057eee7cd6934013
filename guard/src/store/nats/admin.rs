//! Operators' operations ([`AdminStore`]): listing a scope's records by
//! the bucket's keys, and forgetting one record with a fenced delete.

use futures_util::StreamExt as _;

use super::{NatsStore, RACE_ATTEMPTS, Slot, Written, token, untoken};
use crate::key::{IdempotencyKey, Scope};
use crate::store::AdminStore;
use crate::store::StoreError;
use crate::store::admin::{ForgetRule, Forgotten, Page, PageRequest, StateFilter};

/// How long the listing of a scope's keys may wait for its next key.
const KEYS_TIMEOUT: std::time::Duration = super::REQUEST_TIMEOUT;

impl NatsStore {
    /// The keys of `scope` that hold a record (delete markers left out),
    /// in byte order: an ordered consumer delivering the headers of the
    /// last message of each of the scope's subjects.
    async fn scope_keys(&self, scope: &str) -> Result<Vec<String>, StoreError> {
        use async_nats::jetstream::consumer::{DeliverPolicy, ReplayPolicy, push::OrderedConfig};
        let prefix = format!("{}{}.", self.inner.prefix, token(scope));
        let consumer = self
            .inner
            .stream
            .create_consumer(OrderedConfig {
                deliver_subject: self.inner.context.client().new_inbox(),
                filter_subject: format!("{prefix}*"),
                headers_only: true,
                replay_policy: ReplayPolicy::Instant,
                deliver_policy: DeliverPolicy::LastPerSubject,
                description: Some("idempotency-guard admin listing".to_owned()),
                ..Default::default()
            })
            .await
            .map_err(super::unavailable)?;
        let mut keys = Vec::new();
        if consumer.cached_info().num_pending == 0 {
            return Ok(keys);
        }
        let mut messages = consumer.messages().await.map_err(super::unavailable)?;
        loop {
            let next = tokio::time::timeout(KEYS_TIMEOUT, messages.next())
                .await
                .map_err(|_| StoreError::Timeout(KEYS_TIMEOUT))?;
            let Some(message) = next else { break };
            let message = message.map_err(super::unavailable)?;
            let pending = message.info().map_err(StoreError::Unavailable)?.pending;
            let deleted = message
                .headers
                .as_ref()
                .and_then(|h| h.get("KV-Operation"))
                .is_some_and(|op| matches!(op.as_str(), "DEL" | "PURGE"));
            if !deleted
                && let Some(key) = message
                    .subject
                    .as_str()
                    .strip_prefix(&prefix)
                    .and_then(untoken)
            {
                keys.push(key);
            }
            if pending == 0 {
                break;
            }
        }
        keys.sort_unstable();
        Ok(keys)
    }
}

impl AdminStore for NatsStore {
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
        let wanted = usize::try_from(limit)
            .unwrap_or(usize::MAX)
            .saturating_add(1);
        let mut records = Vec::new();
        for key in self.scope_keys(scope).await? {
            if page.after.is_some_and(|after| key.as_str() <= after) {
                continue;
            }
            // Each record from the leader, as every read that decides.
            let key = crate::record::stored_key(&key)?;
            if let Slot::Record(stored) = self.read(&typed_scope, &key, self.deadline()).await?
                && filter.accepts(&stored.record)
            {
                records.push(stored.record);
                if records.len() == wanted {
                    break;
                }
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
        // A scope or key that breaks its rule names no record.
        let (Ok(typed_scope), Ok(typed_key)) =
            (Scope::try_from(scope), IdempotencyKey::from_raw(key))
        else {
            return Ok(Forgotten::Missing);
        };
        let deadline = self.deadline();
        let subject = self.subject(scope, key);
        for _ in 0..RACE_ATTEMPTS {
            let Slot::Record(stored) = self.read(&typed_scope, &typed_key, deadline).await? else {
                return Ok(Forgotten::Missing);
            };
            if stored.record.is_expired() {
                return Ok(Forgotten::Missing);
            }
            let state = stored.record.state();
            if !rule.allows(state) {
                return Ok(Forgotten::Refused(state));
            }
            match self.delete(&subject, stored.revision, deadline).await? {
                Written::Stored(_) => {
                    self.events.publish(scope, key);
                    return Ok(Forgotten::Deleted(state));
                }
                // Changed meanwhile (renewed, completed): decide again.
                Written::Conflict => {}
                Written::Unknown(error) => return Err(error),
            }
        }
        Err(StoreError::Unavailable(
            "forgetting the record kept racing other writes".into(),
        ))
    }
}
