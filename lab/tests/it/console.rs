//! The operators' console on what a lab run left: the guarded run's store
//! after the crash, served by the status service with its console on, and
//! driven in headless Chromium (`scripts/console-browser` installs it):
//! the abandoned key of the crash found in the list of keys that need a
//! decision, opened, released with a reason (one audit line), and then the
//! client's retry runs, once, in the payments app. A key holding markup is
//! shown as text, and an admin of another scope sees nothing of it.

use std::process::Stdio;
use std::time::Duration;

use idempotency_guard::store::{AnyStore, Claim, LeaseToken, NewRecord, StoreOptions};
use idempotency_guard::{Fingerprint, Store as _};
use idempotency_lab::callers::debit;
use idempotency_tests::{Process, names};
use serde_json::Value;

use crate::lab_run::{PAYMENTS, STATUS_SERVICE, lab_run};

const ADMIN_A: &str = "lab-console-admin-of-default-0123456789";
const ADMIN_B: &str = "lab-console-admin-of-tenant-b-012345678";
const XSS_KEY: &str = "<script>window.__pwned=1</script>";
const REASON: &str =
    "checked the ledger after the crash: this debit never posted, the retry may run";

/// Leaves an abandoned record of `scope`/`key` in `store` (claimed, its
/// lease lapsed at once), as a crash would.
async fn abandon(store: &AnyStore, scope: &str, key: &str) {
    let fingerprint = Fingerprint::of_bytes(key.as_bytes());
    let new = NewRecord {
        scope: names::scope(scope),
        key: names::key(key),
        fingerprint: &fingerprint,
        method: "POST",
        path: "/payments",
        token: LeaseToken::new(),
        lease: Duration::from_secs(60),
        retention: Duration::from_secs(3600),
        transactional: false,
    };
    let Claim::Acquired(lease) = store.claim(&new).await.expect("claim") else {
        panic!("{scope}/{key} was already claimed");
    };
    store.renew(&lease, Duration::ZERO).await.expect("renew");
}

/// Rows of the ledger for a debit's amount.
async fn ledger_rows(url: &str, amount: i64) -> i64 {
    let pool = sqlx::SqlitePool::connect(url).await.expect("the ledger");
    let (rows,): (i64,) = sqlx::query_as("select count(*) from payments where amount = ?1")
        .bind(amount)
        .fetch_one(&pool)
        .await
        .expect("count the ledger's rows");
    pool.close().await;
    rows
}

/// The audit lines (JSON logs) the service wrote to `log`.
fn audit_lines(log: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["target"] == idempotency_service::AUDIT_TARGET)
        .map(|line| line["fields"].clone())
        .collect()
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("an array: {value}"))
        .iter()
        .map(|v| v.as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_releases_the_crashed_debit_of_a_lab_run_and_its_retry_runs_once() {
    let browser = idempotency_tests::console_browser::dir();
    let run = tokio::task::block_in_place(lab_run);
    let guarded = &run.incident.guarded;
    let abandoned = guarded
        .abandoned
        .iter()
        .find(|key| key.debit.is_some())
        .unwrap_or_else(|| panic!("the crash left an abandoned debit: {guarded:?}"));
    let operation = abandoned.debit.expect("traced to its debit");
    let key = abandoned.key.as_str();
    let lab_keys: Vec<&str> = guarded.abandoned.iter().map(|k| k.key.as_str()).collect();
    let url = format!("sqlite://{}", run.store.display());

    // Beside the lab's: a key holding markup, and another tenant's key.
    let store = AnyStore::open(&StoreOptions::sql(&url))
        .await
        .expect("the lab's store");
    abandon(&store, "default", XSS_KEY).await;
    abandon(&store, "tenant-b", "debit-b-0001").await;

    // The payments app on the lab's store, as the lab ran it: the client's
    // retry of the crashed debit is refused while its outcome is unknown.
    let app_env = [
        ("DATABASE_URL", url.as_str()),
        ("IDEMPOTENCY_GUARD", "on"),
        ("RUST_LOG", "off"),
    ];
    let app = Process::start(PAYMENTS, &app_env, "/metrics").await;
    let http = reqwest::Client::new();
    let retry = || {
        http.post(format!("http://{}/payments", app.address))
            .header("idempotency-key", key)
            .json(&debit(&operation))
            .send()
    };
    let before = retry().await.expect("the retry is answered");
    assert_eq!(before.status(), 409, "an abandoned key refuses the retry");
    let problem: Value = before.json().await.expect("a problem");
    assert_eq!(
        problem["type"], "urn:idempotency:outcome-unknown",
        "{problem}"
    );
    let rows_before = ledger_rows(&url, operation.amount()).await;

    // The status service, console on, logging JSON to a file.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let log = dir.path().join("service.log");
    let address = idempotency_tests::process::free_address();
    let mut service = tokio::process::Command::new(STATUS_SERVICE)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", &url)
        .env("LISTEN", address.to_string())
        .env("TOKENS", "default scope-token-of-the-lab-0123456789")
        .env(
            "ADMIN_TOKENS",
            format!("ops default {ADMIN_A};bob tenant-b {ADMIN_B}"),
        )
        .env("CONSOLE", "true")
        .env("RECONCILED_FILE", dir.path().join("reconciled.jsonl"))
        .env("MIGRATE_ON_START", "false")
        .env("LOG_FORMAT", "json")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).expect("the log file"))
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("the status service starts");
    let mut ready = false;
    for _ in 0..300 {
        if let Ok(Some(status)) = service.try_wait() {
            panic!(
                "the service exited with {status}: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        let health = http.get(format!("http://{address}/healthz")).send().await;
        if health.is_ok_and(|answer| answer.status() == 200) {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "the service did not answer /healthz within 30 s");

    // The browser.
    let mut node = tokio::process::Command::new("node");
    node.arg("lab-run.mjs")
        .current_dir(&browser)
        .env("BASE_URL", format!("http://{address}"))
        .env("TOKEN_A", ADMIN_A)
        .env("TOKEN_B", ADMIN_B)
        .env("SCOPE", "default")
        .env("KEY", key)
        .env("XSS_KEY", XSS_KEY)
        .env("REASON", REASON)
        .env("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
        .kill_on_drop(true);
    if let Ok(shots) = std::env::var("CONSOLE_SCREENSHOTS") {
        node.env("SCREENSHOTS", shots);
    }
    let output = tokio::time::timeout(Duration::from_secs(180), node.output())
        .await
        .expect("the browser script finished within 3 minutes")
        .expect("node runs (install Node.js)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the browser script failed: {}\n{stdout}\nservice log:\n{}",
        String::from_utf8_lossy(&output.stderr),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|_| panic!("one JSON line: {stdout}"));

    // Signed in: the lab's abandoned keys (and the one holding markup)
    // are the keys that need a decision, listed first; the rest apart.
    assert_eq!(seen["scope"], "default");
    let mut needs = strings(&seen["needsBefore"]);
    needs.sort();
    let mut expected: Vec<String> = lab_keys.iter().map(|k| (*k).to_owned()).collect();
    expected.push(XSS_KEY.to_owned());
    expected.sort();
    assert_eq!(needs, expected, "{seen}");
    let rest = strings(&seen["restBefore"]);
    assert!(!rest.is_empty(), "the lab's completed debits: {seen}");
    assert!(rest.iter().all(|k| !expected.contains(k)), "{rest:?}");
    // The key holding markup rendered as text, and ran nothing.
    assert_eq!(seen["xssRendered"], true, "{seen}");
    assert_eq!(seen["injectedElements"], 0);
    assert_eq!(seen["pwned"], Value::Null);
    assert_eq!(seen["pwnedAfter"], Value::Null);
    assert_eq!(seen["xssKeyPage"], XSS_KEY);
    assert_eq!(seen["dialogs"], serde_json::json!([]));
    assert_eq!(seen["pageErrors"], serde_json::json!([]), "{seen}");
    assert_eq!(seen["cspViolations"], serde_json::json!([]), "{seen}");

    // The crashed debit's page: its life and its request.
    let key_page = &seen["keyPage"];
    assert_eq!(key_page["key"], key);
    let life = strings(&key_page["life"]);
    assert!(life[0].starts_with("claimed"), "{life:?}");
    assert!(
        life.iter().any(|s| s.starts_with("lease expired")),
        "{life:?}"
    );
    let request = key_page["request"].as_str().unwrap_or_default();
    assert!(
        request.contains("POST")
            && request.contains("/payments")
            && request.contains(&abandoned.fingerprint),
        "{request}"
    );
    assert!(
        key_page["badge"]
            .as_str()
            .unwrap_or_default()
            .contains("Outcome unknown"),
        "{key_page}"
    );
    assert_eq!(key_page["releaseEnabled"], true);
    assert!(
        seen["noReason"]
            .as_str()
            .unwrap_or_default()
            .contains("reason"),
        "{seen}"
    );
    assert!(
        seen["released"]
            .as_str()
            .unwrap_or_default()
            .contains("Released"),
        "{seen}"
    );
    let mut after = strings(&seen["needsAfter"]);
    after.sort();
    expected.retain(|k| k != key);
    assert_eq!(after, expected, "released: no longer needs a decision");

    // tenant-b's admin sees nothing of it.
    let other = &seen["other"];
    assert_eq!(other["scope"], "tenant-b");
    assert_eq!(strings(&other["needs"]), ["debit-b-0001"]);
    assert_eq!(strings(&other["rest"]), Vec::<String>::new());
    assert!(
        other["forcedScope"]
            .as_str()
            .unwrap_or_default()
            .contains("may not act on scope"),
        "{other}"
    );
    assert_eq!(strings(&other["forcedRows"]), Vec::<String>::new());
    assert!(
        other["forcedKey"]
            .as_str()
            .unwrap_or_default()
            .contains("may not act on scope"),
        "{other}"
    );
    assert_eq!(other["forcedKeyShown"], "");
    let shown = other["page"].as_str().unwrap_or_default();
    assert!(
        !shown.contains(key) && !shown.contains("__pwned"),
        "{shown}"
    );

    // One audit line of the release, with who and why.
    let audit = audit_lines(&log);
    let release: Vec<&Value> = audit
        .iter()
        .filter(|line| line["action"] == "release")
        .collect();
    assert_eq!(release.len(), 1, "{audit:?}");
    assert_eq!(release[0]["who"], "ops");
    assert_eq!(release[0]["scope"], "default");
    assert_eq!(release[0]["key"], key);
    assert_eq!(release[0]["reason"], REASON);
    assert_eq!(release[0]["result"], "deleted-abandoned");
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !log_text.contains(ADMIN_A) && !log_text.contains(ADMIN_B),
        "tokens are never logged"
    );

    // And the client's retry runs: a fresh 201, the debit executed once
    // more; its replay runs nothing.
    let fresh = retry().await.expect("the retry is answered");
    assert_eq!(fresh.status(), 201);
    assert_eq!(fresh.headers().get("idempotent-replayed"), None);
    assert_eq!(
        ledger_rows(&url, operation.amount()).await,
        rows_before + 1,
        "executed once more"
    );
    let replay = retry().await.expect("the replay is answered");
    assert_eq!(replay.status(), 201);
    assert_eq!(
        replay
            .headers()
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    assert_eq!(ledger_rows(&url, operation.amount()).await, rows_before + 1);
    service.kill().await.expect("stop the service");
}
