//! Why a configuration cannot be used.

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The TOML does not parse, or names an unknown field.
    #[error("the configuration does not parse: line {line}, column {column}: {message}")]
    Parse {
        /// The line of the first problem (from 1).
        line: usize,
        /// Its column (from 1).
        column: usize,
        /// What is wrong there, on one line.
        message: String,
    },
    /// A value is out of range or inconsistent with another.
    #[error("invalid configuration: {0}")]
    Invalid(String),
    /// The JWT key cannot be loaded.
    #[error("the JWT key cannot be loaded")]
    JwtKey(#[source] jsonwebtoken::errors::Error),
    /// The encryption keys cannot be read.
    #[error("the encryption keys of {from} cannot be used")]
    EncryptionKeys {
        /// Where they were read: the setting and the variable or file.
        from: String,
        /// Why.
        #[source]
        source: idempotency_guard::store::encrypted::KeysError,
    },
    /// A store setting (`store`, `store_kind`, `redis`) cannot work.
    #[error(transparent)]
    Store(#[from] idempotency_guard::store::SettingsError),
}
