//! A private PostgreSQL primary with a streaming hot standby, for the
//! failover tests ([`ReplicatedPostgres`]): the standby's replication
//! connection goes through a [`Partition`] the test can cut, the commit
//! is synchronous or asynchronous ([`Commit`]), and [`ReplicatedPostgres::fail_over`]
//! kills the primary and promotes the standby (`pg_ctl promote`).
//!
//! Both servers run on free ports with their files in temporary
//! directories of their own; they are stopped when the value is dropped
//! and, however the test process ends, by the watchdog. Neither fsyncs:
//! the tests kill processes, never the machine, and what a standby
//! acknowledges to a synchronous primary is what it has written out.

use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection};

use crate::partition::Partition;
use crate::postgres_server::PostgresServer;

/// The standby's `application_name`, the name `synchronous_standby_names`
/// lists.
pub const STANDBY_NAME: &str = "standby1";

/// How long the fixture waits for replication to settle.
const SETTLE: Duration = Duration::from_secs(30);

/// How the primary commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// `synchronous_standby_names = 'standby1'`, `synchronous_commit = on`:
    /// a commit answers once the standby has written it to its WAL.
    Synchronous,
    /// No synchronous standby (PostgreSQL's default): a commit answers once
    /// the primary has it; the standby follows when it can.
    Asynchronous,
}

/// A primary and its streaming standby. Dropped: both stopped, their
/// directories removed.
pub struct ReplicatedPostgres {
    /// The primary (until [`ReplicatedPostgres::fail_over`]).
    pub primary: PostgresServer,
    /// The standby, a primary itself once promoted.
    pub standby: PostgresServer,
    link: Partition,
}

/// Polls `ready` every 50 ms until it holds, for at most [`SETTLE`].
///
/// # Panics
///
/// With `what` when it never does.
async fn wait_until<F, Fut>(what: &str, mut ready: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + SETTLE;
    while !ready().await {
        assert!(
            Instant::now() < deadline,
            "{what} within {} s",
            SETTLE.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One value of `sql` on the server at `url`, on a fresh connection.
async fn query_one<T>(url: &str, sql: &str) -> Result<T, sqlx::Error>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
{
    let mut connection = PgConnection::connect(url).await?;
    let value = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(&mut connection)
        .await;
    let _ = connection.close().await;
    value
}

impl ReplicatedPostgres {
    /// Starts a primary that commits as `commit` says and a standby
    /// streaming from it through a partition, and waits until the
    /// standby streams (and, synchronous, is the primary's synchronous
    /// standby).
    ///
    /// # Panics
    ///
    /// When PostgreSQL's binaries are missing (the message names the
    /// Debian package), a server does not start, or replication does not
    /// come up within 30 s.
    pub async fn start(commit: Commit) -> Self {
        let names = format!("-c synchronous_standby_names={STANDBY_NAME}");
        let mut settings = vec!["-c fsync=off", "-c max_connections=100"];
        if commit == Commit::Synchronous {
            settings.extend([names.as_str(), "-c synchronous_commit=on"]);
        }
        let settings: Vec<String> = settings.into_iter().map(str::to_owned).collect();
        let primary = tokio::task::spawn_blocking(move || {
            let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
            PostgresServer::start_with_settings(&settings)
        })
        .await
        .expect("start the primary");
        let link = Partition::start(primary.address()).await;
        let through = link.address;
        let standby = tokio::task::spawn_blocking(move || {
            PostgresServer::standby_of(
                through,
                STANDBY_NAME,
                &["-c fsync=off", "-c wal_retrieve_retry_interval=100ms"],
            )
        })
        .await
        .expect("start the standby");
        let pair = Self {
            primary,
            standby,
            link,
        };
        let url = pair.primary.url("postgres");
        let wanted = match commit {
            Commit::Synchronous => "sync",
            Commit::Asynchronous => "async",
        };
        let sql = format!(
            "select count(*) from pg_stat_replication \
             where application_name = '{STANDBY_NAME}' and state = 'streaming' \
             and sync_state = '{wanted}'"
        );
        wait_until("the standby streams from the primary", || async {
            query_one::<i64>(&url, &sql).await.is_ok_and(|n| n == 1)
        })
        .await;
        pair
    }

    /// The primary's URL, database `postgres`.
    pub fn primary_url(&self) -> String {
        self.primary.url("postgres")
    }

    /// The standby's URL, database `postgres`.
    pub fn standby_url(&self) -> String {
        self.standby.url("postgres")
    }

    /// Cuts the standby's replication connection (a network partition
    /// between the two): what the primary writes from now on does not
    /// reach the standby until healed.
    pub fn cut_link(&self) {
        self.link.cut();
    }

    /// Lets the standby reach the primary again.
    pub fn heal_link(&self) {
        self.link.heal();
    }

    /// Waits until the standby has replayed every write the primary has
    /// made so far.
    ///
    /// # Panics
    ///
    /// When it has not within 30 s.
    pub async fn wait_replayed(&self) {
        let url = self.primary_url();
        let sql = format!(
            "select coalesce(bool_and(replay_lsn >= pg_current_wal_lsn()), false) \
             from pg_stat_replication where application_name = '{STANDBY_NAME}'"
        );
        wait_until("the standby replays the primary's writes", || async {
            query_one::<bool>(&url, &sql).await.unwrap_or(false)
        })
        .await;
    }

    /// Holds the standby's replay back (`pg_wal_replay_pause()`): it still
    /// receives the primary's WAL, and acknowledges it to a synchronous
    /// primary, but shows none of it to its readers.
    ///
    /// # Panics
    ///
    /// When the standby refuses.
    pub async fn pause_replay(&self) {
        let url = self.standby_url();
        query_one::<String>(&url, "select pg_wal_replay_pause()::text")
            .await
            .expect("pause the standby's replay");
        wait_until("the standby's replay pauses", || async {
            query_one::<String>(&url, "select pg_get_wal_replay_pause_state()")
                .await
                .is_ok_and(|state| state == "paused")
        })
        .await;
    }

    /// The failover: stops the primary at once (`pg_ctl stop -m
    /// immediate`, like a crash), promotes the standby and waits until it
    /// takes writes; returns its URL (database `postgres`).
    ///
    /// # Panics
    ///
    /// When the promotion fails or does not finish within 30 s.
    pub async fn fail_over(&self) -> String {
        self.primary.stop();
        self.standby.promote();
        let url = self.standby_url();
        wait_until("the promoted standby takes writes", || async {
            query_one::<bool>(&url, "select not pg_is_in_recovery()")
                .await
                .unwrap_or(false)
        })
        .await;
        url
    }
}
