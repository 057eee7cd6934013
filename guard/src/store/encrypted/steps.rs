//! Sealing a run's recorded steps: each step's result is sealed on its own
//! with the ring's current key, its name and input hash stay in clear (the
//! status API shows how far a run got). A sealed result is the JSON string
//! `v1 <key id> <base64 of nonce, ciphertext and tag>`; the scope, the
//! key, the step's position and its name are the associated data, so a
//! sealed result moved to another record or step does not decrypt.

use aes_gcm::aead::{Aead, OsRng, Payload};
use aes_gcm::{AeadCore, Aes256Gcm};
use base64::Engine as _;

use super::{EncryptedStore, NONCE_LEN, failure};
use crate::record::Step;
use crate::store::StoreError;

/// The associated data of step `index` of `(scope, key)`.
fn associated_data(scope: &str, key: &str, index: usize, name: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(24 + scope.len() + key.len() + name.len());
    aad.extend_from_slice(b"idem-step-v1");
    for part in [scope, key] {
        aad.extend_from_slice(&u32::try_from(part.len()).unwrap_or(u32::MAX).to_be_bytes());
        aad.extend_from_slice(part.as_bytes());
    }
    aad.extend_from_slice(&u32::try_from(index).unwrap_or(u32::MAX).to_be_bytes());
    aad.extend_from_slice(name.as_bytes());
    aad
}

impl<S> EncryptedStore<S> {
    /// The steps of `(scope, key)` with each result sealed.
    pub(super) fn seal_steps(
        &self,
        scope: &str,
        key: &str,
        steps: &[Step],
    ) -> Result<Vec<Step>, StoreError> {
        let (id, cipher) = self
            .keys
            .keys
            .first()
            .ok_or(StoreError::Unsupported("encryption without a key"))?;
        steps
            .iter()
            .enumerate()
            .map(|(index, step)| {
                let plaintext = serde_json::to_vec(&step.value)
                    .map_err(|_| StoreError::Unsupported("sealing this step"))?;
                let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
                let aad = associated_data(scope, key, index, &step.name);
                let ciphertext = cipher
                    .encrypt(
                        &nonce,
                        Payload {
                            msg: &plaintext,
                            aad: &aad,
                        },
                    )
                    .map_err(|_| StoreError::Unsupported("sealing this step"))?;
                let mut sealed = Vec::with_capacity(NONCE_LEN + ciphertext.len());
                sealed.extend_from_slice(&nonce);
                sealed.extend_from_slice(&ciphertext);
                let encoded = base64::engine::general_purpose::STANDARD.encode(&sealed);
                Ok(Step {
                    name: step.name.clone(),
                    input: step.input.clone(),
                    value: serde_json::Value::String(format!("v1 {id} {encoded}")),
                })
            })
            .collect()
    }

    /// The steps of `(scope, key)` with each result opened.
    ///
    /// # Errors
    ///
    /// [`StoreError::Corrupt`] when a result is not sealed (the store never
    /// writes one so), sealed with a key the ring does not hold, or does not
    /// authenticate.
    pub(super) fn open_steps(
        &self,
        scope: &str,
        key: &str,
        steps: Vec<Step>,
    ) -> Result<Vec<Step>, StoreError> {
        steps
            .into_iter()
            .enumerate()
            .map(|(index, step)| {
                let invalid = || failure("invalid", "a sealed step is invalid");
                let sealed = step.value.as_str().ok_or_else(invalid)?;
                let mut parts = sealed.strip_prefix("v1 ").ok_or_else(invalid)?.split(' ');
                let id = parts.next().unwrap_or_default();
                let cipher = self.keys.get(id).ok_or_else(|| {
                    failure(
                        "unknown-key",
                        "a step was sealed with an encryption key id this store does not hold",
                    )
                })?;
                let sealed = parts
                    .next()
                    .and_then(|encoded| {
                        base64::engine::general_purpose::STANDARD
                            .decode(encoded)
                            .ok()
                    })
                    .ok_or_else(invalid)?;
                if sealed.len() < NONCE_LEN {
                    return Err(invalid());
                }
                let (nonce, ciphertext) = sealed.split_at(NONCE_LEN);
                let nonce: [u8; NONCE_LEN] = nonce.try_into().map_err(|_| invalid())?;
                let aad = associated_data(scope, key, index, &step.name);
                let plaintext = cipher
                    .decrypt(
                        &aes_gcm::Nonce::from(nonce),
                        Payload {
                            msg: ciphertext,
                            aad: &aad,
                        },
                    )
                    .map_err(|_| failure("invalid", "a sealed step does not authenticate"))?;
                let value = serde_json::from_slice(&plaintext).map_err(|_| invalid())?;
                Ok(Step { value, ..step })
            })
            .collect()
    }
}
