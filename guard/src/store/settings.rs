//! The checks of [`StoreOptions`] that need no server: which URL each store
//! kind needs and the schemes it takes. Each program names its own settings
//! ([`SettingNames`]: environment variables, TOML keys), so every program's
//! message for the same mistake says the same thing in its own words.

use super::{StoreKind, StoreOptions};

/// What a program calls the three settings behind [`StoreOptions`], for
/// the messages of [`SettingsError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettingNames {
    /// The store kind (`STORE`).
    pub kind: &'static str,
    /// The SQL database URL (`DATABASE_URL`).
    pub database_url: &'static str,
    /// The Redis URL (`REDIS_URL`).
    pub redis_url: &'static str,
    /// The NATS servers (`NATS_URL`).
    pub nats_url: &'static str,
}

impl SettingNames {
    /// The environment variables the service and the examples read:
    /// `STORE`, `DATABASE_URL`, `REDIS_URL`.
    pub const ENVIRONMENT: Self = Self {
        kind: "STORE",
        database_url: "DATABASE_URL",
        redis_url: "REDIS_URL",
        nats_url: "NATS_URL",
    };
}

/// A store setting that cannot work, found before any connection is tried.
/// Its message names the setting to change and what it expects; it never
/// repeats a URL (which may hold a password), only its scheme.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
    /// The Redis or tiered store without a Redis URL.
    #[error(
        "{kind_setting}={kind} needs {redis_setting} (a redis:// URL, or several comma-separated for a cluster)"
    )]
    MissingRedisUrl {
        /// The name of the kind setting.
        kind_setting: &'static str,
        /// The kind asked for (`redis`, `tiered`).
        kind: &'static str,
        /// The name of the Redis URL setting.
        redis_setting: &'static str,
    },
    /// The NATS store without a NATS URL.
    #[error("{kind_setting}=nats needs {nats_setting} (host:port, or several comma-separated)")]
    MissingNatsUrl {
        /// The name of the kind setting.
        kind_setting: &'static str,
        /// The name of the NATS URL setting.
        nats_setting: &'static str,
    },
    /// A Redis URL of another scheme.
    #[error("{setting} must start with redis:// or rediss:// (it starts with {scheme:?})")]
    RedisScheme {
        /// The name of the Redis URL setting.
        setting: &'static str,
        /// What the URL starts with.
        scheme: String,
    },
    /// A database URL of another scheme.
    #[error(
        "{setting} must start with postgres://, postgresql:// or sqlite: (it starts with {scheme:?})"
    )]
    DatabaseScheme {
        /// The name of the database URL setting.
        setting: &'static str,
        /// What the URL starts with.
        scheme: String,
    },
    /// The tiered store over a database that is not PostgreSQL.
    #[error(
        "{kind_setting}=tiered keeps its records in PostgreSQL: {database_setting} must start with postgres://"
    )]
    TieredNeedsPostgres {
        /// The name of the kind setting.
        kind_setting: &'static str,
        /// The name of the database URL setting.
        database_setting: &'static str,
    },
}

/// The scheme of a URL (up to and including `:`), for messages.
fn scheme_of(url: &str) -> String {
    match url.find(':') {
        Some(end) => url[..=end].to_owned(),
        None => url.chars().take(12).collect(),
    }
}

impl StoreOptions<'_> {
    /// Checks what can be checked without a server: the database URL's
    /// scheme, a Redis URL for the kinds that need one, its scheme, and
    /// PostgreSQL under the tiered store. Messages use `names`.
    ///
    /// # Errors
    ///
    /// The first [`SettingsError`] found.
    ///
    /// ```
    /// use idempotency_guard::store::{SettingNames, StoreKind, StoreOptions};
    ///
    /// let mut options = StoreOptions::sql("sqlite://app.db");
    /// options.kind = StoreKind::Redis;
    /// let error = options.check(SettingNames::ENVIRONMENT).unwrap_err();
    /// assert!(error.to_string().starts_with("STORE=redis needs REDIS_URL"));
    /// ```
    pub fn check(&self, names: SettingNames) -> Result<(), SettingsError> {
        if self.kind == StoreKind::Nats {
            // The records are in NATS: no database URL is read.
            return match self.nats.filter(|nats| !nats.url.trim().is_empty()) {
                Some(_) => Ok(()),
                None => Err(SettingsError::MissingNatsUrl {
                    kind_setting: names.kind,
                    nats_setting: names.nats_url,
                }),
            };
        }
        let postgres = self.database_url.starts_with("postgres://")
            || self.database_url.starts_with("postgresql://");
        if !postgres && !self.database_url.starts_with("sqlite:") {
            return Err(SettingsError::DatabaseScheme {
                setting: names.database_url,
                scheme: scheme_of(self.database_url),
            });
        }
        let kind = match self.kind {
            StoreKind::Sql | StoreKind::Nats => return Ok(()),
            StoreKind::Redis => "redis",
            StoreKind::Tiered => "tiered",
        };
        let Some(redis_url) = self.redis_url.filter(|url| !url.trim().is_empty()) else {
            return Err(SettingsError::MissingRedisUrl {
                kind_setting: names.kind,
                kind,
                redis_setting: names.redis_url,
            });
        };
        if let Some(bad) = redis_url
            .split(',')
            .map(str::trim)
            .find(|url| !url.starts_with("redis://") && !url.starts_with("rediss://"))
        {
            return Err(SettingsError::RedisScheme {
                setting: names.redis_url,
                scheme: scheme_of(bad),
            });
        }
        if kind == "tiered" && !postgres {
            return Err(SettingsError::TieredNeedsPostgres {
                kind_setting: names.kind,
                database_setting: names.database_url,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(kind: StoreKind, database_url: &str, redis_url: Option<&str>) -> String {
        let mut options = StoreOptions::sql(database_url);
        options.kind = kind;
        options.redis_url = redis_url;
        match options.check(SettingNames::ENVIRONMENT) {
            Ok(()) => "ok".to_owned(),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn each_mistake_names_its_setting_and_never_the_url() {
        use StoreKind::{Redis, Sql, Tiered};
        let pg = "postgres://user:secret@db/app";
        assert_eq!(checked(Sql, "sqlite://a.db", None), "ok");
        assert_eq!(checked(Sql, pg, None), "ok");
        assert_eq!(checked(Redis, "sqlite:a.db", Some("redis://r")), "ok");
        assert_eq!(checked(Tiered, pg, Some("redis://a,redis://b")), "ok");
        let rows = [
            (
                checked(Sql, "mysql://root:secret@db", None),
                "DATABASE_URL must start with postgres://, postgresql:// or sqlite: (it starts with \"mysql:\")",
            ),
            (checked(Redis, pg, None), "STORE=redis needs REDIS_URL"),
            (
                checked(Tiered, pg, Some(" ")),
                "STORE=tiered needs REDIS_URL",
            ),
            (
                checked(Redis, pg, Some("redis://a, http://user:secret@b")),
                "REDIS_URL must start with redis:// or rediss:// (it starts with \"http:\")",
            ),
            (
                checked(Tiered, "sqlite://a.db", Some("redis://r")),
                "STORE=tiered keeps its records in PostgreSQL: DATABASE_URL must start with postgres://",
            ),
        ];
        for (message, expected) in rows {
            assert!(
                message.starts_with(expected),
                "{message:?} is not {expected:?}"
            );
            assert!(!message.contains("secret"), "a password echoed: {message}");
        }
    }

    #[test]
    fn the_nats_store_needs_a_nats_url_and_no_database() {
        let mut options = StoreOptions::sql("");
        options.kind = StoreKind::Nats;
        assert_eq!(
            options
                .check(SettingNames::ENVIRONMENT)
                .unwrap_err()
                .to_string(),
            "STORE=nats needs NATS_URL (host:port, or several comma-separated)"
        );
        options.nats = Some(super::super::NatsOptions::new(" "));
        assert!(options.check(SettingNames::ENVIRONMENT).is_err());
        options.nats = Some(super::super::NatsOptions::new("a:4222,b:4222"));
        assert_eq!(options.check(SettingNames::ENVIRONMENT), Ok(()));
    }
}
