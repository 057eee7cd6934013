//! Request targets and method names on guarded methods: what the gateway
//! matches its routes on must be what the backend routes on.
//!
//! A backend that normalises paths (Express, Werkzeug, Spring) runs
//! `/payments/`, `/payments;v=1`, `/payments/.`, `/payments/../payments`
//! and `/payments%2F` as `/payments`; one that folds method case runs
//! `post` as `POST`. Matched on the raw target, each spelling would pass
//! through unguarded and run once per retry. The gateway therefore
//! refuses, with 400 problems, before any route is matched:
//!
//! - a method that is a guarded method of some route in another case
//!   (`post`, `Post`): `method-not-canonical` (methods are case-sensitive,
//!   RFC 9110 section 9.1; the gateway does not fold them);
//! - on a guarded method, a path that is not in canonical form when the
//!   request carries `Idempotency-Key` or when its normalised form
//!   ([`normalise`]) is a guarded route: `target-not-canonical`. The
//!   canonical form has no empty, `.` or `..` segment, no trailing slash,
//!   no `;` parameters, no backslash, no percent-encoded unreserved
//!   character, slash or backslash (`%2F` and `%5C` are refused, never
//!   decoded), and upper-case hex in every other escape;
//! - on a guarded method, a request that carries `Idempotency-Key` but
//!   whose path is no guarded route: `route-not-guarded` (a misspelled or
//!   missing route would otherwise run unguarded);
//!   `policy.route_not_guarded = "pass"` forwards it instead;
//! - `CONNECT`: 501 `method-not-supported` (the gateway is no tunnel).
//!
//! Nothing is rewritten: a canonical target is forwarded as it came.

/// Why a path is not in canonical form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonCanonical {
    /// `//`: an empty segment.
    EmptySegment,
    /// A `.` or `..` segment.
    DotSegment,
    /// A slash at the end of a path longer than `/`.
    TrailingSlash,
    /// A `;` (matrix or path parameters).
    Parameters,
    /// A backslash, or an escape of `/` or `\` (`%2F`, `%5C`).
    Separator,
    /// An escape of an unreserved character, lower-case hex, or a `%` not
    /// followed by two hex digits.
    Escape,
}

impl NonCanonical {
    /// A sentence for the problem's detail.
    pub fn detail(self) -> &'static str {
        match self {
            Self::EmptySegment => "The path has an empty segment (//).",
            Self::DotSegment => "The path has a . or .. segment.",
            Self::TrailingSlash => "The path ends with a slash.",
            Self::Parameters => "The path has ; parameters.",
            Self::Separator => "The path has a backslash or an encoded slash (%2F, %5C).",
            Self::Escape => {
                "The path percent-encodes an unreserved character, uses lower-case hex, or has a bad escape."
            }
        }
    }
}

fn unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

fn hex(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        _ => None,
    }
}

/// Checks that `path` (without its query) is in canonical form.
///
/// # Errors
///
/// The first [`NonCanonical`] reason found.
pub fn check(path: &str) -> Result<(), NonCanonical> {
    let bytes = path.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b';' => return Err(NonCanonical::Parameters),
            b'\\' => return Err(NonCanonical::Separator),
            b'%' => {
                let (Some(&high), Some(&low)) = (bytes.get(i + 1), bytes.get(i + 2)) else {
                    return Err(NonCanonical::Escape);
                };
                let (Some(h), Some(l)) = (hex(high), hex(low)) else {
                    return Err(NonCanonical::Escape);
                };
                if high.is_ascii_lowercase() || low.is_ascii_lowercase() {
                    return Err(NonCanonical::Escape);
                }
                let decoded = h * 16 + l;
                if matches!(decoded, b'/' | b'\\') {
                    return Err(NonCanonical::Separator);
                }
                if unreserved(decoded) {
                    return Err(NonCanonical::Escape);
                }
                i += 3;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    if path.len() > 1 && path.ends_with('/') {
        return Err(NonCanonical::TrailingSlash);
    }
    for segment in path.split('/').skip(1) {
        match segment {
            "" if path.len() > 1 => return Err(NonCanonical::EmptySegment),
            "." | ".." => return Err(NonCanonical::DotSegment),
            _ => {}
        }
    }
    Ok(())
}

/// The path a lenient backend would route `path` to: escapes of
/// unreserved characters, `/` and `\` decoded, a backslash taken as a
/// slash, `;` parameters dropped, empty and `.` segments removed, `..`
/// resolved, no trailing slash. Only used to ask whether a non-canonical
/// target would reach a guarded route; never forwarded.
pub fn normalise(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let (Some(h), Some(l)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            let byte = h * 16 + l;
            if unreserved(byte) || byte == b'/' || byte == b'\\' {
                decoded.push(if byte == b'\\' { b'/' } else { byte });
            } else {
                decoded.push(b'%');
                decoded.push(bytes[i + 1].to_ascii_uppercase());
                decoded.push(bytes[i + 2].to_ascii_uppercase());
            }
            i += 3;
            continue;
        }
        decoded.push(if bytes[i] == b'\\' { b'/' } else { bytes[i] });
        i += 1;
    }
    let decoded = String::from_utf8_lossy(&decoded);
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        let segment = segment.split(';').next().unwrap_or("");
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            other => segments.push(other),
        }
    }
    let mut normal = String::with_capacity(path.len());
    for segment in &segments {
        normal.push('/');
        normal.push_str(segment);
    }
    if normal.is_empty() {
        normal.push('/');
    }
    normal
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_paths_pass_and_every_other_spelling_is_named() {
        for path in [
            "/",
            "/payments",
            "/orders/42/refunds",
            "/caf%C3%A9",
            "/a-b_c.d~e",
        ] {
            assert_eq!(check(path), Ok(()), "{path}");
        }
        for (path, reason) in [
            ("/payments/", NonCanonical::TrailingSlash),
            ("/payments;v=1", NonCanonical::Parameters),
            ("/payments/.", NonCanonical::DotSegment),
            ("/payments/../payments", NonCanonical::DotSegment),
            ("/payments%2F", NonCanonical::Separator),
            ("/payments%2f", NonCanonical::Escape),
            ("/payments%5C", NonCanonical::Separator),
            ("/payments\\", NonCanonical::Separator),
            ("//payments", NonCanonical::EmptySegment),
            ("/p%61yments", NonCanonical::Escape),
            ("/caf%c3%a9", NonCanonical::Escape),
            ("/payments%", NonCanonical::Escape),
            ("/payments%zz", NonCanonical::Escape),
        ] {
            assert_eq!(check(path), Err(reason), "{path}");
        }
    }

    #[test]
    fn normalising_finds_the_route_a_lenient_backend_would_run() {
        for path in [
            "/payments/",
            "/payments;v=1",
            "/payments/.",
            "/payments/../payments",
            "/payments%2F",
            "/p%61yments",
            "//payments",
            "/x/..//payments/./",
            "/payments\\",
        ] {
            assert_eq!(normalise(path), "/payments", "{path}");
        }
        assert_eq!(normalise("/../.."), "/");
        assert_eq!(normalise("/caf%c3%a9"), "/caf%C3%A9");
    }
}
