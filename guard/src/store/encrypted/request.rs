//! Sealing the request a resumable run keeps ([`StoredRequest`]): its
//! method, path, headers and body are sealed together with the ring's
//! current key; the completer's account (attempts, given up) stays in
//! clear, as the status API shows it. The sealed body is the key id's
//! length (one byte), the key id, the nonce and the ciphertext; the scope
//! and key are the associated data, so a sealed request moved to another
//! record does not decrypt.

use aes_gcm::aead::{Aead, OsRng, Payload};
use aes_gcm::{AeadCore, Aes256Gcm};

use super::{EncryptedStore, NONCE_LEN, failure};
use crate::record::StoredRequest;
use crate::store::StoreError;

/// The associated data of the request of `(scope, key)`.
fn associated_data(scope: &str, key: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(24 + scope.len() + key.len());
    aad.extend_from_slice(b"idem-request-v1");
    for part in [scope, key] {
        aad.extend_from_slice(&u32::try_from(part.len()).unwrap_or(u32::MAX).to_be_bytes());
        aad.extend_from_slice(part.as_bytes());
    }
    aad
}

impl<S> EncryptedStore<S> {
    /// The request of `(scope, key)`, sealed.
    pub(super) fn seal_request(
        &self,
        scope: &str,
        key: &str,
        request: &StoredRequest,
    ) -> Result<StoredRequest, StoreError> {
        let (id, cipher) = self
            .keys
            .keys
            .first()
            .ok_or(StoreError::Unsupported("encryption without a key"))?;
        let mut clear = request.clone();
        (clear.attempts, clear.gave_up) = (0, false);
        let plaintext = clear.encode();
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let aad = associated_data(scope, key);
        let ciphertext = cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: &plaintext,
                    aad: &aad,
                },
            )
            .map_err(|_| StoreError::Unsupported("sealing this request"))?;
        let id = &id.as_bytes()[..id.len().min(255)];
        let mut sealed = Vec::with_capacity(1 + id.len() + NONCE_LEN + ciphertext.len());
        sealed.push(u8::try_from(id.len()).unwrap_or(u8::MAX));
        sealed.extend_from_slice(id);
        sealed.extend_from_slice(&nonce);
        sealed.extend_from_slice(&ciphertext);
        Ok(StoredRequest::sealed(
            sealed,
            request.attempts,
            request.gave_up,
        ))
    }

    /// The request of `(scope, key)`, opened.
    ///
    /// # Errors
    ///
    /// [`StoreError::Corrupt`] when it is not sealed (the store never
    /// writes one so), sealed with a key the ring does not hold, or does
    /// not authenticate.
    pub(super) fn open_request(
        &self,
        scope: &str,
        key: &str,
        request: &StoredRequest,
    ) -> Result<StoredRequest, StoreError> {
        let invalid = || failure("invalid", "a sealed request is invalid");
        if !request.is_sealed() {
            return Err(invalid());
        }
        let (&id_len, rest) = request.body.split_first().ok_or_else(invalid)?;
        let (id, rest) = rest
            .split_at_checked(usize::from(id_len))
            .ok_or_else(invalid)?;
        let id = std::str::from_utf8(id).map_err(|_| invalid())?;
        let cipher = self.keys.get(id).ok_or_else(|| {
            failure(
                "unknown-key",
                "a request was sealed with an encryption key id this store does not hold",
            )
        })?;
        let (nonce, ciphertext) = rest.split_at_checked(NONCE_LEN).ok_or_else(invalid)?;
        let nonce: [u8; NONCE_LEN] = nonce.try_into().map_err(|_| invalid())?;
        let aad = associated_data(scope, key);
        let plaintext = cipher
            .decrypt(
                &aes_gcm::Nonce::from(nonce),
                Payload {
                    msg: ciphertext,
                    aad: &aad,
                },
            )
            .map_err(|_| failure("invalid", "a sealed request does not authenticate"))?;
        let mut opened = StoredRequest::decode(&plaintext).map_err(|_| invalid())?;
        (opened.attempts, opened.gave_up) = (request.attempts, request.gave_up);
        Ok(opened)
    }
}
