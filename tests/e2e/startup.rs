//! The examples at start: every configuration error is one line naming the
//! variable and what it expects, exit code 2, no backtrace even with
//! `RUST_BACKTRACE=1` (the service's and the gateway's tables are in their
//! own crates' `startup` tests).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use idempotency_tests::programs::{self, Program};

/// The variables the examples read, cleared so the environment running
/// the tests does not leak in.
const SETTINGS: [&str; 15] = [
    "DATABASE_URL",
    "STORE",
    "REDIS_URL",
    "REDIS_PREFIX",
    "LISTEN",
    "LEASE_SECS",
    "STORE_TIMEOUT_MS",
    "SINGLE_COMMIT",
    "CONCURRENCY",
    "LOG_FORMAT",
    "IDEMPOTENCY_ENCRYPTION_KEYS",
    "IDEMPOTENCY_ENCRYPTION_KEYS_FILE",
    "IDEMPOTENCY_REQUIRE_SEALED",
    "AMQP_URL",
    "PUBLISH",
];

/// Runs `program` with `env` and returns its exit code and standard error;
/// one that starts after all is killed after 20 s.
fn run(program: Program, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut command = Command::new(programs::path(program));
    for name in SETTINGS {
        command.env_remove(name);
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = command
        .current_dir(dir.path())
        .env("RUST_BACKTRACE", "1")
        .env("LISTEN", "127.0.0.1:0")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn assert_one_line(program: Program, env: &[(&str, &str)], names: &[&str]) {
    let (code, stderr) = run(program, env);
    assert_eq!(
        code,
        Some(2),
        "{program:?} {env:?}: a configuration error exits 2: {stderr}"
    );
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|line| !line.trim().is_empty())
        .collect();
    assert_eq!(lines.len(), 1, "{program:?} {env:?}: one line: {stderr}");
    for name in names {
        assert!(
            lines[0].contains(name),
            "{program:?} {env:?}: {name:?} not named in {stderr:?}"
        );
    }
    assert!(!stderr.contains("secret"), "a password echoed: {stderr}");
    assert!(
        !stderr.to_lowercase().contains("backtrace"),
        "{program:?} {env:?}: no backtrace: {stderr}"
    );
}

/// The store rows both examples share (their settings are read the same
/// way through the guard's `StoreOptions::check`).
/// A row: the settings, and what the one line must name.
type Row = (
    &'static [(&'static str, &'static str)],
    &'static [&'static str],
);

const STORE_ROWS: [Row; 5] = [
    (&[("STORE", "redis")], &["STORE=redis", "REDIS_URL"]),
    (
        &[("STORE", "mongo")],
        &["STORE", "mongo", "sql, redis, tiered or nats"],
    ),
    (
        &[("DATABASE_URL", "mysql://root:secret@db/app")],
        &["DATABASE_URL", "postgres://", "sqlite:", "mysql:"],
    ),
    (
        &[("STORE", "redis"), ("REDIS_URL", "http://user:secret@r")],
        &["REDIS_URL", "redis://", "http:"],
    ),
    (
        &[("STORE", "tiered"), ("REDIS_URL", "redis://127.0.0.1:1")],
        &["STORE=tiered", "DATABASE_URL", "postgres://"],
    ),
];

#[test]
fn the_payments_example_names_each_bad_setting_on_one_line() {
    let own: [Row; 9] = [
        (
            &[("LEASE_SECS", "soon")],
            &["LEASE_SECS", "whole number", "soon"],
        ),
        // What the layer would refuse with a panic: exit 2 and one line.
        (&[("LEASE_SECS", "0")], &["LEASE_SECS", "at least 1"]),
        (
            &[("LEASE_SECS", "86400")],
            &["LEASE_SECS", "maximum handler time", "retention"],
        ),
        (
            &[("STORE_TIMEOUT_MS", "-1")],
            &["STORE_TIMEOUT_MS", "whole number"],
        ),
        (
            &[("SINGLE_COMMIT", "maybe")],
            &["SINGLE_COMMIT", "true or false"],
        ),
        (&[("LISTEN", "nowhere")], &["LISTEN", "127.0.0.1:3000"]),
        (
            &[("IDEMPOTENCY_ENCRYPTION_KEYS", "k1:not-base64")],
            &["IDEMPOTENCY_ENCRYPTION_KEYS", "<id>:<base64 of 32 bytes>"],
        ),
        (
            &[("IDEMPOTENCY_REQUIRE_SEALED", "maybe")],
            &["IDEMPOTENCY_REQUIRE_SEALED", "maybe", "true or false"],
        ),
        (&[("LOG_FORMAT", "yaml")], &["LOG_FORMAT", "yaml"]),
    ];
    for (env, names) in STORE_ROWS.iter().chain(own.iter()) {
        assert_one_line(Program::Payments, env, names);
    }
}

#[test]
fn the_orders_consumer_example_names_each_bad_setting_on_one_line() {
    let own: [Row; 4] = [
        (
            &[("LEASE_SECS", "soon")],
            &["LEASE_SECS", "whole number", "soon"],
        ),
        // What the engine would refuse with a panic: exit 2 and one line.
        (&[("LEASE_SECS", "0")], &["LEASE_SECS", "at least 1"]),
        (
            &[("LEASE_SECS", "86400")],
            &["LEASE_SECS", "maximum handler time", "retention"],
        ),
        (
            &[("CONCURRENCY", "many")],
            &["CONCURRENCY", "whole number", "many"],
        ),
    ];
    for (env, names) in STORE_ROWS.iter().chain(own.iter()) {
        assert_one_line(Program::OrdersConsumer, env, names);
    }
}

#[test]
fn the_grpc_payments_example_names_each_bad_setting_on_one_line() {
    let rows: [Row; 2] = [
        (
            &[("DATABASE_URL", "mysql://root:secret@db/app")],
            &["DATABASE_URL", "postgres://", "sqlite:", "mysql:"],
        ),
        (&[("LISTEN", "nowhere")], &["LISTEN", "127.0.0.1:50051"]),
    ];
    for (env, names) in &rows {
        assert_one_line(Program::PaymentsGrpc, env, names);
    }
}
