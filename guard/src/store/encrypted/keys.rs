//! The keys of an [`EncryptedStore`](super::EncryptedStore): a ring of
//! AES-256-GCM keys, read from the environment or a file (the current one
//! seals, every one opens), and the `require_sealed` switch.

use aes_gcm::Aes256Gcm;
use aes_gcm::aead::KeyInit;
use base64::Engine as _;

/// The environment variable apps read encryption keys from
/// ([`EncryptionKeys::from_environment`]).
pub const KEYS_VARIABLE: &str = "IDEMPOTENCY_ENCRYPTION_KEYS";

/// The environment variable naming a file of encryption keys
/// ([`EncryptionKeys::from_environment`]).
pub const KEYS_FILE_VARIABLE: &str = "IDEMPOTENCY_ENCRYPTION_KEYS_FILE";

/// The environment variable apps read the `require_sealed` switch from
/// ([`require_sealed_from_environment`]): `true` (the default when unset)
/// or `false`.
pub const REQUIRE_SEALED_VARIABLE: &str = "IDEMPOTENCY_REQUIRE_SEALED";

/// Whether an encrypted store refuses records without the sealed marker,
/// from [`REQUIRE_SEALED_VARIABLE`]: `true` or `1`, `false` or `0`.
///
/// The default value is `true`: a new deployment has no record written
/// in clear, so one found there was planted. An operator turning
/// encryption on over records already stored sets it to `false` until
/// those records' retention has passed.
///
/// # Errors
///
/// [`KeysError::RequireSealed`] for another value.
pub fn require_sealed_from_environment() -> Result<bool, KeysError> {
    match std::env::var(REQUIRE_SEALED_VARIABLE) {
        Err(_) => Ok(true),
        Ok(value) => parse_require_sealed(&value),
    }
}

/// `true` or `1`, `false` or `0` (surrounding whitespace ignored).
fn parse_require_sealed(value: &str) -> Result<bool, KeysError> {
    match value.trim() {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(KeysError::RequireSealed {
            value: value.to_owned(),
        }),
    }
}

/// The encryption keys: the current one seals, every one opens.
#[derive(Clone)]
pub struct EncryptionKeys {
    /// `(id, cipher)`; the first is current.
    pub(super) keys: Vec<(String, Aes256Gcm)>,
}

impl std::fmt::Debug for EncryptionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|(id, _)| id.as_str()).collect();
        f.debug_struct("EncryptionKeys")
            .field("ids", &ids)
            .finish_non_exhaustive()
    }
}

/// Encryption keys could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeysError {
    /// No key is given.
    #[error("no encryption key is given")]
    Empty,
    /// An entry is not `<id>:<base64 of 32 bytes>`.
    #[error(
        "encryption key entry {index}: expected `<id>:<base64 of 32 bytes>` with an id of 1 to 32 letters, digits, `-` or `_`"
    )]
    Malformed {
        /// The entry's position, from 1.
        index: usize,
    },
    /// Two entries share an id.
    #[error("encryption key entry {index}: the id is already used")]
    DuplicateId {
        /// The entry's position, from 1.
        index: usize,
    },
    /// [`REQUIRE_SEALED_VARIABLE`] is neither `true` nor `false`.
    #[error("IDEMPOTENCY_REQUIRE_SEALED is {value:?}: expected true or false")]
    RequireSealed {
        /// The value found.
        value: String,
    },
    /// The keys file could not be read.
    #[error("cannot read the encryption keys file {path}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl EncryptionKeys {
    /// Parses `<id>:<base64 of 32 bytes>` entries separated by commas or
    /// newlines (`#` starts a comment); the first is the current key.
    ///
    /// # Errors
    ///
    /// See [`KeysError`].
    pub fn parse(text: &str) -> Result<Self, KeysError> {
        let mut keys: Vec<(String, Aes256Gcm)> = Vec::new();
        let entries = text
            .split(['\n', ','])
            .map(|line| line.split('#').next().unwrap_or("").trim())
            .filter(|entry| !entry.is_empty());
        for (index, entry) in entries.enumerate() {
            let index = index + 1;
            let malformed = KeysError::Malformed { index };
            let (id, material) = entry
                .split_once(':')
                .ok_or(KeysError::Malformed { index })?;
            let valid_id = (1..=32).contains(&id.len())
                && id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            let material = base64::engine::general_purpose::STANDARD
                .decode(material.trim())
                .ok()
                .filter(|bytes| bytes.len() == 32);
            let (true, Some(material)) = (valid_id, material) else {
                return Err(malformed);
            };
            if keys.iter().any(|(known, _)| known == id) {
                return Err(KeysError::DuplicateId { index });
            }
            let cipher = Aes256Gcm::new_from_slice(&material).map_err(|_| malformed)?;
            keys.push((id.to_owned(), cipher));
        }
        if keys.is_empty() {
            return Err(KeysError::Empty);
        }
        Ok(Self { keys })
    }

    /// Reads the keys from a file (the format of [`EncryptionKeys::parse`]).
    ///
    /// # Errors
    ///
    /// See [`KeysError`].
    pub fn from_file(path: &std::path::Path) -> Result<Self, KeysError> {
        let text = std::fs::read_to_string(path).map_err(|source| KeysError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Reads the keys from the environment variable `name` (the format of
    /// [`EncryptionKeys::parse`]), for example
    /// `IDEMPOTENCY_ENCRYPTION_KEYS=2026-11:<base64>,2026-05:<base64>`.
    ///
    /// # Errors
    ///
    /// [`KeysError::Empty`] when the variable is unset or empty, otherwise
    /// see [`EncryptionKeys::parse`].
    pub fn from_env(name: &str) -> Result<Self, KeysError> {
        Self::parse(&std::env::var(name).unwrap_or_default())
    }

    /// Reads the keys the way the example app and the gateway do: from
    /// `IDEMPOTENCY_ENCRYPTION_KEYS` ([`KEYS_VARIABLE`]) or else from the
    /// file `IDEMPOTENCY_ENCRYPTION_KEYS_FILE` ([`KEYS_FILE_VARIABLE`])
    /// names; `None` (encryption off) when neither is set or both are
    /// empty.
    ///
    /// # Errors
    ///
    /// See [`KeysError`]: a variable that is set must hold usable keys.
    pub fn from_environment() -> Result<Option<Self>, KeysError> {
        let set = |name| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if let Some(text) = set(KEYS_VARIABLE) {
            return Self::parse(&text).map(Some);
        }
        match set(KEYS_FILE_VARIABLE) {
            Some(path) => Self::from_file(std::path::Path::new(path.trim())).map(Some),
            None => Ok(None),
        }
    }

    /// The id of the key that seals new records.
    pub fn current_id(&self) -> &str {
        self.keys.first().map_or("", |(id, _)| id.as_str())
    }

    /// The cipher of the key `id`, if the ring holds it.
    pub(super) fn get(&self, id: &str) -> Option<&Aes256Gcm> {
        self.keys
            .iter()
            .find(|(known, _)| known == id)
            .map(|(_, cipher)| cipher)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "a:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

    #[test]
    fn keys_parse_and_never_show_their_material() {
        let keys = EncryptionKeys::parse(&format!(
            "{A}, b:HyAhIiMkJSYnKCkqKywtLi8wMTIzNDU2Nzg5Ojs8PT4=  # previous"
        ))
        .unwrap();
        assert_eq!(keys.current_id(), "a");
        assert!(keys.get("b").is_some());
        let shown = format!("{keys:?}");
        assert!(shown.contains("\"a\"") && !shown.contains("AAECAw"));
        assert!(matches!(EncryptionKeys::parse(""), Err(KeysError::Empty)));
        assert!(matches!(
            EncryptionKeys::from_env("IDEMPOTENCY_TEST_UNSET_KEYS_VARIABLE"),
            Err(KeysError::Empty)
        ));
        assert!(matches!(
            EncryptionKeys::parse("a:c2hvcnQ="),
            Err(KeysError::Malformed { index: 1 })
        ));
        assert!(matches!(
            EncryptionKeys::parse(&format!("{A},{A}")),
            Err(KeysError::DuplicateId { index: 2 })
        ));
        assert!(matches!(
            EncryptionKeys::parse("bad id:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="),
            Err(KeysError::Malformed { .. })
        ));
    }

    #[test]
    fn the_require_sealed_switch_parses_true_or_false_only() {
        assert!(parse_require_sealed("true").unwrap());
        assert!(parse_require_sealed(" 1 ").unwrap());
        assert!(!parse_require_sealed("false").unwrap());
        assert!(!parse_require_sealed("0").unwrap());
        for bad in ["", "yes", "off", "TRUE "] {
            assert!(
                matches!(
                    parse_require_sealed(bad),
                    Err(KeysError::RequireSealed { .. })
                ),
                "{bad:?}"
            );
        }
    }
}
