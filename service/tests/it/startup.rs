//! The real binary at start: every configuration error is one line that
//! names what to set, with exit code 2 and no backtrace; logs written to a
//! file or a pipe carry no colour codes, and `LOG_FORMAT=json` gives JSON
//! lines.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BINARY: &str = env!("CARGO_BIN_EXE_idempotency-service");

/// The variables of the service that a test sets, cleared first so that
/// the environment running the tests does not leak in.
const SETTINGS: [&str; 12] = [
    "DATABASE_URL",
    "STORE",
    "REDIS_URL",
    "LISTEN",
    "TOKENS_FILE",
    "TOKENS",
    "ADMIN_TOKENS_FILE",
    "ADMIN_TOKENS",
    "LOG_FORMAT",
    "LOG_JSON",
    "NO_COLOR",
    "MIGRATE_ON_START",
];

fn service(env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(BINARY);
    for name in SETTINGS {
        command.env_remove(name);
    }
    command
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdin(Stdio::null());
    command
}

#[test]
fn each_configuration_error_is_one_line_naming_what_to_set() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}?mode=rwc", dir.path().join("s.db").display());
    let short_tokens = dir.path().join("short-tokens");
    std::fs::write(&short_tokens, "default short\n").unwrap();
    let missing = dir.path().join("no-such-file").display().to_string();
    let short = short_tokens.display().to_string();
    // (settings, what the one line must name)
    type Row<'a> = (Vec<(&'a str, &'a str)>, &'a [&'a str]);
    let rows: Vec<Row<'_>> = vec![
        (
            vec![("STORE", "redis"), ("DATABASE_URL", &sqlite)],
            &["STORE=redis", "REDIS_URL"],
        ),
        (
            vec![("STORE", "tiered"), ("DATABASE_URL", &sqlite)],
            &["STORE=tiered", "REDIS_URL"],
        ),
        (
            vec![("STORE", "mongo")],
            &["STORE", "mongo", "sql, redis, tiered or nats"],
        ),
        (
            vec![("DATABASE_URL", "mysql://root@localhost/app")],
            &["DATABASE_URL", "postgres://", "sqlite:", "mysql:"],
        ),
        (
            vec![
                ("DATABASE_URL", &sqlite),
                ("STORE", "redis"),
                ("REDIS_URL", "http://x"),
            ],
            &["REDIS_URL", "redis://", "http:"],
        ),
        (
            vec![
                ("DATABASE_URL", &sqlite),
                ("STORE", "tiered"),
                ("REDIS_URL", "redis://127.0.0.1:1"),
            ],
            &["STORE=tiered", "DATABASE_URL", "postgres://"],
        ),
        (
            vec![("DATABASE_URL", &sqlite), ("TOKENS_FILE", &missing)],
            &["TOKENS_FILE", "no-such-file"],
        ),
        (
            vec![("DATABASE_URL", &sqlite), ("TOKENS_FILE", &short)],
            &["TOKENS_FILE", "line 1", "shorter"],
        ),
        (
            vec![("DATABASE_URL", &sqlite), ("TOKENS", "default tiny")],
            &["TOKENS", "shorter"],
        ),
        (
            vec![("DATABASE_URL", &sqlite), ("ADMIN_TOKENS_FILE", &missing)],
            &["ADMIN_TOKENS_FILE", "no-such-file"],
        ),
        (
            vec![("DATABASE_URL", &sqlite), ("LOG_FORMAT", "yaml")],
            &["LOG_FORMAT", "text or json", "yaml"],
        ),
    ];
    for (env, names) in rows {
        let output = service(&env).env("LISTEN", "127.0.0.1:0").output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{env:?}: a configuration error exits 2: {stderr}"
        );
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|line| !line.trim().is_empty())
            .collect();
        let line = lines.first().copied().unwrap_or_default();
        for name in names {
            assert!(
                line.contains(name),
                "{env:?}: {name:?} not named in {stderr:?}"
            );
        }
        assert!(
            !stderr.to_lowercase().contains("backtrace"),
            "{env:?}: no backtrace for a configuration error: {stderr}"
        );
        // clap's usage errors add a usage line and a hint; ours are one line.
        assert!(
            lines.len() <= 3,
            "{env:?}: a short message, not a dump: {stderr}"
        );
    }
}

/// Starts the service with its logs on a pipe, waits for the line that
/// says it listens, stops it, and returns what it wrote.
fn logs_of(env: &[(&str, &str)]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}?mode=rwc", dir.path().join("s.db").display());
    let listen = idempotency_tests::process::free_address().to_string();
    let mut child = service(env)
        .env("DATABASE_URL", &sqlite)
        .env("LISTEN", &listen)
        .env("TOKENS", "default token-for-the-log-test-0001")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut lines = Vec::new();
    while Instant::now() < deadline {
        if let Ok(line) = lines_rx.recv_timeout(Duration::from_millis(200)) {
            let listening = line.contains("listening");
            lines.push(line);
            if listening {
                break;
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        lines.iter().any(|line| line.contains("listening")),
        "the service said it listens: {lines:?}"
    );
    lines
}

#[test]
fn logs_on_a_pipe_are_plain_text_without_colour_codes() {
    let lines = logs_of(&[]);
    for line in &lines {
        assert!(!line.contains('\u{1b}'), "an escape code in {line:?}");
        assert!(
            serde_json::from_str::<serde_json::Value>(line).is_err(),
            "text, not JSON: {line}"
        );
    }
}

#[test]
fn log_format_json_gives_one_json_object_per_line() {
    let lines = logs_of(&[("LOG_FORMAT", "json")]);
    for line in &lines {
        let event: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|error| panic!("not JSON ({error}): {line}"));
        assert!(event["level"].is_string(), "{event}");
        assert!(event["fields"].is_object(), "{event}");
    }
    assert!(
        !lines
            .iter()
            .any(|line| line.contains("token-for-the-log-test")),
        "a token never reaches the logs"
    );
}
