//! Where a guarded request's scope comes from: a fixed value, a header, or
//! the `sub` of a verified JWT. A request whose scope cannot be
//! established is refused with 401 before the guard sees it, so nothing is
//! stored and no request ever falls into a shared scope.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::IntoResponse;
use http::{HeaderMap, HeaderName, Method, Response, header};
use idempotency_guard::problem::types;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use crate::config::{ConfigError, ScopeConfig, ScopeFrom};

/// The scope established for a request, put in its extensions for the
/// guard's scope function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope(pub String);

/// Why a request has no scope.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScopeError {
    /// The scope header is absent, empty, not text or too long.
    #[error("the {0} header is missing or not a valid scope")]
    Header(HeaderName),
    /// No `Authorization: Bearer` token.
    #[error("no bearer token")]
    TokenMissing,
    /// The token does not verify (signature, expiry, not-before, issuer,
    /// audience).
    #[error("the bearer token does not verify")]
    TokenInvalid(#[source] jsonwebtoken::errors::Error),
    /// The token verifies but its `sub` is missing, empty or too long.
    #[error("the bearer token has no usable sub")]
    Subject,
}

/// A JWT verifier: one key, one algorithm, optional issuer and audience.
#[derive(Clone)]
pub struct JwtVerifier {
    key: DecodingKey,
    validation: Validation,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("algorithms", &self.validation.algorithms)
            .finish_non_exhaustive()
    }
}

#[derive(serde::Deserialize)]
struct Claims {
    sub: Option<String>,
}

impl JwtVerifier {
    /// A verifier of tokens signed with `key` by `algorithm`; `exp` is
    /// required and checked, `nbf` checked when present (a token not yet
    /// valid is refused), both with jsonwebtoken's 60 s leeway.
    pub fn new(key: DecodingKey, algorithm: Algorithm) -> Self {
        let mut validation = Validation::new(algorithm);
        validation.validate_aud = false;
        validation.validate_nbf = true;
        Self { key, validation }
    }

    /// Requires this `iss`.
    pub fn with_issuer(mut self, issuer: &str) -> Self {
        self.validation.set_issuer(&[issuer]);
        self
    }

    /// Requires this `aud`.
    pub fn with_audience(mut self, audience: &str) -> Self {
        self.validation.set_audience(&[audience]);
        self.validation.validate_aud = true;
        self
    }

    /// The `sub` of a token that verifies.
    ///
    /// # Errors
    ///
    /// [`ScopeError::TokenInvalid`] or [`ScopeError::Subject`].
    pub fn subject(&self, token: &str) -> Result<String, ScopeError> {
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation)
            .map_err(ScopeError::TokenInvalid)?;
        match data.claims.sub {
            Some(sub) if valid_scope(&sub) => Ok(sub),
            _ => Err(ScopeError::Subject),
        }
    }
}

/// Where the scope comes from.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ScopeSource {
    /// One scope for every request.
    Fixed(String),
    /// The value of a header.
    ///
    /// # Warning
    ///
    /// Only behind something that sets the header and strips the client's:
    /// a client that can name another scope can read its replays.
    Header(HeaderName),
    /// The `sub` of the `Authorization: Bearer` JWT.
    Jwt(Box<JwtVerifier>),
}

/// Whether `scope` follows [`Scope`](idempotency_guard::Scope)'s rule.
fn valid_scope(scope: &str) -> bool {
    idempotency_guard::Scope::new(scope).is_ok()
}

impl ScopeSource {
    /// Builds the source a configuration describes (reading the JWT secret
    /// from its environment variable, or the public key from its file).
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] or [`ConfigError::JwtKey`].
    pub fn from_config(config: &ScopeConfig) -> Result<Self, ConfigError> {
        match config.from {
            ScopeFrom::Fixed if valid_scope(&config.value) => Ok(Self::Fixed(config.value.clone())),
            ScopeFrom::Fixed => Err(ConfigError::Invalid(
                "scope.value: 1 to 255 bytes".to_owned(),
            )),
            ScopeFrom::Header => {
                let name = config.header.clone().ok_or_else(|| {
                    ConfigError::Invalid("scope.from = header needs scope.header".to_owned())
                })?;
                Ok(Self::Header(name))
            }
            ScopeFrom::Jwt => {
                let algorithm = config.jwt_algorithm;
                let key = jwt_key(config, algorithm)?;
                let mut verifier = JwtVerifier::new(key, algorithm);
                if let Some(issuer) = &config.jwt_issuer {
                    verifier = verifier.with_issuer(issuer);
                }
                if let Some(audience) = &config.jwt_audience {
                    verifier = verifier.with_audience(audience);
                }
                Ok(Self::Jwt(Box::new(verifier)))
            }
        }
    }

    /// The scope of a request with these headers.
    ///
    /// # Errors
    ///
    /// See [`ScopeError`].
    pub fn scope_of(&self, headers: &HeaderMap) -> Result<String, ScopeError> {
        match self {
            Self::Fixed(scope) => Ok(scope.clone()),
            Self::Header(name) => {
                let mut values = headers.get_all(name).iter();
                match (values.next().and_then(|v| v.to_str().ok()), values.next()) {
                    (Some(value), None) if valid_scope(value.trim()) => Ok(value.trim().to_owned()),
                    _ => Err(ScopeError::Header(name.clone())),
                }
            }
            Self::Jwt(verifier) => {
                let token = headers
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.split_once(' '))
                    .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                    .map(|(_, token)| token.trim())
                    .filter(|token| !token.is_empty())
                    .ok_or(ScopeError::TokenMissing)?;
                verifier.subject(token)
            }
        }
    }
}

fn jwt_key(config: &ScopeConfig, algorithm: Algorithm) -> Result<DecodingKey, ConfigError> {
    use Algorithm::{ES256, ES384, EdDSA, HS256, HS384, HS512};
    if matches!(algorithm, HS256 | HS384 | HS512) {
        let name = config.jwt_secret_env.as_deref().ok_or_else(|| {
            ConfigError::Invalid("scope.jwt_secret_env names the secret's variable".to_owned())
        })?;
        let secret = std::env::var(name)
            .ok()
            .filter(|s| s.len() >= 16)
            .ok_or_else(|| {
                ConfigError::Invalid(format!("{name}: the JWT secret, at least 16 bytes"))
            })?;
        return Ok(DecodingKey::from_secret(secret.as_bytes()));
    }
    let path = config.jwt_public_key_file.as_ref().ok_or_else(|| {
        ConfigError::Invalid("scope.jwt_public_key_file names the PEM public key".to_owned())
    })?;
    let pem = std::fs::read(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    match algorithm {
        ES256 | ES384 => DecodingKey::from_ec_pem(&pem),
        EdDSA => DecodingKey::from_ed_pem(&pem),
        _ => DecodingKey::from_rsa_pem(&pem),
    }
    .map_err(ConfigError::JwtKey)
}

/// What the scope middleware of one guarded route needs.
#[derive(Debug, Clone)]
pub struct ScopeGate {
    /// Where the scope comes from.
    pub source: Arc<ScopeSource>,
    /// The route's guarded methods; other methods pass without a scope.
    pub methods: Arc<[Method]>,
}

/// Middleware run before the guard: establishes the scope of a request
/// with a guarded method, or answers 401 `unauthorized` (nothing stored).
pub async fn establish_scope(
    State(gate): State<ScopeGate>,
    mut request: Request,
    next: Next,
) -> Response<Body> {
    if !gate.methods.contains(request.method()) {
        return next.run(request).await;
    }
    match gate.source.scope_of(request.headers()) {
        Ok(scope) => {
            request.extensions_mut().insert(Scope(scope));
            next.run(request).await
        }
        Err(error) => {
            tracing::info!(error = %error, path = request.uri().path(), "no scope: 401");
            let mut response = types::UNAUTHORIZED
                .problem(error.to_string())
                .into_response();
            if !matches!(*gate.source, ScopeSource::Jwt(_)) {
                // The challenge names a scheme the client could answer; a
                // scope from a header set by a proxy is not one.
                response.headers_mut().remove(header::WWW_AUTHENTICATE);
            }
            response
        }
    }
}
