//! The lab runs the tests share: the jitter incident (a short window at a
//! low rate, both runs over the same seed, a crash mid-debit, the guarded
//! run's store kept), and the overload incident at the same size.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use idempotency_lab::{Incident, IncidentConfig, Overload, Programs};

/// The payments example, built as this package's binary.
pub(crate) const PAYMENTS: &str = env!("CARGO_BIN_EXE_lab-payments");
/// `idempotency-service`, built as this package's binary.
pub(crate) const STATUS_SERVICE: &str = env!("CARGO_BIN_EXE_lab-status-service");

/// What the shared run left.
pub(crate) struct LabRun {
    /// Its figures, page and plot.
    pub(crate) incident: Incident,
    /// The guarded run's SQLite file (`--keep-store`).
    pub(crate) store: PathBuf,
    _dir: tempfile::TempDir,
}

/// A run without a kept store (the overload run, the resume run) and the
/// directory its page is in.
pub(crate) struct OverloadRun {
    /// Its figures, page and plot.
    pub(crate) incident: Incident,
    _dir: tempfile::TempDir,
}

/// The overload run at CI size: 12 operations per second, 24 offered for
/// 12 s from 2 s in, a capacity of 18 requests per second.
///
/// # Panics
///
/// When the run failed.
pub(crate) fn overload_run() -> &'static OverloadRun {
    static RUN: OnceLock<Result<OverloadRun, String>> = OnceLock::new();
    let run = RUN.get_or_init(|| {
        std::thread::spawn(overload_once)
            .join()
            .unwrap_or_else(|_| Err("the overload run panicked (its message is above)".to_owned()))
    });
    run.as_ref()
        .unwrap_or_else(|error| panic!("the overload run: {error}"))
}

/// One lab run at a time: two at once on a small machine would skew both.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn overload_once() -> Result<OverloadRun, String> {
    let _alone = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut config = IncidentConfig::overload(11);
    config.rate = 12.0;
    config.writes = 0.4;
    config.duration = Duration::from_secs(18);
    config.schedule.start = Duration::from_secs(2);
    // Long enough that the few retries each of the four clients makes
    // before its overload limiter trips stay a small share of the window.
    config.schedule.window = Duration::from_secs(12);
    config.overload = Some(Overload::for_rate(config.rate));
    let dir = tempfile::tempdir().map_err(|error| format!("a temporary directory: {error}"))?;
    let incident = runtime()?
        .block_on(idempotency_lab::incident(
            &config,
            &programs(),
            dir.path(),
            None,
        ))
        .map_err(|error| format!("{error:#}"))?;
    println!(
        "{}",
        idempotency_lab::report::table(&incident.naive, &incident.guarded)
    );
    Ok(OverloadRun {
        incident,
        _dir: dir,
    })
}

/// The crash run on the resumable route at CI size: the jitter run's
/// traffic and faults, the app killed once mid-debit, the guarded run's
/// debits on `POST /debits` (reserve, charge at the lab's fake PSP,
/// record), resumed by the client's retry.
///
/// # Panics
///
/// When the run failed.
pub(crate) fn resume_run() -> &'static OverloadRun {
    static RUN: OnceLock<Result<OverloadRun, String>> = OnceLock::new();
    let run = RUN.get_or_init(|| {
        std::thread::spawn(resume_once)
            .join()
            .unwrap_or_else(|_| Err("the resume run panicked (its message is above)".to_owned()))
    });
    run.as_ref()
        .unwrap_or_else(|error| panic!("the resume run: {error}"))
}

fn resume_once() -> Result<OverloadRun, String> {
    let _alone = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut config = IncidentConfig::new(7);
    config.rate = 12.0;
    config.writes = 0.4;
    config.duration = Duration::from_secs(12);
    config.schedule.start = Duration::from_secs(2);
    config.schedule.window = Duration::from_secs(8);
    config.crash_at = Some(Duration::from_secs(1));
    config.resume = true;
    let dir = tempfile::tempdir().map_err(|error| format!("a temporary directory: {error}"))?;
    let incident = runtime()?
        .block_on(idempotency_lab::incident(
            &config,
            &programs(),
            dir.path(),
            None,
        ))
        .map_err(|error| format!("{error:#}"))?;
    println!(
        "{}",
        idempotency_lab::report::table(&incident.naive, &incident.guarded)
    );
    Ok(OverloadRun {
        incident,
        _dir: dir,
    })
}

fn programs() -> Programs {
    Programs {
        payments: PAYMENTS.to_owned(),
        status_service: STATUS_SERVICE.to_owned(),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|error| format!("a runtime: {error}"))
}

/// The run, made by the first test that asks (the others wait for it).
///
/// # Panics
///
/// When the run failed (every test that asks says so).
pub(crate) fn lab_run() -> &'static LabRun {
    static RUN: OnceLock<Result<LabRun, String>> = OnceLock::new();
    let run = RUN.get_or_init(|| {
        // On a runtime of its own: the tests' runtimes end with them.
        std::thread::spawn(run_once)
            .join()
            .unwrap_or_else(|_| Err("the lab run panicked (its message is above)".to_owned()))
    });
    run.as_ref()
        .unwrap_or_else(|error| panic!("the lab run: {error}"))
}

fn run_once() -> Result<LabRun, String> {
    let _alone = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut config = IncidentConfig::new(7);
    config.rate = 12.0;
    config.writes = 0.4;
    config.duration = Duration::from_secs(12);
    config.schedule.start = Duration::from_secs(2);
    config.schedule.window = Duration::from_secs(8);
    // The app killed once, mid-debit, before the window: the guarded run
    // is left with an abandoned key (the console's test releases it).
    config.crash_at = Some(Duration::from_secs(1));
    let programs = programs();
    let dir = tempfile::tempdir().map_err(|error| format!("a temporary directory: {error}"))?;
    let kept = dir.path().join("store");
    let incident = runtime()?
        .block_on(idempotency_lab::incident(
            &config,
            &programs,
            dir.path(),
            Some(&kept),
        ))
        .map_err(|error| format!("{error:#}"))?;
    println!(
        "{}",
        idempotency_lab::report::table(&incident.naive, &incident.guarded)
    );
    Ok(LabRun {
        incident,
        store: kept.join("guarded.db"),
        _dir: dir,
    })
}
