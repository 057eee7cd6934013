//! The real binary at start: every configuration error is one line that
//! names the setting or file and what it expects, exits 2 and prints no
//! backtrace (even with `RUST_BACKTRACE=1`).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BINARY: &str = env!("CARGO_BIN_EXE_idempotency-gateway");

/// The variables the gateway reads, cleared so the environment running the
/// tests does not leak in.
const SETTINGS: [&str; 11] = [
    "GATEWAY_CONFIG",
    "LISTEN",
    "UPSTREAM_URL",
    "DATABASE_URL",
    "REDIS_URL",
    "STORE_KIND",
    "LOG_FORMAT",
    "IDEMPOTENCY_ENCRYPTION_KEYS",
    "IDEMPOTENCY_ENCRYPTION_KEYS_FILE",
    "IDEMPOTENCY_REQUIRE_SEALED",
    "NO_SUCH_SECRET",
];

/// Runs the gateway on `toml` (or on `path` when given) with `env`, and
/// returns its exit code and standard error. A gateway that starts after
/// all is killed after 20 s, and the test then fails on its exit code.
fn run(
    dir: &std::path::Path,
    toml: &str,
    path: Option<&str>,
    env: &[(&str, &str)],
) -> (Option<i32>, String) {
    let file = dir.join("gateway.toml");
    std::fs::write(&file, toml).expect("write the configuration");
    let config = path.map_or_else(|| file.display().to_string(), str::to_owned);
    let mut command = Command::new(BINARY);
    for name in SETTINGS {
        command.env_remove(name);
    }
    let mut child = command
        .env("GATEWAY_CONFIG", &config)
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LOG", "info")
        .env("LISTEN", "127.0.0.1:0")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the gateway");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("poll the gateway").is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let output = child.wait_with_output().expect("the gateway's output");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn each_configuration_error_is_one_line_naming_what_to_set() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let sqlite = format!("sqlite://{}?mode=rwc", dir.path().join("g.db").display());
    let top = format!("upstream = \"http://127.0.0.1:9\"\nstore = \"{sqlite}\"\n");
    let routes = "[[routes]]\npath = \"/payments\"\n";
    let base = format!("{top}{routes}");
    // Top-level settings go before the first table.
    let with = |more: &str| format!("{top}{more}\n{routes}");
    let missing = dir.path().join("no-such.toml").display().to_string();
    let missing_pem = dir.path().join("no-such.pem").display().to_string();
    // (TOML, config path override, env, what the one line must name)
    type Row<'a> = (
        String,
        Option<&'a str>,
        Vec<(&'a str, &'a str)>,
        Vec<&'a str>,
    );
    let rows: Vec<Row<'_>> = vec![
        (
            base.clone(),
            Some(&missing),
            vec![],
            vec!["no-such.toml", "cannot read"],
        ),
        (
            "upstream = \"http://x\nstore = 1\n".to_owned(),
            None,
            vec![],
            vec!["gateway.toml", "does not parse", "line 1"],
        ),
        (
            with("upstrem = \"http://x\""),
            None,
            vec![],
            vec!["does not parse", "line 3", "unknown field", "upstrem"],
        ),
        (
            with("store_kind = \"redis\""),
            None,
            vec![],
            vec!["store_kind=redis", "REDIS_URL", "redis://"],
        ),
        (
            base.clone(),
            None,
            vec![("STORE_KIND", "mongo")],
            vec!["mongo", "sql, redis, tiered or nats"],
        ),
        (
            base.clone(),
            None,
            vec![("DATABASE_URL", "mysql://root:secret@db/app")],
            vec!["DATABASE_URL", "postgres://", "sqlite:", "mysql:"],
        ),
        (
            with("store_kind = \"redis\"\nredis = \"http://user:secret@r\""),
            None,
            vec![],
            vec!["REDIS_URL", "redis://", "http:"],
        ),
        (
            with("store_kind = \"tiered\"\nredis = \"redis://127.0.0.1:1\""),
            None,
            vec![],
            vec!["store_kind=tiered", "DATABASE_URL", "postgres://"],
        ),
        (
            base.replace("http://127.0.0.1:9", "https://example.com"),
            None,
            vec![],
            vec!["upstream", "http://host"],
        ),
        (
            with("encryption_keys_env = \"NO_SUCH_SECRET\""),
            None,
            vec![],
            vec!["encryption_keys_env", "NO_SUCH_SECRET", "no encryption key"],
        ),
        (
            base.clone(),
            None,
            vec![("IDEMPOTENCY_ENCRYPTION_KEYS", "k1:not-base64")],
            vec!["IDEMPOTENCY_ENCRYPTION_KEYS", "<id>:<base64 of 32 bytes>"],
        ),
        (
            base.clone(),
            None,
            vec![("IDEMPOTENCY_REQUIRE_SEALED", "maybe")],
            vec!["IDEMPOTENCY_REQUIRE_SEALED", "maybe", "true or false"],
        ),
        (
            format!("require_sealed = \"yes\"\n{base}"),
            None,
            vec![],
            vec!["line 1", "expected a boolean"],
        ),
        (
            format!(
                "{base}[scope]\nfrom = \"jwt\"\njwt_algorithm = \"RS256\"\njwt_public_key_file = \"{missing_pem}\"\n"
            ),
            None,
            vec![],
            vec!["cannot read", "no-such.pem"],
        ),
        (
            format!("{top}[scope]\nfrom = \"jwt\"\njwt_secret_env = \"NO_SUCH_SECRET\"\n{routes}"),
            None,
            vec![],
            vec!["NO_SUCH_SECRET", "at least 16 bytes"],
        ),
        (
            format!("{top}[[routes]]\npath = \"payments\"\n"),
            None,
            vec![],
            vec!["route", "payments", "starts with /"],
        ),
        (
            base.clone(),
            None,
            vec![("LOG_FORMAT", "yaml")],
            vec!["LOG_FORMAT", "yaml"],
        ),
        (
            format!(
                "{base}[policy]\nretention_seconds = 60\nmax_handler_seconds = 60\nlease_seconds = 10\n"
            ),
            None,
            vec![],
            vec![
                "policy.retention_seconds",
                "max_handler_seconds + policy.lease_seconds",
            ],
        ),
    ];
    for (toml, path, env, names) in rows {
        let (code, stderr) = run(dir.path(), &toml, path, &env);
        assert_eq!(
            code,
            Some(2),
            "{toml:?} {env:?}: a configuration error exits 2: {stderr}"
        );
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|line| !line.trim().is_empty())
            .collect();
        assert_eq!(lines.len(), 1, "{toml:?} {env:?}: one line: {stderr}");
        for name in names {
            assert!(
                lines[0].contains(name),
                "{toml:?} {env:?}: {name:?} not named in {stderr:?}"
            );
        }
        assert!(!stderr.contains("secret@"), "a password echoed: {stderr}");
        assert!(
            !stderr.to_lowercase().contains("backtrace"),
            "no backtrace for a configuration error: {stderr}"
        );
    }
}

#[test]
fn a_store_that_cannot_be_reached_is_a_runtime_failure_on_one_line() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let toml = "upstream = \"http://127.0.0.1:9\"\nstore = \"postgres://postgres@127.0.0.1:1/none\"\n\
                [[routes]]\npath = \"/payments\"\n";
    let (code, stderr) = run(dir.path(), toml, None, &[]);
    assert_eq!(code, Some(1), "not a configuration error: {stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|line| !line.trim().is_empty())
        .collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(lines[0].contains("cannot open the store"), "{stderr}");
}
