//! Forwarding one request to the upstream, and turning what happened into
//! a response the guard can classify.
//!
//! | what happened upstream | the gateway answers | guarded key |
//! |---|---|---|
//! | an answer (any status) | the answer | as the layer: stored, or released for 5xx, 408, 425, 429 |
//! | the connection could not be opened (refused, no route, connect timeout): nothing was sent | 503 `upstream-unavailable`, `Retry-After` | released: a retry runs |
//! | the connection failed after the request was sent (reset, closed before the answer) | 502 `upstream-failed` | abandoned: 409 `outcome-unknown`, status advice `reconcile` |
//! | no answer head within `proxy.timeout_seconds` | 504 `upstream-timeout` | abandoned |
//! | the answer's body broke off (guarded requests read it whole first) | 502 `upstream-failed` | abandoned |
//! | `101 Switching Protocols` (no upgrade is ever forwarded) | 502 `upstream-failed` | abandoned |
//!
//! Abandoning is the safe side: the backend may have done the work, so the
//! gateway never runs it again blindly.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::response::IntoResponse;
use bytes::Bytes;
use futures_util::StreamExt;
use http::header::{self, Entry, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idempotency_guard::OutcomeUnknown;
use idempotency_guard::problem::{ProblemType, types};

use crate::config::{Config, ConfigError, HostHeader};
use crate::pool::{Http1Pool, SendError};

/// The proxy metrics' names.
pub const UPSTREAM_REQUESTS_TOTAL: &str = "idempotency_gateway_upstream_requests_total";
/// Time to the upstream's answer head, in seconds.
pub const UPSTREAM_DURATION_SECONDS: &str = "idempotency_gateway_upstream_duration_seconds";

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// A client's address, formatted once (per connection on the pass-through
/// path) for the forwarding headers.
#[derive(Debug, Clone)]
pub struct ClientAddress {
    /// The address as `X-Forwarded-For` lists it.
    listed: HeaderValue,
    /// The `for=` parameter of `Forwarded`, with its `;`.
    forwarded_for: Box<str>,
}

impl ClientAddress {
    /// Formats `ip` for `X-Forwarded-For` and `Forwarded` (RFC 7239: an
    /// IPv6 address quoted and in brackets).
    pub fn new(ip: IpAddr) -> Self {
        let text = ip.to_string();
        let forwarded_for = match ip {
            IpAddr::V4(_) => format!("for={text};"),
            IpAddr::V6(_) => format!("for=\"[{text}]\";"),
        };
        Self {
            // An address's text is always a valid header value.
            listed: HeaderValue::try_from(text).unwrap_or(HeaderValue::from_static("unknown")),
            forwarded_for: forwarded_for.into(),
        }
    }
}

/// The upstream and the pooled client that reaches it.
#[derive(Debug, Clone)]
pub struct Upstream {
    transport: Transport,
    scheme: Scheme,
    authority: Authority,
    /// A path prefix (without the trailing slash), or empty.
    prefix: String,
    /// `Host` as the upstream expects it (its authority), made once.
    upstream_host: Option<HeaderValue>,
    host: HostHeader,
    http2: bool,
    timeout: Duration,
    connect_timeout: Duration,
}

/// How requests reach the upstream.
#[derive(Debug, Clone)]
enum Transport {
    /// HTTP/1.1 keep-alive connections, each driven by the request using
    /// it (see [`crate::pool`]).
    Http1(Arc<Http1Pool>),
    /// HTTP/2 with prior knowledge: hyper-util's client, whose one
    /// connection multiplexes the requests.
    Http2(Box<Client<HttpConnector, Body>>),
}

/// What happened to one forwarded request, counted once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exchange {
    Answered = 0,
    BadTarget = 1,
    Unavailable = 2,
    Failed = 3,
    Timeout = 4,
}

const EXCHANGES: [Exchange; 5] = [
    Exchange::Answered,
    Exchange::BadTarget,
    Exchange::Unavailable,
    Exchange::Failed,
    Exchange::Timeout,
];

/// The proxy metrics of one route, registered once (a lookup per request
/// would cost a hash of its labels).
#[derive(Clone)]
pub struct RouteMetrics {
    /// Indexed by [`Exchange`].
    counters: [metrics::Counter; 5],
    duration: metrics::Histogram,
}

impl std::fmt::Debug for RouteMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteMetrics").finish_non_exhaustive()
    }
}

impl RouteMetrics {
    /// Registers the metrics of `route` with the installed recorder (none
    /// installed: they count nothing).
    pub fn new(route: &str) -> Self {
        Self {
            counters: EXCHANGES.map(|exchange| {
                metrics::counter!(UPSTREAM_REQUESTS_TOTAL, "route" => route.to_owned(), "result" => exchange.label())
            }),
            duration: metrics::histogram!(UPSTREAM_DURATION_SECONDS, "route" => route.to_owned()),
        }
    }
}

impl Exchange {
    fn label(self) -> &'static str {
        match self {
            Self::Answered => "answered",
            Self::BadTarget => "bad_target",
            Self::Unavailable => "unavailable",
            Self::Failed => "failed",
            Self::Timeout => "timeout",
        }
    }
}

impl Upstream {
    /// A pooled client for the configured upstream (HTTP/1.1 keep-alive,
    /// or HTTP/2 with prior knowledge when `proxy.http2`).
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] for a bad upstream URL.
    pub fn new(config: &Config) -> Result<Self, ConfigError> {
        let uri = config.upstream_uri()?;
        let proxy = &config.proxy;
        let connect_timeout = proxy.connect_timeout;
        let idle_timeout = proxy.pool_idle;
        let (scheme, authority) = match (uri.scheme(), uri.authority()) {
            (Some(s), Some(a)) => (s.clone(), a.clone()),
            _ => return Err(ConfigError::Invalid("upstream".to_owned())),
        };
        let transport = if proxy.http2 {
            let mut connector = HttpConnector::new();
            connector.set_nodelay(true);
            connector.set_connect_timeout(Some(connect_timeout));
            let client = Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(proxy.pool_max_idle)
                .pool_idle_timeout(idle_timeout)
                .http2_only(true)
                .build(connector);
            Transport::Http2(Box::new(client))
        } else {
            Transport::Http1(Arc::new(Http1Pool::new(
                &authority,
                proxy.pool_max_idle,
                idle_timeout,
                connect_timeout,
                proxy.timeout,
            )))
        };
        Ok(Self {
            transport,
            scheme,
            upstream_host: HeaderValue::from_str(authority.as_str()).ok(),
            authority,
            prefix: uri.path().trim_end_matches('/').to_owned(),
            host: proxy.host,
            http2: proxy.http2,
            timeout: proxy.timeout,
            connect_timeout,
        })
    }

    /// Whether a TCP connection to the upstream opens (for `/readyz`).
    pub async fn reachable(&self) -> bool {
        let port = self.authority.port_u16().unwrap_or(80);
        let address = format!("{}:{port}", self.authority.host());
        matches!(
            tokio::time::timeout(
                self.connect_timeout,
                tokio::net::TcpStream::connect(address)
            )
            .await,
            Ok(Ok(_))
        )
    }

    /// Forwards `request` and answers with the upstream's answer, or with a
    /// problem saying what failed. When `guarded`, the answer's body is read
    /// whole (up to `keep` bytes, then streamed) before answering, so that a
    /// body that breaks off is an unknown outcome rather than a stored
    /// half-answer; failures after the request was sent carry
    /// [`OutcomeUnknown`]. The client's address comes from the request's
    /// [`ConnectInfo`], when there is one.
    pub async fn forward(
        &self,
        request: Request<Body>,
        metrics: &RouteMetrics,
        guarded: bool,
        keep: usize,
    ) -> Response<Body> {
        let client = request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|info| ClientAddress::new(info.0.ip()));
        self.forward_from(request, client.as_ref(), metrics, guarded, keep)
            .await
    }

    /// [`Upstream::forward`] with the client's address given (the
    /// pass-through path, which has no axum extensions).
    pub async fn forward_from(
        &self,
        request: Request<Body>,
        client: Option<&ClientAddress>,
        metrics: &RouteMetrics,
        guarded: bool,
        keep: usize,
    ) -> Response<Body> {
        let started = Instant::now();
        // Kept for the failure's log line; both clones share their bytes.
        let method = request.method().clone();
        let uri = request.uri().clone();
        let (result, response) = self.exchange(request, client, guarded, keep, started).await;
        let elapsed = started.elapsed();
        metrics.counters[result as usize].increment(1);
        metrics.duration.record(elapsed);
        if result != Exchange::Answered {
            tracing::warn!(%method, path = uri.path(), result = result.label(), status = response.status().as_u16(), elapsed_ms = elapsed.as_millis() as u64, "upstream failed");
        }
        response
    }

    async fn exchange(
        &self,
        request: Request<Body>,
        client: Option<&ClientAddress>,
        guarded: bool,
        keep: usize,
        started: Instant,
    ) -> (Exchange, Response<Body>) {
        let Some(outgoing) = self.outgoing(request, client) else {
            // Not sent: nothing ran upstream.
            let response = types::BAD_REQUEST
                .problem("The request target cannot be forwarded.")
                .into_response();
            return (Exchange::BadTarget, response);
        };
        let answer = match self.send(outgoing, started).await {
            Ok(answer) => answer,
            Err(SendError::Connect(error)) => {
                tracing::warn!(error = %error, "upstream: cannot connect");
                let response = types::UPSTREAM_UNAVAILABLE
                    .problem("The upstream could not be reached; the request was not sent.")
                    .into_response();
                return (Exchange::Unavailable, response);
            }
            Err(SendError::Failed(error)) => {
                tracing::warn!(error = %error, source = ?error.source(), "upstream: failed after sending");
                return (
                    Exchange::Failed,
                    unknown(
                        types::UPSTREAM_FAILED,
                        "The upstream connection failed after the request was sent; it may have run.",
                    ),
                );
            }
            Err(SendError::Timeout) => {
                return (
                    Exchange::Timeout,
                    unknown(
                        types::UPSTREAM_TIMEOUT,
                        "The upstream did not answer in time; the request may have run.",
                    ),
                );
            }
        };
        if answer.status() == StatusCode::SWITCHING_PROTOCOLS {
            // The gateway forwards no `Upgrade`, so no upgrade was asked
            // for: a 101 is a protocol error of the upstream, after the
            // request was sent (it may have run).
            tracing::warn!(
                "upstream: 101 Switching Protocols to a request that asked for no upgrade"
            );
            return (
                Exchange::Failed,
                unknown(
                    types::UPSTREAM_FAILED,
                    "The upstream switched protocols though no upgrade was asked for; the request may have run.",
                ),
            );
        }
        let (mut parts, body) = answer.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        if !guarded {
            return (Exchange::Answered, Response::from_parts(parts, body));
        }
        // A guarded answer is read before it is handed to the guard, so a
        // body that breaks off is known now (an unknown outcome).
        let mut body = body;
        let mut prefix: Vec<Bytes> = Vec::new();
        let mut size = 0usize;
        loop {
            if size > keep {
                let rest = body.into_data_stream();
                let stream = futures_util::stream::iter(prefix.into_iter().map(Ok)).chain(rest);
                return (
                    Exchange::Answered,
                    Response::from_parts(parts, Body::from_stream(stream)),
                );
            }
            match body.frame().await {
                None => break,
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        size += data.len();
                        prefix.push(data);
                    }
                }
                Some(Err(error)) => {
                    tracing::warn!(error = %error, "upstream: the answer's body broke off");
                    return (
                        Exchange::Failed,
                        unknown(
                            types::UPSTREAM_FAILED,
                            "The upstream's answer broke off; the request may have run.",
                        ),
                    );
                }
            }
        }
        let whole: Bytes = match prefix.len() {
            0 => Bytes::new(),
            1 => prefix.pop().unwrap_or_default(),
            _ => prefix.concat().into(),
        };
        parts.headers.remove(header::CONTENT_LENGTH);
        (
            Exchange::Answered,
            Response::from_parts(parts, Body::from(whole)),
        )
    }

    /// Sends `outgoing` and waits for the answer's head, at most
    /// `proxy.timeout_seconds` from `started`.
    async fn send(
        &self,
        outgoing: Request<Body>,
        started: Instant,
    ) -> Result<Response<Body>, SendError> {
        match &self.transport {
            // The pool keeps a timer per connection.
            Transport::Http1(pool) => pool.send(outgoing, started).await,
            Transport::Http2(client) => {
                match tokio::time::timeout(self.timeout, client.request(outgoing)).await {
                    Ok(Ok(answer)) => Ok(answer.map(Body::new)),
                    Ok(Err(error)) if error.is_connect() => Err(SendError::Connect(error.into())),
                    Ok(Err(error)) => Err(SendError::Failed(error.into())),
                    Err(_) => Err(SendError::Timeout),
                }
            }
        }
    }

    /// The request as the upstream gets it: its URI, headers without
    /// hop-by-hop ones, the forwarding headers, `Host` per configuration;
    /// `None` when the target cannot be forwarded.
    fn outgoing(
        &self,
        request: Request<Body>,
        client: Option<&ClientAddress>,
    ) -> Option<Request<Body>> {
        let (mut parts, body) = request.into_parts();
        let target = match parts.uri.path_and_query() {
            // Without a prefix the target is the client's, bytes shared.
            Some(path) if self.prefix.is_empty() => path.clone(),
            None if self.prefix.is_empty() => PathAndQuery::from_static("/"),
            path => {
                let path = path.map_or("/", PathAndQuery::as_str);
                let mut target = String::with_capacity(self.prefix.len() + path.len());
                target.push_str(&self.prefix);
                target.push_str(path);
                PathAndQuery::try_from(target).ok()?
            }
        };
        strip_hop_by_hop(&mut parts.headers);
        // Room for the four forwarding headers: one growth, not several.
        parts.headers.reserve(4);
        // The client's `Host` (or its target's authority) for the
        // forwarding headers; replaced by the upstream's in the same
        // lookup when so configured.
        let client_host = match (self.host, &self.upstream_host) {
            (HostHeader::Upstream, Some(upstream)) => {
                parts.headers.insert(header::HOST, upstream.clone())
            }
            _ => parts.headers.get(header::HOST).cloned(),
        };
        let original_host = client_host.or_else(|| {
            parts
                .uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        });
        if self.host == HostHeader::Keep
            && let Some(value) = &original_host
            && !parts.headers.contains_key(header::HOST)
        {
            // An absolute-form target's authority becomes `Host`.
            parts.headers.insert(header::HOST, value.clone());
        }
        add_forwarding(&mut parts.headers, client, original_host.as_ref());
        if self.http2 {
            // HTTP/2 carries the scheme and authority in the URI.
            let mut uri = http::uri::Parts::default();
            uri.scheme = Some(self.scheme.clone());
            uri.authority = Some(self.authority.clone());
            uri.path_and_query = Some(target);
            parts.uri = Uri::from_parts(uri).ok()?;
            parts.version = Version::HTTP_2;
        } else {
            // HTTP/1.1 sends the origin form; the authority is `Host`.
            parts.uri = Uri::from(target);
            parts.version = Version::HTTP_11;
        }
        if self.http2 {
            // HTTP/2 carries the authority in the URI.
            parts.headers.remove(header::HOST);
        } else if !parts.headers.contains_key(header::HOST) {
            // HTTP/1.1 requires one (a client's HTTP/1.0 request may have
            // none to keep): the upstream's.
            if let Some(value) = &self.upstream_host {
                parts.headers.insert(header::HOST, value.clone());
            }
        }
        Some(Request::from_parts(parts, body))
    }
}

/// Removes the hop-by-hop headers, and those the `Connection` header names
/// (one list for the guard and the gateway: [`idempotency_guard::headers`]).
pub use idempotency_guard::headers::strip_hop_by_hop;

/// Adds `X-Forwarded-For` (appended), `X-Forwarded-Host`,
/// `X-Forwarded-Proto` and `Forwarded` (appended, RFC 7239). Each value is
/// written once into its own buffer, which becomes the header value
/// without a copy.
fn add_forwarding(
    headers: &mut HeaderMap,
    client: Option<&ClientAddress>,
    host: Option<&HeaderValue>,
) {
    let mut forwarded = String::with_capacity(96);
    if let Some(client) = client {
        // One lookup reads an earlier proxy's list and writes the new one.
        match headers.entry(X_FORWARDED_FOR) {
            Entry::Occupied(mut earlier) => {
                if let Ok(text) = earlier.get().to_str() {
                    let listed = client.listed.to_str().unwrap_or_default();
                    let mut list = String::with_capacity(text.len() + 2 + listed.len());
                    list.push_str(text);
                    list.push_str(", ");
                    list.push_str(listed);
                    if let Ok(value) = HeaderValue::try_from(list) {
                        earlier.insert(value);
                    }
                } else {
                    earlier.insert(client.listed.clone());
                }
            }
            Entry::Vacant(entry) => {
                entry.insert(client.listed.clone());
            }
        }
        forwarded.push_str(&client.forwarded_for);
    }
    if let Some(host) = host {
        headers.insert(X_FORWARDED_HOST, host.clone());
        if let Ok(text) = host.to_str() {
            forwarded.push_str("host=\"");
            if text.contains(['"', '\\']) {
                forwarded.extend(text.chars().filter(|c| !matches!(c, '"' | '\\')));
            } else {
                forwarded.push_str(text);
            }
            forwarded.push_str("\";");
        }
    }
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    forwarded.push_str("proto=http");
    match headers.entry(header::FORWARDED) {
        Entry::Occupied(mut earlier) => {
            let value = match earlier.get().to_str() {
                Ok(text) => {
                    let mut list = String::with_capacity(text.len() + 2 + forwarded.len());
                    list.push_str(text);
                    list.push_str(", ");
                    list.push_str(&forwarded);
                    HeaderValue::try_from(list)
                }
                Err(_) => HeaderValue::try_from(forwarded),
            };
            if let Ok(value) = value {
                earlier.insert(value);
            }
        }
        Entry::Vacant(entry) => {
            if let Ok(value) = HeaderValue::try_from(forwarded) {
                entry.insert(value);
            }
        }
    }
}

/// A failure after the request was sent: marked so the guard abandons the key.
fn unknown(kind: ProblemType, detail: &str) -> Response<Body> {
    let mut response = kind.problem(detail).into_response();
    response.extensions_mut().insert(OutcomeUnknown);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_dropped() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "keep-alive, x-private"),
            ("keep-alive", "timeout=5"),
            ("x-private", "secret"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("upgrade", "websocket"),
            ("content-type", "application/json"),
        ] {
            headers.insert(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        strip_hop_by_hop(&mut headers);
        let left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["content-type"]);
    }

    /// The request `outgoing` makes of `GET /items?x=1` with `Host:
    /// api.example` (or none), under `host = <mode>`.
    fn outgoing_host(mode: &str, client_host: Option<&'static str>) -> (Uri, HeaderMap) {
        let config = Config::from_toml(&format!(
            "upstream = \"http://127.0.0.1:9000\"\nstore = \"sqlite::memory:\"\n[[routes]]\npath = \"/payments\"\n[proxy]\nhost = \"{mode}\"\n"
        ))
        .expect("a configuration");
        let upstream = Upstream::new(&config).expect("an upstream");
        let mut request = Request::get("/items?x=1");
        if let Some(host) = client_host {
            request = request.header(header::HOST, host);
        }
        let request = request.body(Body::empty()).expect("a request");
        let outgoing = upstream.outgoing(request, None).expect("forwarded");
        (outgoing.uri().clone(), outgoing.headers().clone())
    }

    #[tokio::test]
    async fn host_is_the_upstreams_or_the_clients_and_the_target_is_in_origin_form() {
        let (uri, headers) = outgoing_host("upstream", Some("api.example"));
        assert_eq!(uri, "/items?x=1");
        assert_eq!(headers[header::HOST], "127.0.0.1:9000");
        assert_eq!(headers[X_FORWARDED_HOST], "api.example");
        assert_eq!(headers.get_all(header::HOST).iter().count(), 1);

        let (_, headers) = outgoing_host("keep", Some("api.example"));
        assert_eq!(headers[header::HOST], "api.example");
        assert_eq!(headers[X_FORWARDED_HOST], "api.example");

        // HTTP/1.1 needs a `Host`: a client's HTTP/1.0 request without one
        // gets the upstream's.
        let (_, headers) = outgoing_host("keep", None);
        assert_eq!(headers[header::HOST], "127.0.0.1:9000");
        assert!(!headers.contains_key(X_FORWARDED_HOST));
    }

    #[test]
    fn forwarding_headers_append_to_earlier_proxies() {
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        headers.insert(header::FORWARDED, HeaderValue::from_static("for=10.0.0.1"));
        let host = HeaderValue::from_static("api.example");
        let client = ClientAddress::new([127, 0, 0, 2].into());
        add_forwarding(&mut headers, Some(&client), Some(&host));
        assert_eq!(headers["x-forwarded-for"], "10.0.0.1, 127.0.0.2");
        assert_eq!(headers["x-forwarded-host"], "api.example");
        assert_eq!(headers["x-forwarded-proto"], "http");
        assert_eq!(
            headers[header::FORWARDED],
            "for=10.0.0.1, for=127.0.0.2;host=\"api.example\";proto=http"
        );
    }
}
