//! [`EncryptedStore`]: encryption at rest of stored responses, over any
//! store (composition, as `tower-sessions`' `CachingSessionStore`).
//!
//! A completed record's response (its headers and its body) is sealed with
//! AES-256-GCM before the inner store sees it; the status stays in clear,
//! because the status API shows it. What the inner store keeps is:
//!
//! - the status, in clear;
//! - one header, `idempotency-sealed: v1 <key id>`, naming the key that
//!   sealed it (so keys rotate: new records take the current key, older
//!   ones stay readable while their key is still in the ring);
//! - as the body: a random 96-bit nonce, then the ciphertext and tag of the
//!   headers and the body. A response too large to store keeps no body (so
//!   whether a body is stored stays visible to the status API, which needs
//!   no key): its sealed headers follow the key id in the marker, base64.
//!   The scope, the key and the status are the associated data: a sealed
//!   response moved to another record does not decrypt.
//!
//! A run's recorded steps (SPEC §12) are sealed one by one, each result a
//! JSON string `v1 <key id> <base64>` (`steps.rs`); their names stay in
//! clear, as the status API shows how far a run got. The request a
//! resumable run keeps for the completer is sealed whole (method, path,
//! headers, body; `request.rs`), its attempts and give-up in clear.
//!
//! The fingerprint, method and path stay in clear: the status API shows
//! them, and the guard compares fingerprints. A path whose query holds a
//! secret is not protected.
//!
//! Reading a record sealed with a key id the ring does not hold, or one
//! whose ciphertext does not authenticate, fails with
//! [`StoreError::Corrupt`] (the request answers 503, never a garbled
//! replay) and counts in `idempotency_decrypt_failures_total{reason}`.
//! A completed record without the `idempotency-sealed` header (written
//! before encryption was turned on, or planted by whoever can write the
//! store) is read as it is by a store built here, and refused
//! ([`StoreError::Corrupt`]) with [`EncryptedStore::with_require_sealed`],
//! which every configured entry point turns on by default
//! ([`StoreOptions::require_sealed`](crate::store::StoreOptions::require_sealed));
//! either way it is logged and counted in `idempotency_unsealed_reads_total`.
//!
//! Keys come from an environment variable or a file
//! ([`EncryptionKeys::parse`]: `<id>:<base64 of 32 bytes>` entries, the
//! first one current) and are never logged: `Debug` shows their ids only.
//! The key-status service needs no key: it shows the status and whether a
//! body is stored, both in clear.
//!
//! Transactional mode writes its completion inside the handler's
//! transaction, past this wrapper: this wrapper does not implement
//! [`TransactionalStore`](crate::store::TransactionalStore), so
//! transactional mode cannot silently store a response in clear.
//!
//! The keys, and how they are read, are in `keys.rs`.

use std::time::Duration;

use aes_gcm::aead::{Aead, OsRng, Payload};
use aes_gcm::{AeadCore, Aes256Gcm};
use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::events::RecordEvents;
use crate::key::{IdempotencyKey, Scope};
use crate::record::StoredRequest;
use crate::record::{CorruptRecord, LeaseToken, Record, Step, StoredResponse};
use crate::store::{Claim, Lease, NewRecord, Store, StoreError};

mod keys;
mod request;
mod steps;

pub use keys::{
    EncryptionKeys, KEYS_FILE_VARIABLE, KEYS_VARIABLE, KeysError, REQUIRE_SEALED_VARIABLE,
    require_sealed_from_environment,
};

/// Sealed records that could not be opened, by `reason` (`unknown-key`,
/// `invalid`).
pub const DECRYPT_FAILURES_TOTAL: &str = "idempotency_decrypt_failures_total";

/// The header of a sealed response: `v1 <key id>`.
pub static SEALED: HeaderName = HeaderName::from_static("idempotency-sealed");

const NONCE_LEN: usize = 12;

/// A store whose stored responses are sealed with AES-256-GCM.
#[derive(Debug, Clone)]
pub struct EncryptedStore<S> {
    inner: S,
    keys: EncryptionKeys,
    require_sealed: bool,
}

/// Reads of a completed response without the sealed marker, allowed or
/// refused (`idempotency_unsealed_reads_total{refused}`).
pub const UNSEALED_READS_TOTAL: &str = "idempotency_unsealed_reads_total";

impl<S> EncryptedStore<S> {
    /// Wraps `inner`: responses are sealed with `keys`' current key.
    pub fn new(inner: S, keys: EncryptionKeys) -> Self {
        Self {
            inner,
            keys,
            require_sealed: false,
        }
    }

    /// Whether a completed response without the sealed marker is refused
    /// ([`StoreError::Corrupt`]: 503, never replayed) instead of read as
    /// it is. Either way such a read is logged and counted in
    /// `idempotency_unsealed_reads_total`.
    ///
    /// The default value is `false` here, so records written before
    /// encryption was turned on still replay; the configured entry points
    /// ([`StoreOptions::require_sealed`](crate::store::StoreOptions::require_sealed),
    /// `IDEMPOTENCY_REQUIRE_SEALED`, the gateway's `require_sealed`) turn it
    /// on by default, for a new deployment.
    ///
    /// # Warning
    ///
    /// Without it, whoever can write the store can plant an answer in
    /// clear that is replayed as is.
    ///
    /// ```
    /// # use idempotency_guard::store::encrypted::{EncryptedStore, EncryptionKeys};
    /// let keys = EncryptionKeys::parse("a:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=").unwrap();
    /// let store = EncryptedStore::new((), keys).with_require_sealed(true);
    /// # let _ = store;
    /// ```
    #[must_use]
    pub fn with_require_sealed(mut self, required: bool) -> Self {
        self.require_sealed = required;
        self
    }

    /// Whether a completed response without the sealed marker is refused
    /// (see [`EncryptedStore::with_require_sealed`]).
    pub fn requires_sealed(&self) -> bool {
        self.require_sealed
    }

    /// The store underneath (what it holds is sealed).
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

/// The associated data: the record's identity and status.
fn associated_data(scope: &str, key: &str, status: u16) -> Vec<u8> {
    let mut aad = Vec::with_capacity(12 + scope.len() + key.len());
    aad.extend_from_slice(b"idem-v1");
    aad.extend_from_slice(&u32::try_from(scope.len()).unwrap_or(u32::MAX).to_be_bytes());
    aad.extend_from_slice(scope.as_bytes());
    aad.extend_from_slice(key.as_bytes());
    aad.extend_from_slice(&status.to_be_bytes());
    aad
}

fn failure(reason: &'static str, message: &'static str) -> StoreError {
    metrics::counter!(DECRYPT_FAILURES_TOTAL, "reason" => reason).increment(1);
    StoreError::Corrupt(CorruptRecord(message))
}

impl<S> EncryptedStore<S> {
    /// Seals `response` for the record `(scope, key)`.
    fn seal(
        &self,
        scope: &str,
        key: &str,
        response: &StoredResponse,
    ) -> Result<StoredResponse, StoreError> {
        let (id, cipher) = self
            .keys
            .keys
            .first()
            .ok_or(StoreError::Unsupported("encryption without a key"))?;
        let headers = response.encode_headers();
        let mut plaintext =
            Vec::with_capacity(5 + headers.len() + response.body.as_ref().map_or(0, Bytes::len));
        plaintext.push(u8::from(response.body.is_some()));
        plaintext.extend_from_slice(
            &u32::try_from(headers.len())
                .unwrap_or(u32::MAX)
                .to_be_bytes(),
        );
        plaintext.extend_from_slice(&headers);
        if let Some(body) = &response.body {
            plaintext.extend_from_slice(body);
        }
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let aad = associated_data(scope, key, response.status.as_u16());
        let ciphertext = cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: &plaintext,
                    aad: &aad,
                },
            )
            .map_err(|_| StoreError::Unsupported("sealing this response"))?;
        let mut sealed = Vec::with_capacity(NONCE_LEN + ciphertext.len());
        sealed.extend_from_slice(&nonce);
        sealed.extend_from_slice(&ciphertext);
        // Whether a body is stored stays visible (the status API reports
        // it without keys): a response too large to store keeps no body,
        // and its sealed headers ride in the marker.
        let (marker, body) = match response.body {
            Some(_) => (format!("v1 {id}"), Some(Bytes::from(sealed))),
            None => (
                format!(
                    "v1 {id} {}",
                    base64::engine::general_purpose::STANDARD.encode(&sealed)
                ),
                None,
            ),
        };
        let mut sealed_headers = HeaderMap::with_capacity(1);
        let marker =
            HeaderValue::from_str(&marker).map_err(|_| StoreError::Unsupported("this key id"))?;
        sealed_headers.insert(SEALED.clone(), marker);
        Ok(StoredResponse {
            status: response.status,
            headers: sealed_headers,
            body,
        })
    }

    /// Opens a record's response, if it is sealed, and its steps.
    fn open(&self, mut record: Record) -> Result<Record, StoreError> {
        if !record.steps.is_empty() {
            let steps = std::mem::take(&mut record.steps);
            record.steps = self.open_steps(record.scope.as_str(), record.key.as_str(), steps)?;
        }
        if let Some(request) = record.request.take() {
            let opened = self.open_request(record.scope.as_str(), record.key.as_str(), &request)?;
            record.request = Some(Box::new(opened));
        }
        let Some(response) = record.response.take() else {
            return Ok(record);
        };
        let Some(marker) = response.headers.get(&SEALED) else {
            // Written before encryption was on, or planted.
            let refused = if self.require_sealed { "true" } else { "false" };
            metrics::counter!(UNSEALED_READS_TOTAL, "refused" => refused).increment(1);
            tracing::warn!(
                scope = %record.scope,
                refused = self.require_sealed,
                "a completed response in the encrypted store is not sealed"
            );
            if self.require_sealed {
                return Err(failure(
                    "unsealed",
                    "the stored response is not sealed, and sealing is required",
                ));
            }
            record.response = Some(response);
            return Ok(record);
        };
        let mut parts = marker
            .to_str()
            .ok()
            .and_then(|m| m.strip_prefix("v1 "))
            .ok_or_else(|| failure("invalid", "the sealed response's marker is invalid"))?
            .split(' ');
        let id = parts.next().unwrap_or_default();
        let cipher = self.keys.get(id).ok_or_else(|| {
            failure(
                "unknown-key",
                "the response was sealed with an encryption key id this store does not hold",
            )
        })?;
        let in_marker = parts
            .next()
            .map(|encoded| base64::engine::general_purpose::STANDARD.decode(encoded))
            .transpose()
            .map_err(|_| failure("invalid", "the sealed response's marker is invalid"))?;
        let sealed = in_marker
            .as_deref()
            .or(response.body.as_deref())
            .unwrap_or_default();
        if sealed.len() < NONCE_LEN {
            return Err(failure("invalid", "the sealed response is truncated"));
        }
        let (nonce, ciphertext) = sealed.split_at(NONCE_LEN);
        let nonce: [u8; NONCE_LEN] = nonce
            .try_into()
            .map_err(|_| failure("invalid", "the sealed response is truncated"))?;
        let aad = associated_data(
            record.scope.as_str(),
            record.key.as_str(),
            response.status.as_u16(),
        );
        let plaintext = cipher
            .decrypt(
                &aes_gcm::Nonce::from(nonce),
                Payload {
                    msg: ciphertext,
                    aad: &aad,
                },
            )
            .map_err(|_| failure("invalid", "the sealed response does not authenticate"))?;
        let invalid = || failure("invalid", "the sealed response's plaintext is invalid");
        let has_body = *plaintext.first().ok_or_else(invalid)? == 1;
        let headers_len = plaintext
            .get(1..5)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(u32::from_be_bytes)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(invalid)?;
        let headers = plaintext.get(5..5 + headers_len).ok_or_else(invalid)?;
        let body = plaintext.get(5 + headers_len..).ok_or_else(invalid)?;
        record.response = Some(StoredResponse {
            status: response.status,
            headers: StoredResponse::decode_headers(headers)?,
            body: has_body.then(|| Bytes::copy_from_slice(body)),
        });
        Ok(record)
    }
}

impl<S: Store> Store for EncryptedStore<S> {
    async fn claim(&self, new: &NewRecord<'_>) -> Result<Claim, StoreError> {
        match self.inner.claim(new).await? {
            Claim::Existing(record) => Ok(Claim::Existing(Box::new(self.open(*record)?))),
            acquired => Ok(acquired),
        }
    }

    async fn take_over(
        &self,
        previous: LeaseToken,
        new: &NewRecord<'_>,
    ) -> Result<Option<Lease>, StoreError> {
        self.inner.take_over(previous, new).await
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        let sealed = self.seal(lease.scope.as_str(), lease.key.as_str(), response)?;
        self.inner.complete(lease, &sealed).await
    }

    async fn renew(&self, lease: &Lease, duration: Duration) -> Result<(), StoreError> {
        self.inner.renew(lease, duration).await
    }

    async fn record_steps(&self, lease: &Lease, steps: &[Step]) -> Result<(), StoreError> {
        let sealed = self.seal_steps(lease.scope.as_str(), lease.key.as_str(), steps)?;
        self.inner.record_steps(lease, &sealed).await
    }

    async fn record_request(
        &self,
        lease: &Lease,
        request: Option<&StoredRequest>,
    ) -> Result<(), StoreError> {
        let sealed = request
            .map(|request| self.seal_request(lease.scope.as_str(), lease.key.as_str(), request))
            .transpose()?;
        self.inner.record_request(lease, sealed.as_ref()).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.inner.release(lease).await
    }

    async fn settle(&self, lease: &Lease, wait: Duration) -> Result<(), StoreError> {
        self.inner.settle(lease, wait).await
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        self.inner
            .get(scope, key)
            .await?
            .map(|record| self.open(record))
            .transpose()
    }

    async fn get_many(
        &self,
        scope: &Scope,
        keys: &[IdempotencyKey],
    ) -> Result<Vec<Option<Record>>, StoreError> {
        self.inner
            .get_many(scope, keys)
            .await?
            .into_iter()
            .map(|record| record.map(|r| self.open(r)).transpose())
            .collect()
    }

    fn events(&self) -> &RecordEvents {
        self.inner.events()
    }
}

// No `TransactionalStore`: a transactional completion would write the
// response in clear past the sealing, so transactional mode cannot be turned
// on over an encrypted store (it does not compile).
impl<S: crate::store::Purge> crate::store::Purge for EncryptedStore<S> {
    async fn purge(&self, limit: u32) -> Result<u64, StoreError> {
        self.inner.purge(limit).await
    }
}

impl<S: crate::store::AdminStore> crate::store::AdminStore for EncryptedStore<S> {
    async fn list(
        &self,
        scope: &str,
        filter: crate::store::admin::StateFilter,
        page: crate::store::admin::PageRequest<'_>,
    ) -> Result<crate::store::admin::Page, StoreError> {
        let page = self.inner.list(scope, filter, page).await?;
        Ok(crate::store::admin::Page {
            records: page
                .records
                .into_iter()
                .map(|record| self.open(record))
                .collect::<Result<_, _>>()?,
            next: page.next,
        })
    }

    async fn forget(
        &self,
        scope: &str,
        key: &str,
        rule: crate::store::admin::ForgetRule,
    ) -> Result<crate::store::admin::Forgotten, StoreError> {
        self.inner.forget(scope, key, rule).await
    }

    async fn held_without_record(
        &self,
        scope: &str,
        keys: &[&str],
    ) -> Result<Vec<bool>, StoreError> {
        self.inner.held_without_record(scope, keys).await
    }
}
