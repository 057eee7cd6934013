//! Console sessions: what the console's sign-in exchanges an admin token
//! for, so that the page never holds the token.
//!
//! A session is a random id in an `HttpOnly`, `SameSite=Strict` cookie
//! ([`SESSION_COOKIE`], path `/v1/admin`, `Secure` when the page was
//! served over TLS or [`SessionSettings::secure_cookie`] says so), mapped
//! here to the admin who signed in. The service keeps the sessions in
//! memory, at most [`MAX_SESSIONS`]: signing out removes one, so its
//! cookie is refused from then on; so is one idle for
//! [`SessionSettings::idle`] or older than [`SessionSettings::lifetime`];
//! and a restart signs everyone out (the console then asks for the token
//! again). The table holds the SHA-256 of each id, not the id.
//!
//! A request authenticated by a session cookie that changes state (any
//! method but `GET`, `HEAD` and `OPTIONS`) must carry an `Origin` naming
//! the console's origin ([`SessionSettings::origin`], or by default the
//! `Host` the request was sent to): a missing or foreign one answers 403
//! `origin-refused`, whatever the cookie.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderValue, Method, header};
use sha2::{Digest, Sha256};

use super::tokens::Admin;

/// The name of the session cookie.
pub(crate) const SESSION_COOKIE: &str = "idempotency-console";

/// The most sessions kept at once; past it, signing in ends the session
/// idle for longest.
pub(crate) const MAX_SESSIONS: usize = 1000;

/// How sessions expire and how their cookie and writes are checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSettings {
    /// A session unused this long ends. The default value is 15 minutes.
    pub idle: Duration,
    /// A session ends this long after its sign-in, used or not. The
    /// default value is 8 hours.
    pub lifetime: Duration,
    /// Always mark the cookie `Secure`; otherwise it is `Secure` when the
    /// sign-in came from an `https://` page. The default value is `false`.
    pub secure_cookie: bool,
    /// The console's origin (`https://ops.example.com`) that a
    /// session-authenticated write's `Origin` must equal; `None`: the
    /// `Origin`'s host and port must equal the request's `Host`. The
    /// default value is `None`.
    pub origin: Option<String>,
}

impl Default for SessionSettings {
    fn default() -> Self {
        Self {
            idle: Duration::from_secs(15 * 60),
            lifetime: Duration::from_secs(8 * 60 * 60),
            secure_cookie: false,
            origin: None,
        }
    }
}

/// One signed-in admin.
#[derive(Debug, Clone)]
struct Session {
    admin: Admin,
    started: Instant,
    last_seen: Instant,
}

/// The console's sessions, in memory (see the module's docs).
#[derive(Debug, Default)]
pub struct ConsoleSessions {
    settings: SessionSettings,
    table: Mutex<HashMap<[u8; 32], Session>>,
}

/// The SHA-256 of a session id: what the table is keyed by.
fn digest(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

impl ConsoleSessions {
    /// No session yet, expiring and checked as `settings` say.
    pub fn new(settings: SessionSettings) -> Self {
        Self {
            settings,
            table: Mutex::default(),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Session>> {
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn live(&self, session: &Session, now: Instant) -> bool {
        now.saturating_duration_since(session.last_seen) < self.settings.idle
            && now.saturating_duration_since(session.started) < self.settings.lifetime
    }

    /// Starts a session for `admin` at `now`: its id (64 hex digits, 256
    /// random bits), for the cookie.
    pub(crate) fn start(&self, admin: Admin, now: Instant) -> String {
        let bytes: [u8; 32] = rand::random();
        let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let mut table = self.table();
        table.retain(|_, session| self.live(session, now));
        while table.len() >= MAX_SESSIONS {
            let Some(oldest) = table
                .iter()
                .min_by_key(|(_, session)| session.last_seen)
                .map(|(key, _)| *key)
            else {
                break;
            };
            table.remove(&oldest);
        }
        table.insert(
            digest(&id),
            Session {
                admin,
                started: now,
                last_seen: now,
            },
        );
        id
    }

    /// The admin of session `id` at `now`, which counts as a use; `None`
    /// when it ended (signed out, expired, or never started here).
    pub(crate) fn admin_of(&self, id: &str, now: Instant) -> Option<Admin> {
        let key = digest(id);
        let mut table = self.table();
        let session = table.get_mut(&key)?;
        if !self.live(session, now) {
            table.remove(&key);
            return None;
        }
        session.last_seen = now;
        Some(session.admin.clone())
    }

    /// Ends session `id` (nothing when there is none).
    pub(crate) fn end(&self, id: &str) {
        self.table().remove(&digest(id));
    }

    /// How many sessions are kept (ended ones included until the next
    /// sign-in sweeps them).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.table().len()
    }

    /// The `Set-Cookie` of a new session: `secure` when the settings or
    /// the sign-in's origin ask for it.
    pub(crate) fn cookie(&self, id: &str, headers: &HeaderMap) -> HeaderValue {
        self.cookie_value(id, "", headers)
    }

    /// The `Set-Cookie` that removes the session cookie from the browser.
    pub(crate) fn removal(&self, headers: &HeaderMap) -> HeaderValue {
        self.cookie_value("", "; Max-Age=0", headers)
    }

    fn cookie_value(&self, id: &str, extra: &str, headers: &HeaderMap) -> HeaderValue {
        let secure = self.settings.secure_cookie
            || origin_of(headers).is_some_and(|origin| origin.starts_with("https://"));
        let secure = if secure { "; Secure" } else { "" };
        HeaderValue::try_from(format!(
            "{SESSION_COOKIE}={id}; Path=/v1/admin; HttpOnly; SameSite=Strict{secure}{extra}"
        ))
        .unwrap_or_else(|_| HeaderValue::from_static("idempotency-console=; Max-Age=0"))
    }

    /// Whether a session-authenticated request with `headers`, sent to
    /// `authority` (its `Host`), may change state: its method reads
    /// only, or its `Origin` is the console's.
    pub(crate) fn origin_allows(
        &self,
        method: &Method,
        headers: &HeaderMap,
        authority: Option<&str>,
    ) -> bool {
        if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
            return true;
        }
        let Some(origin) = origin_of(headers) else {
            return false;
        };
        match &self.settings.origin {
            Some(expected) => origin.eq_ignore_ascii_case(expected.trim_end_matches('/')),
            None => {
                let host = origin
                    .strip_prefix("https://")
                    .or_else(|| origin.strip_prefix("http://"));
                match (host, authority) {
                    (Some(host), Some(authority)) => host.eq_ignore_ascii_case(authority),
                    _ => false,
                }
            }
        }
    }
}

/// How the admin of a request signed in (the authentication passes it
/// on beside the [`Admin`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Credential {
    /// An `Authorization: Bearer` admin token.
    Token,
    /// A console session: its id.
    Session(String),
}

/// The request's `Origin`, when it has one that is text.
fn origin_of(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::ORIGIN)
        .and_then(|value| value.to_str().ok())
}

/// The session id the request's cookies carry, if any.
pub(crate) fn session_id(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|cookies| cookies.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, value)| *name == SESSION_COOKIE && !value.is_empty())
        .map(|(_, value)| value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::tokens::Scopes;

    fn ops() -> Admin {
        Admin {
            name: "ops".to_owned(),
            scopes: Scopes::All,
        }
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn a_session_ends_when_signed_out_idle_or_old() {
        let sessions = ConsoleSessions::new(SessionSettings {
            idle: Duration::from_secs(60),
            lifetime: Duration::from_secs(600),
            ..SessionSettings::default()
        });
        let t0 = Instant::now();
        let id = sessions.start(ops(), t0);
        assert_eq!(id.len(), 64);
        assert_ne!(id, sessions.start(ops(), t0), "each id is new");
        assert_eq!(
            sessions.admin_of(&id, t0 + Duration::from_secs(59)),
            Some(ops())
        );
        // Used at 59 s: idle from there.
        assert!(
            sessions
                .admin_of(&id, t0 + Duration::from_secs(118))
                .is_some()
        );
        assert!(
            sessions
                .admin_of(&id, t0 + Duration::from_secs(178))
                .is_none(),
            "idle for 60 s: ended"
        );
        assert!(
            sessions
                .admin_of(&id, t0 + Duration::from_secs(1))
                .is_none(),
            "and removed"
        );

        let id = sessions.start(ops(), t0);
        for minute in 1..=10 {
            assert!(
                sessions
                    .admin_of(&id, t0 + Duration::from_secs(minute * 59))
                    .is_some()
            );
        }
        assert!(
            sessions
                .admin_of(&id, t0 + Duration::from_secs(640))
                .is_none(),
            "past its lifetime, however often used"
        );

        let id = sessions.start(ops(), t0);
        sessions.end(&id);
        assert!(sessions.admin_of(&id, t0).is_none(), "signed out");
        assert!(sessions.admin_of("not-a-session", t0).is_none());
    }

    #[test]
    fn the_table_is_bounded() {
        let sessions = ConsoleSessions::default();
        let t0 = Instant::now();
        let first = sessions.start(ops(), t0);
        for n in 1..=MAX_SESSIONS {
            sessions.start(ops(), t0 + Duration::from_millis(n as u64));
        }
        assert_eq!(sessions.len(), MAX_SESSIONS);
        assert!(
            sessions.admin_of(&first, t0).is_none(),
            "the session idle for longest made room"
        );
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_secure_over_tls() {
        let sessions = ConsoleSessions::default();
        let plain = sessions.cookie("abc", &headers(&[("origin", "http://ops:8080")]));
        assert_eq!(
            plain,
            "idempotency-console=abc; Path=/v1/admin; HttpOnly; SameSite=Strict"
        );
        let tls = sessions.cookie("abc", &headers(&[("origin", "https://ops.example.com")]));
        assert!(tls.to_str().unwrap().ends_with("; Secure"), "{tls:?}");
        let always = ConsoleSessions::new(SessionSettings {
            secure_cookie: true,
            ..SessionSettings::default()
        });
        assert!(
            always
                .removal(&HeaderMap::new())
                .to_str()
                .unwrap()
                .contains("; Secure; Max-Age=0")
        );
    }

    #[test]
    fn the_session_id_is_read_from_the_cookies() {
        assert_eq!(
            session_id(&headers(&[
                ("cookie", "a=1; idempotency-console=abc; b=2"),
                ("cookie", "c=3")
            ])),
            Some("abc")
        );
        assert_eq!(
            session_id(&headers(&[("cookie", "idempotency-console=")])),
            None
        );
        assert_eq!(
            session_id(&headers(&[("cookie", "x-idempotency-console=abc")])),
            None
        );
        assert_eq!(session_id(&HeaderMap::new()), None);
    }

    #[test]
    fn a_write_needs_the_consoles_origin() {
        let sessions = ConsoleSessions::default();
        let with = |origin: &str| headers(&[("origin", origin)]);
        let host = Some("ops.example.com:8080");
        assert!(sessions.origin_allows(&Method::GET, &HeaderMap::new(), host));
        for (method, headers, allowed) in [
            (Method::POST, with("http://ops.example.com:8080"), true),
            (Method::DELETE, with("https://OPS.example.com:8080"), true),
            (Method::POST, with("http://evil.example"), false),
            (Method::POST, with("http://ops.example.com"), false),
            (Method::POST, with("null"), false),
            (Method::POST, HeaderMap::new(), false),
        ] {
            assert_eq!(
                sessions.origin_allows(&method, &headers, host),
                allowed,
                "{method} {headers:?}"
            );
        }
        assert!(!sessions.origin_allows(&Method::POST, &with("http://ops.example.com:8080"), None));
        let configured = ConsoleSessions::new(SessionSettings {
            origin: Some("https://ops.example.com/".to_owned()),
            ..SessionSettings::default()
        });
        assert!(configured.origin_allows(&Method::POST, &with("https://ops.example.com"), None));
        assert!(!configured.origin_allows(
            &Method::POST,
            &with("http://ops.example.com:8080"),
            host
        ));
    }
}
