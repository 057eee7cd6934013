//! How the typed values of the file are read: durations written as
//! seconds, HTTP statuses and methods, and values that parse from text
//! (the store kind, a header name, JSON-RPC key sources).
//!
//! Each is read when the file is, so a bad value is a parse error: one
//! line, with the line and column toml gives the value (see
//! [`Config::from_toml`](super::Config::from_toml)).

use std::fmt::{self, Display};
use std::marker::PhantomData;
use std::str::FromStr;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};
use serde::de::{self, Deserialize, Deserializer, Visitor};

/// A duration written as a number of seconds, an integer (`lease_seconds =
/// 30`) or not (`30.5`); negative, infinite and NaN values are refused.
pub(super) fn seconds<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    struct Seconds;

    impl Visitor<'_> for Seconds {
        type Value = Duration;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a number of seconds")
        }

        fn visit_u64<E: de::Error>(self, value: u64) -> Result<Duration, E> {
            Ok(Duration::from_secs(value))
        }

        fn visit_i64<E: de::Error>(self, value: i64) -> Result<Duration, E> {
            u64::try_from(value)
                .map(Duration::from_secs)
                .map_err(|_| not_a_duration(value))
        }

        fn visit_f64<E: de::Error>(self, value: f64) -> Result<Duration, E> {
            Duration::try_from_secs_f64(value).map_err(|_| not_a_duration(value))
        }
    }

    deserializer.deserialize_f64(Seconds)
}

fn not_a_duration<E: de::Error>(value: impl Display) -> E {
    E::custom(format!("{value} is not a duration (seconds, at least 0)"))
}

/// An HTTP status written as a number (100 to 999).
pub(super) fn status<'de, D: Deserializer<'de>>(deserializer: D) -> Result<StatusCode, D::Error> {
    let code = u16::deserialize(deserializer)?;
    StatusCode::from_u16(code)
        .map_err(|_| de::Error::custom(format!("{code} is not an HTTP status (100 to 999)")))
}

/// A value written as text that its type's [`FromStr`] reads.
pub(super) fn parsed<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: Display,
{
    Parsed::deserialize(deserializer).map(|Parsed(value)| value)
}

/// An optional list of values written as text, each read by its type's
/// [`FromStr`] (an error points at the entry).
pub(super) fn parsed_list<'de, D, T>(deserializer: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: Display,
{
    let list = Option::<Vec<Parsed<T>>>::deserialize(deserializer)?;
    Ok(list.map(|list| list.into_iter().map(|Parsed(value)| value).collect()))
}

/// An optional header name.
pub(super) fn header_name<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<HeaderName>, D::Error> {
    let Some(name) = Option::<String>::deserialize(deserializer)? else {
        return Ok(None);
    };
    HeaderName::try_from(name.as_str())
        .map(Some)
        .map_err(|_| de::Error::custom(format!("{name:?} is not a header name")))
}

/// An optional list of HTTP methods, in any case (`post` is `POST`).
pub(super) fn methods<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Vec<Method>>, D::Error> {
    let list = parsed_list::<D, MethodName>(deserializer)?;
    Ok(list.map(|list| list.into_iter().map(|MethodName(method)| method).collect()))
}

/// An HTTP method as the file writes it, in any case.
struct MethodName(Method);

impl FromStr for MethodName {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        Method::from_bytes(name.to_ascii_uppercase().as_bytes())
            .map(Self)
            .map_err(|_| format!("bad method {name:?}"))
    }
}

/// One value read from text by [`FromStr`], on its own so an error points
/// at it.
struct Parsed<T>(T);

impl<'de, T> Deserialize<'de> for Parsed<T>
where
    T: FromStr,
    T::Err: Display,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(ParsedVisitor(PhantomData))
    }
}

struct ParsedVisitor<T>(PhantomData<T>);

impl<T> Visitor<'_> for ParsedVisitor<T>
where
    T: FromStr,
    T::Err: Display,
{
    type Value = Parsed<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Parsed<T>, E> {
        text.parse().map(Parsed).map_err(E::custom)
    }
}
