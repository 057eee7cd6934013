//! `[scope]`: where a guarded request's scope comes from (built into a
//! source by [`ScopeSource::from_config`](crate::scope::ScopeSource::from_config)).

use std::path::PathBuf;

use http::HeaderName;
use jsonwebtoken::Algorithm;
use serde::Deserialize;

use super::de;

/// Which source gives a request its scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScopeFrom {
    /// One scope for every request: `value`.
    Fixed,
    /// The value of the request's `header`.
    Header,
    /// The `sub` of the verified `Authorization: Bearer` JWT.
    Jwt,
}

/// Where the scope comes from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScopeConfig {
    /// `fixed`, `header` or `jwt`; see [`ScopeFrom`].
    pub from: ScopeFrom,
    /// The fixed scope (`from = "fixed"`), 1 to 255 bytes.
    pub value: String,
    /// The header that names the scope (`from = "header"`).
    #[serde(deserialize_with = "de::header_name")]
    pub header: Option<HeaderName>,
    /// The JWT algorithm: `HS256`, `HS384`, `HS512`, `RS256`, `RS384`,
    /// `RS512`, `PS256`, `PS384`, `PS512`, `ES256`, `ES384` or `EdDSA`.
    pub jwt_algorithm: Algorithm,
    /// The environment variable holding the HMAC secret (HS*).
    pub jwt_secret_env: Option<String>,
    /// A PEM file with the public key (RS*, PS*, ES*, EdDSA).
    pub jwt_public_key_file: Option<PathBuf>,
    /// The required `iss`, if any.
    pub jwt_issuer: Option<String>,
    /// The required `aud`, if any.
    pub jwt_audience: Option<String>,
}

impl Default for ScopeConfig {
    fn default() -> Self {
        Self {
            // One fixed scope: a backend without tenants needs nothing more.
            from: ScopeFrom::Fixed,
            value: "default".to_owned(),
            // The header and JWT settings only count with their `from`.
            header: None,
            jwt_algorithm: Algorithm::HS256,
            jwt_secret_env: None,
            jwt_public_key_file: None,
            jwt_issuer: None,
            jwt_audience: None,
        }
    }
}
