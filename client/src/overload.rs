//! The overload limiter: gRPC's retry throttling, fed only by the answers
//! that say the server is overloaded (a 429, a 5xx with `Retry-After`), as
//! the AWS SDKs' adaptive mode reacts only to throttling answers.
//!
//! It holds up to [`MAX`] tokens and starts full; each overload answer
//! takes one, each other answer gives back [`RATIO`] of one (a lost answer
//! gives nothing and takes nothing). While it holds half of [`MAX`] or
//! less, the client is in overload: no retry after an overload answer, and
//! no retry from the floor of retries per second (the budget's share
//! still serves lost answers and server errors). So a server shedding
//! more than one answer in eleven gets no retries from this client beyond
//! the first few, and a single 429 is still retried.

use crate::signal::Signal;

/// Milli-tokens per token: a ratio of 0.1 adds up exactly.
const TOKEN: u32 = 1000;
/// gRPC's `maxTokens` of its example service config: ten.
const MAX: u32 = 10 * TOKEN;
/// gRPC's `tokenRatio` of its example service config: 0.1.
const RATIO: u32 = TOKEN / 10;

/// The limiter of one budget.
#[derive(Debug)]
pub(crate) struct OverloadLimiter {
    tokens: u32,
}

impl OverloadLimiter {
    /// A full limiter: a fresh client is not in overload.
    pub(crate) fn new() -> Self {
        Self { tokens: MAX }
    }

    /// Counts what an attempt got.
    pub(crate) fn observe(&mut self, signal: Signal) {
        match signal {
            Signal::Overload => self.tokens = self.tokens.saturating_sub(TOKEN),
            Signal::Answered | Signal::ServerError => {
                self.tokens = (self.tokens + RATIO).min(MAX);
            }
            // A blip says nothing about load.
            Signal::LostAnswer => {}
        }
    }

    /// Whether the server is overloaded, as this client has seen it.
    pub(crate) fn overloaded(&self) -> bool {
        self.tokens <= MAX / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_overload_answers_in_a_row_make_an_overload() {
        let mut limiter = OverloadLimiter::new();
        for _ in 0..4 {
            limiter.observe(Signal::Overload);
            assert!(!limiter.overloaded());
        }
        limiter.observe(Signal::Overload);
        assert!(limiter.overloaded());
        // Ten answers give one token back: out of it again.
        for _ in 0..10 {
            limiter.observe(Signal::Answered);
        }
        assert!(!limiter.overloaded());
    }

    #[test]
    fn lost_answers_and_server_errors_never_make_an_overload() {
        let mut limiter = OverloadLimiter::new();
        for _ in 0..1000 {
            limiter.observe(Signal::LostAnswer);
            limiter.observe(Signal::ServerError);
        }
        assert!(!limiter.overloaded());
    }

    #[test]
    fn one_overload_answer_in_two_keeps_the_client_in_overload() {
        let mut limiter = OverloadLimiter::new();
        let mut overloaded = 0;
        for n in 0..1000 {
            limiter.observe(if n % 2 == 0 {
                Signal::Overload
            } else {
                Signal::Answered
            });
            overloaded += u32::from(limiter.overloaded());
        }
        assert!(overloaded >= 985, "{overloaded}");
    }
}
