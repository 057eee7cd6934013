//! The run: plans every measurement, executes them one after another (each
//! concurrency level's runs back to back, so ratios compare figures taken
//! minutes apart at most), cleans up, and writes the report and the plot.

use std::path::PathBuf;
use std::time::Duration;

use crate::cli::{App, RunArgs, StoreName};
use crate::harness::{Bench, Step};
use crate::raw::RawOp;
use crate::results::{Results, Row, Scenario, Settings};
use crate::setup::{BenchDatabase, delete_nats_buckets, delete_redis_keys};

/// Runs the benchmark with `args`.
pub(crate) async fn run(mut args: RunArgs) -> anyhow::Result<()> {
    let command = command_line(&args);
    args.redis_cluster_urls.retain(|url| !url.trim().is_empty());
    if args.replica_acks_only {
        // Its runs use the private primary alone: no cluster to clean up.
        args.redis_cluster_urls.clear();
    }
    if args.smoke {
        args.duration_ms = 100;
        args.warmup_ms = 50;
        args.concurrency = vec![2];
        args.replay_keys = 16;
        args.large_body_connections = 4;
        args.growth = true;
        args.growth_rows = vec![2000];
        // CI must not compile the peer 2.0.0 crate.
        args.no_peer2 = true;
    }
    let wants_peer2 = !args.no_peer2
        && !args.growth_only
        && !args.replica_acks_only
        && args.stores.iter().any(|store| store == "redis");
    let peer2_bin = match (&args.peer2_bin, wants_peer2) {
        (_, false) => None,
        (Some(bin), true) => Some(bin.clone()),
        (None, true) => Some(crate::peer2::build().await?),
    };
    let smoke_dir;
    let out_dir = match (&args.out_dir, args.smoke) {
        (Some(dir), _) => dir.clone(),
        (None, true) => {
            smoke_dir = tempfile::tempdir()?;
            smoke_dir.path().to_owned()
        }
        (None, false) => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs"),
    };
    let settings = Settings {
        command,
        warmup: Duration::from_millis(args.warmup_ms),
        duration: Duration::from_millis(args.duration_ms),
        concurrency: args.concurrency.clone(),
        pool_size: args.pool_size,
        replay_keys: args.replay_keys,
        large_body_connections: args.large_body_connections,
        smoke: args.smoke,
        peer2: peer2_bin.is_some(),
        server_metrics: !args.no_server_metrics,
        started: time::OffsetDateTime::now_utc(),
        machine_before: crate::machine::Load::now(),
        machine_after: None,
    };
    eprintln!(
        "load before the run: {} (2 cores are shared with PostgreSQL, Redis and the load generator)",
        settings.machine_before
    );
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let nats = args.stores.iter().any(|store| store == "nats");
    if nats {
        probe_nats(&args, &run_id).await?;
    }
    let db = BenchDatabase::create(&args.postgres_url, &format!("idem_bench_{run_id}")).await?;
    let mut bench = Bench {
        warmup: settings.warmup,
        duration: settings.duration,
        args,
        run_id,
        counter: 0,
        db,
        sqlite_dir: tempfile::tempdir()?,
        peer2_bin,
    };
    // The replica-acknowledgement runs use a private primary with a replica.
    let replicated = if bench.args.replica_acks_only {
        let pair = crate::replicas::ReplicatedRedis::start()?;
        bench.args.redis_url = pair.url.clone();
        Some(pair)
    } else {
        None
    };
    let measured = if bench.args.growth_only {
        Ok(Vec::new())
    } else if bench.args.encryption_only {
        bench.measure(bench.encryption_plan()).await
    } else if bench.args.replica_acks_only {
        bench.measure(bench.replica_acks_plan()).await
    } else {
        bench.measure_all().await
    };
    let growth = match (
        &measured,
        (bench.args.growth || bench.args.growth_only)
            && !bench.args.encryption_only
            && !bench.args.replica_acks_only,
    ) {
        (Ok(_), true) => crate::growth::run(&mut bench).await,
        _ => Ok(Vec::new()),
    };
    // Clean up whatever happened.
    let pattern = format!("idem-bench-{}-*", bench.run_id);
    let mut nodes = vec![bench.args.redis_url.clone()];
    nodes.extend(bench.args.redis_cluster_urls.iter().cloned());
    if let Err(error) = delete_redis_keys(&nodes, &pattern).await {
        eprintln!("warning: could not delete the Redis keys {pattern}: {error:#}");
    }
    if nats {
        let run = format!("idem-bench-{}-", bench.run_id);
        let deleted =
            delete_nats_buckets(&bench.args.nats_url, |bucket| bucket.starts_with(&run)).await;
        if let Err(error) = deleted {
            eprintln!("warning: could not delete the NATS buckets {run}*: {error:#}");
        }
    }
    if let Err(error) = bench.db.drop_database().await {
        eprintln!("warning: could not drop the benchmark database: {error:#}");
    }
    drop(replicated);
    let rows = measured?;
    let growth = growth?;
    let mut settings = settings;
    settings.machine_after = Some(crate::machine::Load::now());
    let results = Results {
        rows,
        growth,
        settings,
    };
    std::fs::create_dir_all(&out_dir)?;
    let markdown = out_dir.join("BENCHMARKS.md");
    if bench.args.encryption_only {
        crate::report::replace_encryption(&results, &markdown)?;
        eprintln!("updated the encryption section of {}", markdown.display());
        return Ok(());
    }
    if bench.args.replica_acks_only {
        crate::report::replace_replica_acks(&results, &markdown)?;
        eprintln!(
            "updated the replica-acknowledgement section of {}",
            markdown.display()
        );
        return Ok(());
    }
    if bench.args.growth_only {
        crate::report::replace_growth(&results, &markdown)?;
        eprintln!("updated the growth section of {}", markdown.display());
        return Ok(());
    }
    crate::report::write(&results, &markdown, &bench.args).await?;
    let png = out_dir.join("benchmarks.png");
    match crate::plot::draw(&results, &png, &bench.args.font) {
        Ok(()) => {}
        Err(error) if bench.args.smoke => eprintln!("warning: no plot: {error:#}"),
        Err(error) => return Err(error),
    }
    eprintln!("wrote {} and {}", markdown.display(), png.display());
    if bench.args.smoke {
        eprintln!("smoke run: every path ran; figures are not meaningful");
    }
    Ok(())
}

/// Opens (and deletes) a bucket on `--nats-url` before any run, so that a
/// missing server, or one older than 2.11, fails the run at once with what
/// to do rather than after the other stores' runs.
async fn probe_nats(args: &RunArgs, run_id: &str) -> anyhow::Result<()> {
    let bucket = format!("idem-bench-{run_id}-probe");
    let store = idempotency_guard::store::nats::NatsStore::connect_with_replicas(
        &args.nats_url,
        &bucket,
        args.nats_replicas,
    )
    .await
    .map_err(|error| {
        anyhow::anyhow!(
            "--stores nats needs NATS 2.11 or later with JetStream at --nats-url {} ({error}); \
             see `idempotency-bench --help` for a private NATS 2.15",
            args.nats_url
        )
    })?;
    eprintln!(
        "NATS at {}: buckets with {} replica(s)",
        args.nats_url,
        store.replicas()
    );
    drop(store);
    delete_nats_buckets(&args.nats_url, |name| name == bucket).await?;
    Ok(())
}

/// The command line that reproduces this run, for the report.
fn command_line(args: &RunArgs) -> String {
    let mut command = String::from("cargo run --release -p idempotency-bench");
    let mut extra = Vec::new();
    if args.smoke {
        extra.push("--smoke".to_owned());
    }
    if args.growth {
        extra.push("--growth".to_owned());
    }
    if args.growth_only {
        extra.push("--growth-only".to_owned());
    }
    if args.no_peer2 && !args.smoke {
        extra.push("--no-peer2".to_owned());
    }
    if args.no_server_metrics {
        extra.push("--no-server-metrics".to_owned());
    }
    if args.encryption_only {
        extra.push("--encryption-only".to_owned());
        if args.encryption_rounds != 3 {
            extra.push(format!("--encryption-rounds {}", args.encryption_rounds));
        }
    }
    if args.replica_acks_only {
        extra.push("--replica-acks-only".to_owned());
        if args.replica_acks_rounds != 3 {
            extra.push(format!(
                "--replica-acks-rounds {}",
                args.replica_acks_rounds
            ));
        }
    }
    if args.stores != ["postgres", "sqlite", "redis", "tiered"] {
        extra.push(format!("--stores {}", args.stores.join(",")));
    }
    if args.stores.iter().any(|store| store == "nats") {
        extra.push(format!("--nats-url {}", args.nats_url));
        if let Some(replicas) = args.nats_replicas {
            extra.push(format!("--nats-replicas {replicas}"));
        }
    }
    if args.concurrency != [1, 16, 64, 256] && !args.smoke {
        let levels: Vec<String> = args.concurrency.iter().map(ToString::to_string).collect();
        extra.push(format!("--concurrency {}", levels.join(",")));
    }
    if args
        .redis_cluster_urls
        .iter()
        .all(|url| url.trim().is_empty())
    {
        extra.push("--redis-cluster-urls ''".to_owned());
    }
    if args.duration_ms != 3000 {
        extra.push(format!("--duration-ms {}", args.duration_ms));
    }
    if args.warmup_ms != 1000 {
        extra.push(format!("--warmup-ms {}", args.warmup_ms));
    }
    if !extra.is_empty() {
        command.push_str(" -- ");
        command.push_str(&extra.join(" "));
    }
    command
}

impl Bench {
    fn stores(&self) -> anyhow::Result<Vec<StoreName>> {
        self.args
            .stores
            .iter()
            .map(|name| StoreName::parse(name))
            .collect()
    }

    fn plan(&self) -> anyhow::Result<Vec<Step>> {
        let stores = self.stores()?;
        let cluster = !self.args.redis_cluster_urls.is_empty();
        // The diagnostic raw claim of completed keys runs at 16 (or the
        // first level when 16 is not measured).
        let diagnostic = if self.args.concurrency.contains(&16) {
            16
        } else {
            self.args.concurrency.first().copied().unwrap_or(1)
        };
        let mut plan = Vec::new();
        for &concurrency in &self.args.concurrency {
            let http = |app, store, scenario| Step::Http {
                app,
                store,
                scenario,
                concurrency,
                large: false,
            };
            let raw = |store, op, scenario| Step::Raw {
                store,
                op,
                scenario,
                concurrency,
            };
            plan.push(http(App::Bare, None, Scenario::Bare));
            for &store in &stores {
                plan.push(raw(store, RawOp::Write, Scenario::RawWrite));
                plan.push(http(App::Guard, Some(store), Scenario::GuardFresh));
                // The hand-written guard a user would write instead, right
                // beside it (the SQL stores' target: ≥ 1.0 × on fresh keys).
                if matches!(store, StoreName::Postgres | StoreName::Sqlite) {
                    plan.push(http(
                        App::Handwritten,
                        Some(store),
                        Scenario::HandwrittenFresh,
                    ));
                }
                // Encryption at rest, measured on Redis right beside its
                // plain run (the docs' target: < 5 % of fresh keys).
                let sealed = store == StoreName::Redis;
                if sealed {
                    plan.push(http(
                        App::GuardEncrypted,
                        Some(store),
                        Scenario::GuardEncryptedFresh,
                    ));
                }
                plan.push(raw(store, RawOp::Read, Scenario::RawRead));
                plan.push(http(App::Guard, Some(store), Scenario::GuardReplay));
                // The same replays answered from the in-process cache (64 MiB).
                plan.push(http(
                    App::GuardCached,
                    Some(store),
                    Scenario::GuardCachedReplay,
                ));
                if sealed {
                    plan.push(http(
                        App::GuardEncrypted,
                        Some(store),
                        Scenario::GuardEncryptedReplay,
                    ));
                }
                if concurrency == diagnostic {
                    plan.push(raw(store, RawOp::ClaimExisting, Scenario::RawClaimExisting));
                }
            }
            if stores.contains(&StoreName::Redis) {
                plan.push(http(App::Peer, Some(StoreName::Redis), Scenario::PeerFresh));
                plan.push(http(
                    App::Peer,
                    Some(StoreName::Redis),
                    Scenario::PeerReplay,
                ));
                if self.peer2_bin.is_some() {
                    plan.push(http(
                        App::Peer2,
                        Some(StoreName::Redis),
                        Scenario::Peer2Fresh,
                    ));
                    plan.push(http(
                        App::Peer2,
                        Some(StoreName::Redis),
                        Scenario::Peer2Replay,
                    ));
                }
            }
            if stores.contains(&StoreName::Postgres) {
                plan.push(http(
                    App::GuardTx,
                    Some(StoreName::Postgres),
                    Scenario::GuardTxFresh,
                ));
                plan.push(http(
                    App::GuardSingleCommit,
                    Some(StoreName::Postgres),
                    Scenario::GuardSingleCommitFresh,
                ));
            }
            if cluster {
                plan.push(raw(
                    StoreName::RedisCluster,
                    RawOp::Write,
                    Scenario::RawWrite,
                ));
                plan.push(http(
                    App::Guard,
                    Some(StoreName::RedisCluster),
                    Scenario::GuardFresh,
                ));
            }
        }
        let concurrency = self.args.large_body_connections;
        let large = |app, store, scenario| Step::Http {
            app,
            store,
            scenario,
            concurrency,
            large: true,
        };
        plan.push(large(App::Bare, None, Scenario::LargeBare));
        for &store in &stores {
            plan.push(large(App::Guard, Some(store), Scenario::LargeGuard));
        }
        if stores.contains(&StoreName::Redis) {
            plan.push(large(
                App::Peer,
                Some(StoreName::Redis),
                Scenario::LargePeer,
            ));
            if self.peer2_bin.is_some() {
                plan.push(large(
                    App::Peer2,
                    Some(StoreName::Redis),
                    Scenario::LargePeer2,
                ));
            }
        }
        if !self.args.only.is_empty() {
            plan.retain(|step| {
                let (Step::Http { scenario, .. } | Step::Raw { scenario, .. }) = step;
                self.args
                    .only
                    .iter()
                    .any(|only| scenario.label().contains(only.as_str()))
            });
        }
        Ok(plan)
    }

    /// The encryption-only runs: on Redis, at each concurrency level, plain
    /// and sealed servers alternated `encryption_rounds` times, fresh keys
    /// then replays.
    fn encryption_plan(&self) -> Vec<Step> {
        let mut plan = Vec::new();
        for &concurrency in &self.args.concurrency {
            for _ in 0..self.args.encryption_rounds.max(1) {
                for (app, scenario) in [
                    (App::Guard, Scenario::GuardFresh),
                    (App::GuardEncrypted, Scenario::GuardEncryptedFresh),
                    (App::Guard, Scenario::GuardReplay),
                    (App::GuardEncrypted, Scenario::GuardEncryptedReplay),
                ] {
                    plan.push(Step::Http {
                        app,
                        store: Some(StoreName::Redis),
                        scenario,
                        concurrency,
                        large: false,
                    });
                }
            }
        }
        plan
    }

    /// The replica-acknowledgement runs: on the private primary with a
    /// replica, at each concurrency level, fresh keys without and with one
    /// replica's acknowledgement, alternated `replica_acks_rounds` times.
    fn replica_acks_plan(&self) -> Vec<Step> {
        let mut plan = Vec::new();
        for &concurrency in &self.args.concurrency {
            for _ in 0..self.args.replica_acks_rounds.max(1) {
                for (app, scenario) in [
                    (App::Guard, Scenario::GuardFresh),
                    (App::GuardReplicaAcks, Scenario::GuardReplicaAcksFresh),
                ] {
                    plan.push(Step::Http {
                        app,
                        store: Some(StoreName::Redis),
                        scenario,
                        concurrency,
                        large: false,
                    });
                }
            }
        }
        plan
    }

    async fn measure_all(&mut self) -> anyhow::Result<Vec<Row>> {
        let plan = self.plan()?;
        self.measure(plan).await
    }
}
