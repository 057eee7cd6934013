//! The guard's store batch sizes, read from its server's Prometheus text
//! (`GET /metrics`, served when the child runs with `--metrics`): the
//! histogram `idempotency_store_batch_size{op}` (`op` = `claim` or
//! `complete`), whose `_sum` and `_count` give the mean batch per op. Two
//! scrapes, before and after a run's load, give the mean over that load.
//! Until the guard exports the metric the means are absent ("n/a").

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;

/// The histogram's name.
pub(crate) const METRIC: &str = "idempotency_store_batch_size";

/// The `_sum` and `_count` of the histogram per `op` label at one scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Scrape {
    ops: BTreeMap<String, (f64, f64)>,
}

impl Scrape {
    /// Reads the histogram from Prometheus text (summary or histogram form;
    /// series with other labels are added up per `op`).
    pub(crate) fn parse(text: &str) -> Self {
        let mut ops: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for line in text.lines() {
            let line = line.trim();
            let Some(rest) = line.strip_prefix(METRIC) else {
                continue;
            };
            let (is_sum, rest) = if let Some(rest) = rest.strip_prefix("_sum") {
                (true, rest)
            } else if let Some(rest) = rest.strip_prefix("_count") {
                (false, rest)
            } else {
                continue;
            };
            let (labels, value) = match rest.strip_prefix('{') {
                Some(rest) => match rest.split_once('}') {
                    Some((labels, value)) => (labels, value),
                    None => continue,
                },
                None if rest.starts_with(' ') => ("", rest),
                None => continue,
            };
            let Some(value) = value
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<f64>().ok())
            else {
                continue;
            };
            let op = label(labels, "op").unwrap_or_default();
            let entry = ops.entry(op.to_owned()).or_default();
            if is_sum {
                entry.0 += value;
            } else {
                entry.1 += value;
            }
        }
        Self { ops }
    }

    /// The mean batch of `op` between `before` and this scrape (`None` when
    /// the metric is absent or nothing was batched).
    fn mean_since(&self, before: &Self, op: &str) -> Option<f64> {
        let (sum, count) = *self.ops.get(op)?;
        let (sum_before, count_before) = before.ops.get(op).copied().unwrap_or_default();
        let count = count - count_before;
        (count > 0.0).then(|| (sum - sum_before) / count)
    }
}

/// The value of the label `name` in `a="x",b="y"` (no escapes expected).
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    labels.split(',').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key.trim() == name).then(|| value.trim().trim_matches('"'))
    })
}

/// The mean batch sizes of one run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct BatchSizes {
    /// Mean claims per store call.
    pub(crate) claim: Option<f64>,
    /// Mean completions per store call.
    pub(crate) complete: Option<f64>,
}

impl BatchSizes {
    /// The means between two scrapes.
    pub(crate) fn between(before: &Scrape, after: &Scrape) -> Self {
        Self {
            claim: after.mean_since(before, "claim"),
            complete: after.mean_since(before, "complete"),
        }
    }
}

/// One mean, or `n/a`.
pub(crate) fn show(mean: Option<f64>) -> String {
    mean.map_or_else(|| "n/a".to_owned(), |m| format!("{m:.2}"))
}

impl fmt::Display for BatchSizes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "batch claim {} complete {}",
            show(self.claim),
            show(self.complete)
        )
    }
}

/// Scrapes the server at `address` (its `/metrics`).
pub(crate) async fn scrape(address: SocketAddr) -> anyhow::Result<Scrape> {
    let text = crate::load::get(address, crate::server::METRICS_PATH).await?;
    Ok(Scrape::parse(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn means_come_from_sum_and_count_per_op() {
        let before = Scrape::parse(
            "# TYPE idempotency_store_batch_size summary\n\
             idempotency_store_batch_size{op=\"claim\",quantile=\"0.5\"} 3\n\
             idempotency_store_batch_size_sum{op=\"claim\"} 10\n\
             idempotency_store_batch_size_count{op=\"claim\"} 10\n",
        );
        let after = Scrape::parse(
            "idempotency_store_batch_size_bucket{op=\"claim\",le=\"+Inf\"} 30\n\
             idempotency_store_batch_size_sum{op=\"claim\",store=\"redis\"} 70\n\
             idempotency_store_batch_size_count{op=\"claim\",store=\"redis\"} 30\n\
             idempotency_store_batch_size_sum{store=\"redis\",op=\"complete\"} 12.5\n\
             idempotency_store_batch_size_count{store=\"redis\",op=\"complete\"} 5\n\
             idempotency_store_duration_seconds_sum{operation=\"claim\"} 1\n",
        );
        let sizes = BatchSizes::between(&before, &after);
        assert_eq!(sizes.claim, Some(3.0));
        assert_eq!(sizes.complete, Some(2.5));
        assert_eq!(
            sizes.to_string(),
            "batch claim 3.00 complete 2.50",
            "{sizes:?}"
        );
    }

    #[test]
    fn an_absent_metric_is_not_available() {
        let none = Scrape::parse("idempotency_requests_total{outcome=\"created\"} 4\n");
        let sizes = BatchSizes::between(&none, &none);
        assert_eq!(sizes, BatchSizes::default());
        assert_eq!(sizes.to_string(), "batch claim n/a complete n/a");
    }
}
