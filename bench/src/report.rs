//! `docs/BENCHMARKS.md`: settings, machine, targets, ratios and every run.
//!
//! The file is rewritten whole on every run except four blocks kept from
//! the file already there: the growth figures, the encryption figures and
//! the replica-acknowledgement figures (when this run did not measure
//! them; they say when they were measured) and the hand-written notes.

use std::fmt::Write as _;
use std::path::Path;

use crate::results::{Results, Row, Scenario};

const GROWTH_BEGIN: &str = "<!-- growth:begin -->";
const GROWTH_END: &str = "<!-- growth:end -->";
const ENCRYPTION_BEGIN: &str = "<!-- encryption:begin -->";
const ENCRYPTION_END: &str = "<!-- encryption:end -->";
const REPLICA_ACKS_BEGIN: &str = "<!-- replica-acks:begin -->";
const REPLICA_ACKS_END: &str = "<!-- replica-acks:end -->";
const NOTES_BEGIN: &str = "<!-- notes:begin (kept by the harness) -->";
const NOTES_END: &str = "<!-- notes:end -->";

/// The stores in the order the report lists them.
const STORES: [&str; 6] = [
    "postgres",
    "sqlite",
    "redis",
    "tiered",
    "redis-cluster",
    "nats",
];

fn find<'a>(
    rows: &'a [Row],
    store: &str,
    scenario: Scenario,
    concurrency: usize,
) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.store == store && r.scenario == scenario && r.concurrency == concurrency)
}

fn ms(us: f64) -> String {
    if us.is_nan() {
        "–".to_owned()
    } else if us < 10_000.0 {
        format!("{:.2}", us / 1000.0)
    } else {
        format!("{:.1}", us / 1000.0)
    }
}

fn rate(per_second: f64) -> String {
    format!("{per_second:.0}")
}

fn ratio(a: Option<&Row>, b: Option<&Row>) -> Option<f64> {
    Some(a?.summary.throughput / b?.summary.throughput)
}

fn show(value: Option<f64>) -> String {
    value.map_or_else(|| "–".to_owned(), |v| format!("{v:.2}"))
}

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "not measured",
    }
}

/// The block between `begin` and `end` in `text`, markers included.
fn block(text: &str, begin: &str, end: &str) -> Option<String> {
    let start = text.find(begin)?;
    let stop = text[start..].find(end)? + start + end.len();
    Some(text[start..stop].to_owned())
}

/// The concurrency of the targets measured "at 16 connections".
fn c16(results: &Results) -> usize {
    if results.settings.concurrency.contains(&16) {
        16
    } else {
        results.settings.concurrency.first().copied().unwrap_or(1)
    }
}

fn targets(results: &Results, out: &mut String) {
    let rows = &results.rows;
    let c = c16(results);
    let one = if results.settings.concurrency.contains(&1) {
        1
    } else {
        c
    };
    let _ = writeln!(out, "| target | measured | verdict |\n|---|---|---|");
    for store in ["postgres", "sqlite"] {
        for (baseline, against) in [
            (Scenario::RawWrite, "raw claim+complete"),
            (Scenario::HandwrittenFresh, "the hand-written guard"),
        ] {
            let r = ratio(
                find(rows, store, Scenario::GuardFresh, c),
                find(rows, store, baseline, c),
            );
            if r.is_none() {
                continue;
            }
            let _ = writeln!(
                out,
                "| {store}: fresh keys at {c} connections ≥ 1.0 × {against} | {} | {} |",
                show(r),
                verdict(r.map(|r| r >= 1.0))
            );
        }
    }
    for store in ["postgres", "sqlite", "redis", "tiered", "nats"] {
        for (scenario, with) in [
            (Scenario::GuardReplay, ""),
            (Scenario::GuardCachedReplay, " (replay cache)"),
        ] {
            let r = ratio(
                find(rows, store, scenario, c),
                find(rows, store, Scenario::RawRead, c),
            );
            if r.is_none() {
                continue;
            }
            let _ = writeln!(
                out,
                "| {store}: replays{with} at {c} connections ≥ 0.9 × raw single read | {} | {} |",
                show(r),
                verdict(r.map(|r| r >= 0.9))
            );
        }
    }
    for c in peer_levels(results) {
        let ours = find(rows, "redis", Scenario::GuardFresh, c);
        let peer = faster_peer(rows, false, c);
        let r = ratio(ours, peer);
        let _ = writeln!(
            out,
            "| Redis fresh keys at {c} connections ≥ 1.3 × the faster peer{} | {} | {} |",
            which(peer),
            show(r),
            verdict(r.map(|r| r >= 1.3))
        );
        if let (Some(ours), Some(peer)) = (ours, peer) {
            let _ = writeln!(
                out,
                "| Redis fresh keys at {c} connections: p99 ≤ the faster peer's{} | {} ms vs {} ms | {} |",
                which(Some(peer)),
                ms(ours.summary.p99_us),
                ms(peer.summary.p99_us),
                verdict(Some(ours.summary.p99_us <= peer.summary.p99_us))
            );
        }
        let peer = faster_peer(rows, true, c);
        for (scenario, with) in [
            (Scenario::GuardReplay, ""),
            (Scenario::GuardCachedReplay, " (replay cache)"),
        ] {
            let r = ratio(find(rows, "redis", scenario, c), peer);
            if r.is_none() && scenario == Scenario::GuardCachedReplay {
                continue;
            }
            let _ = writeln!(
                out,
                "| Redis replays{with} at {c} connections ≥ 1.5 × the faster peer{} | {} | {} |",
                which(peer),
                show(r),
                verdict(r.map(|r| r >= 1.5))
            );
        }
    }
    let bare = find(rows, "-", Scenario::Bare, one);
    for store in ["postgres", "sqlite", "redis", "tiered", "nats"] {
        let (Some(guard), Some(raw), Some(bare)) = (
            find(rows, store, Scenario::GuardFresh, one),
            find(rows, store, Scenario::RawWrite, one),
            bare,
        ) else {
            continue;
        };
        let added = guard.summary.p50_us - bare.summary.p50_us;
        let budget = raw.summary.p50_us + 100.0;
        let _ = writeln!(
            out,
            "| {store}: added p50 at {one} connection ≤ store round trips ({} ms) + 0.1 ms | +{} ms (budget {} ms) | {} |",
            ms(raw.summary.p50_us),
            ms(added),
            ms(budget),
            verdict(Some(added <= budget))
        );
    }
    let large = results.settings.large_body_connections;
    for row in rows.iter().filter(|r| r.scenario == Scenario::LargeGuard) {
        let mib = row.rss_kib.map(|kib| kib as f64 / 1024.0);
        let _ = writeln!(
            out,
            "| {}: peak RSS with {large} concurrent 1 MiB bodies < 256 MiB | {} MiB | {} |",
            row.store,
            mib.map_or_else(|| "–".to_owned(), |m| format!("{m:.0}")),
            verdict(mib.map(|m| m < 256.0))
        );
    }
}

/// The peer versions: their runs on fresh keys and on replays.
const PEERS: [(&str, Scenario, Scenario); 2] = [
    ("0.3.0", Scenario::PeerFresh, Scenario::PeerReplay),
    ("2.0.0", Scenario::Peer2Fresh, Scenario::Peer2Replay),
];

/// The levels of the peer targets: 16 and 64 connections (or the level of
/// the targets "at 16" when neither was measured).
fn peer_levels(results: &Results) -> Vec<usize> {
    let levels: Vec<usize> = [16, 64]
        .into_iter()
        .filter(|c| results.settings.concurrency.contains(c))
        .collect();
    if levels.is_empty() {
        vec![c16(results)]
    } else {
        levels
    }
}

/// The peer version with the higher throughput at `c` on Redis (fresh keys,
/// or replays).
fn faster_peer(rows: &[Row], replay: bool, c: usize) -> Option<&Row> {
    PEERS
        .iter()
        .filter_map(|&(_, fresh, replays)| {
            find(rows, "redis", if replay { replays } else { fresh }, c)
        })
        .max_by(|a, b| a.summary.throughput.total_cmp(&b.summary.throughput))
}

/// ` (0.3.0)` or ` (2.0.0)`: which peer a row is.
fn which(peer: Option<&Row>) -> String {
    peer.and_then(|row| {
        PEERS
            .iter()
            .find(|(_, fresh, replays)| row.scenario == *fresh || row.scenario == *replays)
    })
    .map_or_else(String::new, |(version, _, _)| format!(" ({version})"))
}

fn ratios(results: &Results, out: &mut String) {
    let rows = &results.rows;
    let _ = writeln!(
        out,
        "| store | connections | guard / raw claim+complete | replay / raw read | replay (cache) / raw read | guard / bare | ours / peer 0.3.0, fresh | ours / peer 2.0.0, fresh | ours / peer 0.3.0, replay | ours / peer 2.0.0, replay |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for store in STORES {
        for &c in &results.settings.concurrency {
            let guard = find(rows, store, Scenario::GuardFresh, c);
            if guard.is_none() {
                continue;
            }
            let replay = find(rows, store, Scenario::GuardReplay, c);
            // The peers have a Redis store only.
            let against = |ours: Option<&Row>, scenario| {
                if store == "redis" {
                    show(ratio(ours, find(rows, "redis", scenario, c)))
                } else {
                    String::new()
                }
            };
            let _ = writeln!(
                out,
                "| {store} | {c} | {} | {} | {} | {} | {} | {} | {} | {} |",
                show(ratio(guard, find(rows, store, Scenario::RawWrite, c))),
                show(ratio(replay, find(rows, store, Scenario::RawRead, c))),
                show(ratio(
                    find(rows, store, Scenario::GuardCachedReplay, c),
                    find(rows, store, Scenario::RawRead, c)
                )),
                show(ratio(guard, find(rows, "-", Scenario::Bare, c))),
                against(guard, Scenario::PeerFresh),
                against(guard, Scenario::Peer2Fresh),
                against(replay, Scenario::PeerReplay),
                against(replay, Scenario::Peer2Replay),
            );
        }
    }
}

/// One cell: `req/s (p50 / p99 ms)`, or `–`.
fn cell(row: Option<&Row>) -> String {
    row.map_or_else(
        || "–".to_owned(),
        |row| {
            format!(
                "{} ({} / {})",
                rate(row.summary.throughput),
                ms(row.summary.p50_us),
                ms(row.summary.p99_us)
            )
        },
    )
}

fn peers(results: &Results, out: &mut String) {
    let rows = &results.rows;
    let _ = writeln!(
        out,
        "| connections | keys | guard req/s (p50 / p99 ms) | peer 0.3.0 | peer 2.0.0 | guard / faster peer |\n|---:|---|---:|---:|---:|---:|"
    );
    for &c in &results.settings.concurrency {
        for (keys, ours, replay) in [
            ("fresh", Scenario::GuardFresh, false),
            ("replays", Scenario::GuardReplay, true),
            ("replays, replay cache", Scenario::GuardCachedReplay, true),
        ] {
            let ours = find(rows, "redis", ours, c);
            let (old, new) = if replay {
                (Scenario::PeerReplay, Scenario::Peer2Replay)
            } else {
                (Scenario::PeerFresh, Scenario::Peer2Fresh)
            };
            let (old, new) = (find(rows, "redis", old, c), find(rows, "redis", new, c));
            if ours.is_none() && old.is_none() && new.is_none() {
                continue;
            }
            let faster = faster_peer(rows, replay, c);
            let _ = writeln!(
                out,
                "| {c} | {keys} | {} | {} | {} | {}{} |",
                cell(ours),
                cell(old),
                cell(new),
                show(ratio(ours, faster)),
                which(faster)
            );
        }
    }
}

/// The runs in the order the tables list them.
fn sorted(results: &Results) -> Vec<&Row> {
    let mut rows: Vec<&Row> = results.rows.iter().collect();
    let store_rank = |store: &str| STORES.iter().position(|s| *s == store).unwrap_or(0);
    rows.sort_by_key(|r| {
        (
            r.store != "-",
            store_rank(r.store),
            r.scenario as u8,
            r.concurrency,
        )
    });
    rows
}

fn batch_sizes(results: &Results, out: &mut String) {
    if !results.settings.server_metrics {
        let _ = writeln!(
            out,
            "Not measured: the guard's servers ran without a metrics recorder (`--no-server-metrics`)."
        );
        return;
    }
    let _ = writeln!(
        out,
        "| store | run | connections | claims per batch | completions per batch |\n|---|---|---:|---:|---:|"
    );
    for row in sorted(results) {
        let Some(sizes) = row.batches else { continue };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            row.store,
            row.scenario.label(),
            row.concurrency,
            crate::batches::show(sizes.claim),
            crate::batches::show(sizes.complete)
        );
    }
}

fn all_runs(results: &Results, out: &mut String) {
    let _ = writeln!(
        out,
        "| store | run | connections | req/s | p50 ms | p99 ms | p99.9 ms | server CPU µs/request | server peak RSS MiB | errors |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for row in sorted(results) {
        let s = &row.summary;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.store,
            row.scenario.label(),
            row.concurrency,
            rate(s.throughput),
            ms(s.p50_us),
            ms(s.p99_us),
            ms(s.p999_us),
            row.cpu_us
                .map_or_else(|| "–".to_owned(), |us| format!("{us:.0}")),
            row.rss_kib.map_or_else(
                || "–".to_owned(),
                |kib| format!("{:.0}", kib as f64 / 1024.0)
            ),
            s.errors
        );
    }
}

fn raw_at_16(results: &Results, out: &mut String) {
    let c = c16(results);
    let _ = writeln!(
        out,
        "| store | claim+complete per second | p50 ms | p99 ms |\n|---|---:|---:|---:|"
    );
    for store in STORES {
        if let Some(row) = find(&results.rows, store, Scenario::RawWrite, c) {
            let _ = writeln!(
                out,
                "| {store} | {} | {} | {} |",
                rate(row.summary.throughput),
                ms(row.summary.p50_us),
                ms(row.summary.p99_us)
            );
        }
    }
}

fn transactional(results: &Results, out: &mut String) {
    let _ = writeln!(
        out,
        "| connections | default mode req/s | transactional req/s | single-commit req/s | transactional / default | single-commit / transactional | single-commit / default | p50 ms default → transactional → single-commit |\n|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    for &c in &results.settings.concurrency {
        let (Some(default), Some(tx)) = (
            find(&results.rows, "postgres", Scenario::GuardFresh, c),
            find(&results.rows, "postgres", Scenario::GuardTxFresh, c),
        ) else {
            continue;
        };
        let single = find(
            &results.rows,
            "postgres",
            Scenario::GuardSingleCommitFresh,
            c,
        );
        let _ = writeln!(
            out,
            "| {c} | {} | {} | {} | {} | {} | {} | {} → {} → {} |",
            rate(default.summary.throughput),
            rate(tx.summary.throughput),
            single.map_or_else(|| "–".to_owned(), |s| rate(s.summary.throughput)),
            show(ratio(Some(tx), Some(default))),
            show(ratio(single, Some(tx))),
            show(ratio(single, Some(default))),
            ms(default.summary.p50_us),
            ms(tx.summary.p50_us),
            single.map_or_else(|| "–".to_owned(), |s| ms(s.summary.p50_us)),
        );
    }
}

/// The median of `values` (NaN when there are none).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The encryption-at-rest block: the guard on Redis with its stored
/// responses sealed against plain, the median of every run of each.
fn encryption(results: &Results, date: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{ENCRYPTION_BEGIN}");
    let rounds = results
        .rows
        .iter()
        .filter(|r| r.scenario == Scenario::GuardEncryptedFresh)
        .filter(|r| Some(&r.concurrency) == results.settings.concurrency.first())
        .count();
    let _ = writeln!(
        out,
        "Measured {date} with `{}`: the guard on Redis, fresh keys and replays, plain (`RedisStore`) and sealed (`EncryptedStore<RedisStore>`: headers and body sealed with AES-256-GCM on completion, opened on every replay), alternated, {rounds} run(s) of each; the median of each is shown. Load before the run {}, after it {}. Target: sealing costs under 5 % of fresh-key throughput.\n",
        results.settings.command,
        results.settings.machine_before,
        results
            .settings
            .machine_after
            .map_or_else(|| "?".to_owned(), |l| l.to_string()),
    );
    let _ = writeln!(
        out,
        "| connections | run | plain req/s | sealed req/s | throughput cost | plain CPU µs/req | sealed CPU µs/req | p50 ms plain → sealed | p99 ms plain → sealed | verdict |\n|---:|---|---:|---:|---:|---:|---:|---|---|---|"
    );
    let pick = |scenario: Scenario, c: usize, f: &dyn Fn(&Row) -> Option<f64>| {
        median(
            results
                .rows
                .iter()
                .filter(|r| r.store == "redis" && r.scenario == scenario && r.concurrency == c)
                .filter_map(f)
                .collect(),
        )
    };
    for &c in &results.settings.concurrency {
        for (run, plain, sealed) in [
            (
                "fresh keys",
                Scenario::GuardFresh,
                Scenario::GuardEncryptedFresh,
            ),
            (
                "replays",
                Scenario::GuardReplay,
                Scenario::GuardEncryptedReplay,
            ),
        ] {
            let throughput = |s| pick(s, c, &|r: &Row| Some(r.summary.throughput));
            let (a, b) = (throughput(plain), throughput(sealed));
            if a.is_nan() || b.is_nan() {
                continue;
            }
            let cpu = |s| pick(s, c, &|r: &Row| r.cpu_us);
            let p50 = |s| pick(s, c, &|r: &Row| Some(r.summary.p50_us));
            let p99 = |s| pick(s, c, &|r: &Row| Some(r.summary.p99_us));
            let cost = 1.0 - b / a;
            let verdict = if run == "fresh keys" {
                verdict(Some(cost < 0.05))
            } else {
                "(no target)"
            };
            let us = |v: f64| {
                if v.is_nan() {
                    "–".to_owned()
                } else {
                    format!("{v:.0}")
                }
            };
            let _ = writeln!(
                out,
                "| {c} | {run} | {} | {} | {:+.1} % | {} | {} | {} → {} | {} → {} | {verdict} |",
                rate(a),
                rate(b),
                cost * 100.0,
                us(cpu(plain)),
                us(cpu(sealed)),
                ms(p50(plain)),
                ms(p50(sealed)),
                ms(p99(plain)),
                ms(p99(sealed)),
            );
        }
    }
    let _ = writeln!(out, "{ENCRYPTION_END}");
    out
}

/// The replica-acknowledgement block: the guard on a Redis primary with one
/// replica, fresh keys without and with `WAIT 1` behind every claim and
/// completion, the median of every run of each.
fn replica_acks(results: &Results, date: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{REPLICA_ACKS_BEGIN}");
    let rounds = results
        .rows
        .iter()
        .filter(|r| r.scenario == Scenario::GuardReplicaAcksFresh)
        .filter(|r| Some(&r.concurrency) == results.settings.concurrency.first())
        .count();
    let _ = writeln!(
        out,
        "Measured {date} with `{}`: the guard on a private Redis 7 primary with one replica (both on this machine, no persistence), fresh keys, without replica acknowledgements (`RedisStore`) and with one (`RedisStore::with_replica_acks(1, 1 s)`: `WAIT 1 1000` pipelined behind every claim and completion script, one per batch), alternated, {rounds} run(s) of each; the median of each is shown. Both runs pay the replication stream; only the `WAIT` differs. Load before the run {}, after it {}. No target: the figure is the price of a claim that survives a failover (docs/GUARANTEES.md, \"Replicated Redis\").\n",
        results.settings.command,
        results.settings.machine_before,
        results
            .settings
            .machine_after
            .map_or_else(|| "?".to_owned(), |l| l.to_string()),
    );
    let _ = writeln!(
        out,
        "| connections | no acks req/s | 1 ack req/s | throughput cost | CPU µs/req no acks → 1 ack | p50 ms no acks → 1 ack | p99 ms no acks → 1 ack | mean claims per batch no acks → 1 ack |\n|---:|---:|---:|---:|---|---|---|---|"
    );
    let pick = |scenario: Scenario, c: usize, f: &dyn Fn(&Row) -> Option<f64>| {
        median(
            results
                .rows
                .iter()
                .filter(|r| r.store == "redis" && r.scenario == scenario && r.concurrency == c)
                .filter_map(f)
                .collect(),
        )
    };
    let (plain, acked) = (Scenario::GuardFresh, Scenario::GuardReplicaAcksFresh);
    let one = |v: f64, digits: usize| {
        if v.is_nan() {
            "–".to_owned()
        } else {
            format!("{v:.digits$}")
        }
    };
    for &c in &results.settings.concurrency {
        let throughput = |s| pick(s, c, &|r: &Row| Some(r.summary.throughput));
        let (a, b) = (throughput(plain), throughput(acked));
        if a.is_nan() || b.is_nan() {
            continue;
        }
        let cpu = |s| pick(s, c, &|r: &Row| r.cpu_us);
        let p50 = |s| pick(s, c, &|r: &Row| Some(r.summary.p50_us));
        let p99 = |s| pick(s, c, &|r: &Row| Some(r.summary.p99_us));
        let batch = |s| pick(s, c, &|r: &Row| r.batches.as_ref().and_then(|b| b.claim));
        let _ = writeln!(
            out,
            "| {c} | {} | {} | {:+.1} % | {} → {} | {} → {} | {} → {} | {} → {} |",
            rate(a),
            rate(b),
            (1.0 - b / a) * 100.0,
            one(cpu(plain), 0),
            one(cpu(acked), 0),
            ms(p50(plain)),
            ms(p50(acked)),
            ms(p99(plain)),
            ms(p99(acked)),
            one(batch(plain), 2),
            one(batch(acked), 2),
        );
    }
    let _ = writeln!(out, "{REPLICA_ACKS_END}");
    out
}

/// Replaces the replica-acknowledgement section of the report at `path`
/// with this run's (adding it before the table of every run when missing).
pub(crate) fn replace_replica_acks(results: &Results, path: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path).map_err(|error| {
        anyhow::anyhow!("{}: {error} (run the full benchmark first)", path.display())
    })?;
    let new = replica_acks(results, &date_of(results));
    let text = match block(&text, REPLICA_ACKS_BEGIN, REPLICA_ACKS_END) {
        Some(old) => text.replacen(&old, new.trim_end(), 1),
        None => {
            let at = text.find("\n## Every run").unwrap_or(text.len());
            format!(
                "{}\n## Replica acknowledgements (Redis, issue 32)\n\n{}{}",
                &text[..at],
                new,
                &text[at..]
            )
        }
    };
    std::fs::write(path, text)?;
    println!("{new}");
    Ok(())
}

/// Replaces the encryption section of the report at `path` with this run's.
pub(crate) fn replace_encryption(results: &Results, path: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path).map_err(|error| {
        anyhow::anyhow!("{}: {error} (run the full benchmark first)", path.display())
    })?;
    let new = encryption(results, &date_of(results));
    let text = match block(&text, ENCRYPTION_BEGIN, ENCRYPTION_END) {
        Some(old) => text.replacen(&old, new.trim_end(), 1),
        // A report written before the section existed: add it before the
        // table of every run.
        None => {
            let at = text.find("\n## Every run").unwrap_or(text.len());
            format!(
                "{}\n## Encryption at rest (Redis)\n\n{}{}",
                &text[..at],
                new,
                &text[at..]
            )
        }
    };
    std::fs::write(path, text)?;
    println!("{new}");
    Ok(())
}

/// Replaces the growth section of the report at `path` with this run's.
pub(crate) fn replace_growth(results: &Results, path: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path).map_err(|error| {
        anyhow::anyhow!("{}: {error} (run the full benchmark first)", path.display())
    })?;
    let old = block(&text, GROWTH_BEGIN, GROWTH_END)
        .ok_or_else(|| anyhow::anyhow!("{} has no growth section", path.display()))?;
    let new = growth(results, &date_of(results));
    std::fs::write(path, text.replacen(&old, new.trim_end(), 1))?;
    println!("{new}");
    Ok(())
}

fn date_of(results: &Results) -> String {
    let date = results
        .settings
        .started
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    date.split('.')
        .next()
        .unwrap_or(&date)
        .trim_end_matches('Z')
        .replace('T', " ")
        + " UTC"
}

fn growth(results: &Results, date: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{GROWTH_BEGIN}");
    let _ = writeln!(
        out,
        "Measured {date} with `{}`. PostgreSQL seeded with completed records (every tenth past its retention), indexes rebuilt, `vacuum analyze`; then the guard on fresh keys at {} connections, once alone and once while `Store::purge` ({} records per statement, back to back, from a second pool) deletes the expired ones.\n",
        results.settings.command,
        results.growth.first().map_or(16, |g| g.concurrency),
        1000
    );
    let _ = writeln!(
        out,
        "| records | seeded in s | table + indexes MiB | req/s alone | p50 / p99 ms alone | req/s while purging | p50 / p99 ms while purging | expired purged | purge time s | purge rate records/s |\n|---:|---:|---:|---:|---|---:|---|---:|---:|---:|"
    );
    for g in &results.growth {
        let purge_rate = if g.purge_seconds > 0.0 {
            format!("{:.0}", g.purged as f64 / g.purge_seconds)
        } else {
            "–".to_owned()
        };
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.0} | {} | {} / {} | {} | {} / {} | {} of {} | {:.1} | {purge_rate} |",
            g.rows,
            g.seed_seconds,
            g.table_mib,
            rate(g.alone.throughput),
            ms(g.alone.p50_us),
            ms(g.alone.p99_us),
            rate(g.purging.throughput),
            ms(g.purging.p50_us),
            ms(g.purging.p99_us),
            g.purged,
            g.expired,
            g.purge_seconds,
        );
    }
    let _ = writeln!(out, "{GROWTH_END}");
    out
}

/// The "How to reproduce" section: the commands of `--help`, as Markdown.
fn reproduce() -> String {
    let mut out = String::from("```text\n");
    out.push_str(
        crate::cli::REPRODUCE
            .strip_prefix("How to reproduce (from the repository's root):\n")
            .unwrap_or(crate::cli::REPRODUCE),
    );
    out.push_str("\n```");
    out
}

/// Writes the report to `path`, keeping its notes (and growth figures, when
/// this run has none).
pub(crate) async fn write(
    results: &Results,
    path: &Path,
    args: &crate::cli::RunArgs,
) -> anyhow::Result<()> {
    let previous = std::fs::read_to_string(path).unwrap_or_default();
    let s = &results.settings;
    let date = date_of(results);
    let machine = crate::machine::describe(Some(&args.postgres_url), &args.redis_url).await;
    let mut out = String::new();
    let _ = writeln!(out, "# Benchmarks\n");
    let _ = writeln!(
        out,
        "<!-- Written by `{}`; only the notes block at the end is kept between runs. -->\n",
        s.command
    );
    if s.smoke {
        let _ = writeln!(
            out,
            "**Smoke run: runs of a fraction of a second; the figures mean nothing.**\n"
        );
    }
    let _ = writeln!(
        out,
        "- **Command:** `{}`; the 1M/10M-record growth runs: `cargo run --release -p idempotency-bench -- --growth` (all) or `-- --growth-only` (just the growth section)",
        s.command
    );
    let _ = writeln!(out, "- **Date:** {date}");
    let _ = writeln!(out, "- **Machine:** {machine}");
    let _ = writeln!(
        out,
        "- **Load:** before the run {}; after it {}. The load generator, the server under test, PostgreSQL and Redis share these cores: compare ratios within one run, not absolute figures across machines.",
        s.machine_before,
        s.machine_after
            .map_or_else(|| "?".to_owned(), |l| l.to_string())
    );
    let _ = writeln!(
        out,
        "- **Each run:** {:.1} s warm-up, then {:.1} s measured; connections {}; a fresh `Idempotency-Key` per request, or (replays) {} completed keys cycled through; `POST /orders` with a {}-byte JSON body; the handler answers 201 with a {}-byte JSON body.",
        s.warmup.as_secs_f64(),
        s.duration.as_secs_f64(),
        s.concurrency
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        s.replay_keys,
        crate::server::REQUEST_BODY.len(),
        crate::server::RESPONSE_BODY.len(),
    );
    let _ = writeln!(
        out,
        "- **Pools:** PostgreSQL {} connections for the server under test and for the raw runs alike (the tiered store's PostgreSQL too); SQLite the store's own 8; Redis one multiplexed connection (ours and each peer's).",
        s.pool_size
    );
    let _ = writeln!(
        out,
        "- **How:** each server under test is this binary re-executed as a child (`serve`), so its peak RSS (`VmHWM`) is its own; the load generator (hyper, keep-alive HTTP/1.1, closed loop) and the raw-store clients run in the parent. *Raw* runs call the guard's own `Store::claim` + `Store::complete` (or `Store::get`) on the same store type with the same pool, with the same concurrency, without HTTP. The *hand-written guard* (PostgreSQL, SQLite) is what a user writes instead of ours, inside the handler (`bench/src/handwritten.rs`): one `insert … on conflict do nothing` claim, the handler, one `update` completion per request, no batching, over the same HTTP stack and a pool like the guard's store's. The peers, on the same Redis: `idempotent` 0.3.0 with its Valkey/Redis store, behind the thin axum middleware in `bench/src/peer.rs` (it ships none), and `idempotent` 2.0.0 with its own axum layer (`IdempotencyLayer`, default settings: 1 MiB body cap, a day's retention) and Valkey/Redis store, a separate binary (`bench/peer2`, built with `--ignore-rust-version`: it declares Rust 1.98){}. *Server CPU µs/request* is the CPU time of all the server's threads (`/proc/<pid>/task/*/schedstat`) over every request it answered, warm-up included.",
        if s.peer2 {
            ""
        } else {
            " (not measured in this run)"
        }
    );
    let _ = writeln!(
        out,
        "- **Metrics:** {}\n",
        if s.server_metrics {
            "the guard's servers run with the guard's Prometheus recorder installed (`telemetry::install_prometheus`, as the service does) and serve it at `/metrics`; the batch sizes below are read from it before and after each run's load."
        } else {
            "the guard's servers ran without a metrics recorder (`--no-server-metrics`): no batch sizes."
        }
    );
    let _ = writeln!(out, "## How to reproduce\n");
    let _ = writeln!(out, "{}\n", reproduce());
    let _ = writeln!(
        out,
        "![Throughput against concurrency per store](benchmarks.png)\n"
    );
    let _ = writeln!(out, "## Targets\n");
    targets(results, &mut out);
    let _ = writeln!(out, "\n## Ratios (throughput, same run)\n");
    ratios(results, &mut out);
    let _ = writeln!(out, "\n## Against both peers (Redis)\n");
    let _ = writeln!(
        out,
        "Both peer versions ship only an in-memory and a Valkey/Redis store (2.0.0 refuses Redis Cluster), so they are measured on Redis alone, in the same run and on the same Redis as our guard's Redis store.\n"
    );
    peers(results, &mut out);
    let _ = writeln!(out, "\n## Store batch sizes (guard)\n");
    let _ = writeln!(
        out,
        "Mean requests per store call over each run's load (warm-up included, seeding excluded), from the histogram `idempotency_store_batch_size{{op}}` (`op` = `claim` | `complete`) on the server's `/metrics`; *n/a* when the guard does not export it.\n"
    );
    batch_sizes(results, &mut out);
    let _ = writeln!(
        out,
        "\n## Claim+complete round trips per second at {} concurrent clients\n",
        c16(results)
    );
    let _ = writeln!(
        out,
        "Raw store calls, no HTTP: the floor no guard can beat.\n"
    );
    raw_at_16(results, &mut out);
    let _ = writeln!(
        out,
        "\n## PostgreSQL: transactional mode against the default mode\n"
    );
    let _ = writeln!(
        out,
        "Transactional mode: the handler takes the guard's `Tx` (which begins the transaction) and writes nothing of its own; the guard completes the record in that transaction and commits.\n"
    );
    transactional(results, &mut out);
    let _ = writeln!(out, "\n## Table growth (PostgreSQL)\n");
    if results.growth.is_empty() {
        match block(&previous, GROWTH_BEGIN, GROWTH_END) {
            Some(kept) => {
                let _ = writeln!(out, "{kept}");
            }
            None => {
                let _ = writeln!(
                    out,
                    "{GROWTH_BEGIN}\nNot measured yet: run `cargo run --release -p idempotency-bench -- --growth-only`.\n{GROWTH_END}"
                );
            }
        }
    } else {
        out.push_str(&growth(results, &date));
    }
    let _ = writeln!(out, "\n## Encryption at rest (Redis)\n");
    let sealed = results
        .rows
        .iter()
        .any(|r| r.scenario == Scenario::GuardEncryptedFresh);
    if sealed {
        out.push_str(&encryption(results, &date));
    } else {
        match block(&previous, ENCRYPTION_BEGIN, ENCRYPTION_END) {
            Some(kept) => {
                let _ = writeln!(out, "{kept}");
            }
            None => {
                let _ = writeln!(
                    out,
                    "{ENCRYPTION_BEGIN}\nNot measured yet: run `cargo run --release -p idempotency-bench -- --encryption-only`.\n{ENCRYPTION_END}"
                );
            }
        }
    }
    let _ = writeln!(out, "\n## Replica acknowledgements (Redis, issue 32)\n");
    match block(&previous, REPLICA_ACKS_BEGIN, REPLICA_ACKS_END) {
        Some(kept) => {
            let _ = writeln!(out, "{kept}");
        }
        None => {
            let _ = writeln!(
                out,
                "{REPLICA_ACKS_BEGIN}\nNot measured yet: run `cargo run --release -p idempotency-bench -- --replica-acks-only --concurrency 1,16,64`.\n{REPLICA_ACKS_END}"
            );
        }
    }
    let _ = writeln!(out, "\n## Every run\n");
    all_runs(results, &mut out);
    let _ = writeln!(out, "\n## Notes\n");
    let notes = block(&previous, NOTES_BEGIN, NOTES_END)
        .unwrap_or_else(|| format!("{NOTES_BEGIN}\n_No notes yet._\n{NOTES_END}"));
    let _ = writeln!(out, "{notes}");
    std::fs::write(path, &out)?;
    // The table, for the terminal too.
    let mut table = String::new();
    targets(results, &mut table);
    table.push('\n');
    ratios(results, &mut table);
    table.push('\n');
    peers(results, &mut table);
    table.push('\n');
    batch_sizes(results, &mut table);
    table.push('\n');
    all_runs(results, &mut table);
    println!("{table}");
    Ok(())
}
