//! Typed scopes and keys for tests that build store records by hand.
//!
//! A `NewRecord` borrows its scope and key; these live as long as the test
//! process (leaked, a few bytes each), so a helper can build and return a
//! `NewRecord` from text, as the tests did before the store took typed
//! names.

use idempotency_guard::{IdempotencyKey, Scope};

/// The scope `text`, for the rest of the test process.
///
/// # Panics
///
/// When `text` breaks the scope rule: a test names valid scopes.
pub fn scope(text: &str) -> &'static Scope {
    Box::leak(Box::new(Scope::new(text).expect("a test's scope is valid")))
}

/// The key `text` (as stored, unquoted), for the rest of the test process.
///
/// # Panics
///
/// When `text` breaks the key rule: a test names valid keys.
pub fn key(text: &str) -> &'static IdempotencyKey {
    Box::leak(Box::new(
        IdempotencyKey::from_raw(text).expect("a test's key is valid"),
    ))
}
