//! What the machine is, and how busy it was, for the report.

use std::fmt;

/// The load averages (1, 5 and 15 minutes) at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Load(pub(crate) f64, pub(crate) f64, pub(crate) f64);

impl Load {
    /// Reads `/proc/loadavg`.
    pub(crate) fn now() -> Self {
        let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let mut fields = text
            .split_whitespace()
            .map(|f| f.parse().unwrap_or(f64::NAN));
        Self(
            fields.next().unwrap_or(f64::NAN),
            fields.next().unwrap_or(f64::NAN),
            fields.next().unwrap_or(f64::NAN),
        )
    }
}

impl fmt::Display for Load {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "load average {:.2}, {:.2}, {:.2}",
            self.0, self.1, self.2
        )
    }
}

/// A one-paragraph description of the machine and its servers.
pub(crate) async fn describe(postgres: Option<&str>, redis_url: &str) -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .and_then(|rest| rest.split_once(':'))
        .map_or("unknown CPU", |(_, model)| model.trim())
        .to_owned();
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let memory = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map_or_else(
            || "?".to_owned(),
            |kib| format!("{:.0} GiB", kib / 1024.0 / 1024.0),
        );
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned();
    let rustc = std::process::Command::new("rustc")
        .arg("--version")
        .output()
        .ok()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .unwrap_or_default();
    let pg_version = match postgres {
        Some(pool_url) => postgres_version(pool_url).await.unwrap_or_default(),
        None => String::new(),
    };
    let redis_version = redis_version(redis_url).await.unwrap_or_default();
    format!(
        "{model}, {cores} cores, {memory} RAM, Linux {kernel}; {rustc}; {pg_version}; Redis {redis_version}"
    )
}

async fn postgres_version(url: &str) -> anyhow::Result<String> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await?;
    let row: (String, String, String) = sqlx::query_as(
        "select split_part(version(), ' on ', 1), current_setting('synchronous_commit'), current_setting('shared_buffers')",
    )
    .fetch_one(&pool)
    .await?;
    pool.close().await;
    Ok(format!(
        "{} (synchronous_commit={}, shared_buffers={})",
        row.0, row.1, row.2
    ))
}

async fn redis_version(url: &str) -> anyhow::Result<String> {
    let client = redis::Client::open(url)?;
    let mut connection = client.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut connection)
        .await?;
    Ok(info
        .lines()
        .find_map(|line| line.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned())
}
