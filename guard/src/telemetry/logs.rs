//! Logs a person and a log shipper can both read, the same in every binary
//! of the project (the service, the gateway, the examples): `LOG_FORMAT`
//! chooses plain text (one line per event) or JSON lines; text is coloured
//! only when it goes to a terminal and `NO_COLOR` is unset, so a log file
//! holds no escape codes.
//!
//! ```no_run
//! use idempotency_guard::telemetry::logs::{LogFormat, fmt_layer};
//! use tracing_subscriber::layer::SubscriberExt as _;
//! use tracing_subscriber::util::SubscriberInitExt as _;
//!
//! let format = LogFormat::from_env(LogFormat::Text).expect("LOG_FORMAT is text or json");
//! tracing_subscriber::registry()
//!     .with(tracing_subscriber::EnvFilter::new("info"))
//!     .with(fmt_layer(format))
//!     .init();
//! ```
//!
//! The fields are the events' own: the guard logs a route and an outcome,
//! the binaries a request id; none logs an idempotency key or a token.

use std::io::IsTerminal as _;

use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

/// The environment variable that chooses the log format.
pub const LOG_FORMAT: &str = "LOG_FORMAT";

/// How log events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One line of text per event (coloured on a terminal).
    Text,
    /// One JSON object per line, for a log shipper.
    Json,
}

/// `LOG_FORMAT` holds something else than `text` or `json`.
#[derive(Debug, thiserror::Error)]
#[error("LOG_FORMAT must be text or json, not {0:?}")]
pub struct LogFormatError(String);

impl std::str::FromStr for LogFormat {
    type Err = LogFormatError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim().to_ascii_lowercase().as_str() {
            "text" | "plain" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            _ => Err(LogFormatError(text.to_owned())),
        }
    }
}

impl LogFormat {
    /// The format `LOG_FORMAT` names, or `default` when it is unset or empty.
    ///
    /// # Errors
    ///
    /// [`LogFormatError`] when `LOG_FORMAT` is neither `text` nor `json`.
    pub fn from_env(default: Self) -> Result<Self, LogFormatError> {
        match std::env::var(LOG_FORMAT) {
            Ok(value) if !value.trim().is_empty() => value.parse(),
            _ => Ok(default),
        }
    }
}

/// Whether text logs on standard output get colours: only on a terminal,
/// and never when `NO_COLOR` is set (<https://no-color.org>).
pub fn colour_wanted() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The formatting layer for `format`, writing to standard output.
pub fn fmt_layer<S>(format: LogFormat) -> Box<dyn Layer<S> + Send + Sync + 'static>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(colour_wanted())
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(false)
            .boxed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_and_others_are_refused_by_name() {
        assert_eq!("json".parse::<LogFormat>().unwrap(), LogFormat::Json);
        assert_eq!(" Text ".parse::<LogFormat>().unwrap(), LogFormat::Text);
        let error = "yaml".parse::<LogFormat>().unwrap_err().to_string();
        assert!(
            error.contains("LOG_FORMAT") && error.contains("yaml"),
            "{error}"
        );
    }
}
