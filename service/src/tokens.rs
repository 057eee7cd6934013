//! The one rule the tokens files share (scope tokens and admin tokens):
//! what part of a line is content.
//!
//! `#` starts a comment only at the start of a line or after whitespace,
//! so a token containing `#` (`tokenA-0123456789abcdef#tail`) is taken
//! whole, never cut to its guessable prefix.

/// The content of one tokens-file line: without its comment, trimmed.
///
/// ```
/// use idempotency_service::tokens::content_of;
/// assert_eq!(content_of("tenant-a token-0123456789abcdef  # note"), "tenant-a token-0123456789abcdef");
/// assert_eq!(content_of("tenant-a token-0123456789#abcdef"), "tenant-a token-0123456789#abcdef");
/// assert_eq!(content_of("# a comment"), "");
/// ```
pub fn content_of(line: &str) -> &str {
    let bytes = line.as_bytes();
    let end = bytes
        .iter()
        .enumerate()
        .find(|&(i, &byte)| byte == b'#' && (i == 0 || bytes[i - 1].is_ascii_whitespace()))
        .map_or(line.len(), |(i, _)| i);
    line[..end].trim()
}
