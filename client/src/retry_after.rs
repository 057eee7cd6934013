//! The `Retry-After` header (RFC 9110, section 10.2.3): a number of
//! seconds, or an HTTP date.

use std::time::{Duration, SystemTime};

/// How long `Retry-After: value` asks to wait, seen at `now`; `None` when
/// the value is neither a number of seconds nor an HTTP date. A date in
/// the past means no wait.
pub(crate) fn parse(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Too many digits for a u64 is still "a very long time".
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The wait a response's `Retry-After` header asks for, if it has one that
/// parses.
pub(crate) fn of(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get(http::header::RETRY_AFTER)?.to_str().ok()?;
    parse(value, SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_and_dates_parse() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        let cases: &[(&str, Option<Duration>)] = &[
            ("0", Some(Duration::ZERO)),
            ("120", Some(Duration::from_secs(120))),
            (" 3 ", Some(Duration::from_secs(3))),
            (
                "99999999999999999999999",
                Some(Duration::from_secs(u64::MAX)),
            ),
            // IMF-fixdate, and the two obsolete forms RFC 9110 still accepts.
            (
                "Sun, 06 Nov 1994 08:49:39 GMT",
                Some(Duration::from_secs(2)),
            ),
            (
                "Sunday, 06-Nov-94 08:50:37 GMT",
                Some(Duration::from_secs(60)),
            ),
            ("Sun Nov  6 08:49:47 1994", Some(Duration::from_secs(10))),
            // In the past: no wait.
            ("Sun, 06 Nov 1994 08:00:00 GMT", Some(Duration::ZERO)),
            ("", None),
            ("-1", None),
            ("1.5", None),
            ("soon", None),
        ];
        for (value, expected) in cases {
            assert_eq!(parse(value, now), *expected, "Retry-After: {value:?}");
        }
    }
}
