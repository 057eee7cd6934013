//! The file as users write it: typed values, their errors with line and
//! column, and the defaults the example file shows.

use std::time::Duration;

use http::{Method, StatusCode};
use idempotency_guard::store::StoreKind;
use idempotency_jsonrpc::KeySource;
use jsonwebtoken::Algorithm;

use super::*;

const BASE: &str = "upstream = \"http://127.0.0.1:8000\"\n[[routes]]\npath = \"/payments\"\n";

fn with(more: &str) -> Result<Config, ConfigError> {
    Config::from_toml(&format!("{BASE}{more}"))
}

/// The parse error's line, column and message.
fn parse_error(more: &str) -> (usize, usize, String) {
    match with(more) {
        Err(ConfigError::Parse {
            line,
            column,
            message,
        }) => (line, column, message),
        other => panic!("{more:?}: expected a parse error, got {other:?}"),
    }
}

#[test]
fn durations_are_seconds_written_as_integers_or_not() {
    let config = with("[policy]\nlease_seconds = 30\nretry_after_seconds = 0.25\n").unwrap();
    assert_eq!(config.policy.lease, Duration::from_secs(30));
    assert_eq!(config.policy.retry_after, Duration::from_millis(250));
    let config = with("[server]\nidle_seconds = 30.5\nbody_seconds = 0\n").unwrap();
    assert_eq!(config.server.idle, Duration::from_millis(30_500));
    assert_eq!(config.server.body, Duration::ZERO);
    let config = with("[proxy]\ntimeout_seconds = 1\n").unwrap();
    assert_eq!(config.proxy.timeout, Duration::from_secs(1));
}

#[test]
fn a_duration_that_is_not_one_is_refused_at_its_line_and_column() {
    for (value, says) in [
        ("-1", "-1 is not a duration"),
        ("-0.5", "-0.5 is not a duration"),
        ("inf", "inf is not a duration"),
        ("nan", "NaN is not a duration"),
        ("\"30\"", "expected a number of seconds"),
    ] {
        let (line, column, message) = parse_error(&format!("[policy]\nlease_seconds = {value}\n"));
        assert_eq!((line, column), (5, 17), "{value}: {message}");
        assert!(message.contains(says), "{value}: {message}");
    }
}

#[test]
fn choices_are_read_as_enums_and_others_refused_naming_the_choices() {
    let config = with(
        "[scope]\nfrom = \"jwt\"\njwt_algorithm = \"EdDSA\"\n\
         [proxy]\nhost = \"keep\"\n\
         [policy]\nin_flight = \"wait\"\nabandoned = \"run-again\"\nroute_not_guarded = \"pass\"\n",
    )
    .unwrap();
    assert_eq!(config.scope.from, ScopeFrom::Jwt);
    assert_eq!(config.scope.jwt_algorithm, Algorithm::EdDSA);
    assert_eq!(config.proxy.host, HostHeader::Keep);
    assert_eq!(config.policy.in_flight, InFlight::Wait);
    assert_eq!(config.policy.abandoned, Abandoned::RunAgain);
    assert_eq!(config.policy.route_not_guarded, RouteNotGuarded::Pass);
    for (more, says) in [
        ("[policy]\nin_flight = \"queue\"\n", "`reject` or `wait`"),
        (
            "[policy]\nabandoned = \"run_again\"\n",
            "`reject` or `run-again`",
        ),
        (
            "[policy]\nroute_not_guarded = \"allow\"\n",
            "`refuse` or `pass`",
        ),
        ("[scope]\nfrom = \"cookie\"\n", "`fixed`, `header`, `jwt`"),
        ("[scope]\njwt_algorithm = \"hs256\"\n", "`HS256`"),
        ("[proxy]\nhost = \"both\"\n", "`upstream` or `keep`"),
    ] {
        let (line, _, message) = parse_error(more);
        assert_eq!(line, 5, "{more}: {message}");
        assert!(message.contains(says), "{more}: {message}");
    }
}

#[test]
fn the_store_kind_is_the_guards_and_an_unknown_one_is_refused_where_written() {
    let config = Config::from_toml(&format!("store_kind = \"tiered\"\n{BASE}")).unwrap();
    assert_eq!(config.store_kind, StoreKind::Tiered);
    assert_eq!(with("").unwrap().store_kind, StoreKind::Sql);
    let Err(ConfigError::Parse {
        line,
        column,
        message,
    }) = Config::from_toml(&format!("store_kind = \"mongo\"\n{BASE}"))
    else {
        panic!("mongo parsed");
    };
    assert_eq!((line, column), (1, 14));
    assert!(
        message.contains("\"mongo\"") && message.contains("sql, redis or tiered"),
        "{message}"
    );
}

#[test]
fn the_mismatch_status_is_a_status() {
    let config = with("[policy]\nmismatch_status = 422\n").unwrap();
    assert_eq!(
        config.policy.mismatch_status,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    let (line, column, message) = parse_error("[policy]\nmismatch_status = 42\n");
    assert_eq!((line, column), (5, 19));
    assert!(message.contains("42 is not an HTTP status"), "{message}");
}

#[test]
fn methods_in_any_case_and_key_sources_are_parsed_and_a_bad_entry_is_pointed_at() {
    let config = Config::from_toml(
        "upstream = \"http://127.0.0.1:8000\"\n\
         [[routes]]\npath = \"/a\"\nmethods = [\"post\", \"PUT\"]\n\
         [[routes]]\npath = \"/mcp\"\ntype = \"jsonrpc\"\ntools = [\"t\"]\nkey_sources = [\"message-id\"]\n",
    )
    .unwrap();
    config.validate().unwrap();
    assert_eq!(
        config.routes[0].guarded_methods(),
        [Method::POST, Method::PUT]
    );
    assert_eq!(
        config.routes[1].key_sources_or_default(),
        [KeySource::MessageId]
    );
    let Err(ConfigError::Parse {
        line,
        column,
        message,
    }) = Config::from_toml(
        "upstream = \"http://127.0.0.1:8000\"\n[[routes]]\npath = \"/a\"\nmethods = [\"post\", \"g e t\"]\n",
    )
    else {
        panic!("a bad method parsed");
    };
    assert_eq!((line, column), (4, 20), "the entry itself: {message}");
    assert!(message.contains("bad method \"g e t\""), "{message}");
}

#[test]
fn a_header_scope_names_a_header() {
    let config = with("[scope]\nfrom = \"header\"\nheader = \"X-Tenant\"\n").unwrap();
    assert_eq!(
        config.scope.header,
        Some(http::HeaderName::from_static("x-tenant"))
    );
    let (line, _, message) = parse_error("[scope]\nheader = \"a b\"\n");
    assert_eq!(line, 5);
    assert!(
        message.contains("\"a b\" is not a header name"),
        "{message}"
    );
}

#[test]
fn the_example_file_shows_every_sections_default() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/gateway.example.toml");
    let example = Config::from_file(std::path::Path::new(path)).unwrap();
    let defaults = with("").unwrap();
    assert_eq!(example.scope, ScopeConfig::default());
    assert_eq!(example.proxy, ProxyConfig::default());
    assert_eq!(example.limits, LimitsConfig::default());
    assert_eq!(example.policy, PolicyConfig::default());
    assert_eq!(example.server, ServerConfig::default());
    assert_eq!(defaults.policy, PolicyConfig::default());
    assert_eq!(defaults.server, ServerConfig::default());
    assert_eq!(
        (
            example.listen,
            &example.store,
            example.store_kind,
            &example.redis_prefix,
            example.migrate,
            example.require_sealed,
        ),
        (
            defaults.listen,
            &defaults.store,
            defaults.store_kind,
            &defaults.redis_prefix,
            defaults.migrate,
            defaults.require_sealed,
        )
    );
}

#[test]
fn validate_keeps_the_rules_that_tie_settings_together() {
    for (more, says) in [
        (
            "[policy]\nlease_seconds = 0.5\n",
            "policy.lease_seconds must be at least 1",
        ),
        (
            "[policy]\nretention_seconds = 70\nmax_handler_seconds = 60\nlease_seconds = 10\n",
            "policy.retention_seconds must exceed",
        ),
        ("[server]\nmax_connections = 0\n", "server.max_connections"),
        ("[[routes]]\npath = \"/payments\"\n", "named twice"),
        (
            "[[routes]]\npath = \"/metrics\"\n",
            "answers that path itself",
        ),
        ("[[routes]]\npath = \"/b\"\nmethods = []\n", "no methods"),
    ] {
        let error = with(more).unwrap().validate().unwrap_err().to_string();
        assert!(error.contains(says), "{more}: {error}");
    }
    with("[policy]\nretention_seconds = 71\nmax_handler_seconds = 60\nlease_seconds = 10\n")
        .unwrap()
        .validate()
        .unwrap();
}
