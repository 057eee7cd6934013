//! What a run knows of its lease's end, by this process's monotonic clock:
//! the settle step retries a completion only while the lease holds (see
//! `retry.rs`), and the renewals push the end on.
//!
//! The end is a lower bound. A claim (or renewal) sent at `t` sets the
//! lease to end `length` after the store received it, so no earlier than
//! `t + length`; a renewal counts only when its answer came back before
//! the end known so far, since a store may refuse to revive a lease that
//! has ended (the NATS store voids such a renewal without an error).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// The earliest instant the run's lease may end. Kept by the run alone
/// (no allocation) until its renewals start and share it.
#[derive(Debug)]
pub(super) struct LeaseEnd {
    claimed: Instant,
    shared: Option<SharedEnd>,
}

/// The lease's end as the renewals move it on.
#[derive(Debug, Clone)]
pub(super) struct SharedEnd(Arc<Mutex<Instant>>);

impl LeaseEnd {
    /// The end of a lease of `length` claimed by a request sent at `sent`.
    pub(super) fn claimed(sent: Instant, length: Duration) -> Self {
        Self {
            claimed: sent + length,
            shared: None,
        }
    }

    /// The end, shared with the renewals that move it on.
    pub(super) fn share(&mut self) -> SharedEnd {
        let claimed = self.claimed;
        self.shared
            .get_or_insert_with(|| SharedEnd(Arc::new(Mutex::new(claimed))))
            .clone()
    }

    /// How much of the lease is known to be left at `now`.
    pub(super) fn left(&self, now: Instant) -> Duration {
        let end = match &self.shared {
            Some(shared) => *shared.0.lock().unwrap_or_else(PoisonError::into_inner),
            None => self.claimed,
        };
        end.saturating_duration_since(now)
    }
}

impl SharedEnd {
    /// A renewal to `length`, sent at `sent`, was answered at `answered`:
    /// the end moves on when the answer came before the end known so far.
    pub(super) fn renewed(&self, sent: Instant, answered: Instant, length: Duration) {
        let mut end = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if answered < *end {
            *end = (*end).max(sent + length);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_claim_holds_its_lease_from_when_it_was_sent() {
        let sent = Instant::now();
        let end = LeaseEnd::claimed(sent, 60 * S);
        assert_eq!(end.left(sent), 60 * S);
        assert_eq!(end.left(sent + 45 * S), 15 * S);
        assert_eq!(end.left(sent + 61 * S), Duration::ZERO);
    }

    #[test]
    fn a_renewal_answered_in_time_extends_the_lease_from_when_it_was_sent() {
        let claimed = Instant::now();
        let mut end = LeaseEnd::claimed(claimed, 3 * S);
        let renewals = end.share();
        assert_eq!(end.left(claimed), 3 * S, "sharing changes nothing");
        renewals.renewed(claimed + S, claimed + S + S / 2, 3 * S);
        assert_eq!(end.left(claimed), 4 * S);
        // An older renewal answered late never shortens it.
        renewals.renewed(claimed + S / 2, claimed + 2 * S, 3 * S);
        assert_eq!(end.left(claimed), 4 * S);
        // Shared again (renewals started twice): the same end.
        end.share().renewed(claimed + 2 * S, claimed + 2 * S, 3 * S);
        assert_eq!(end.left(claimed), 5 * S);
    }

    #[test]
    fn a_renewal_answered_after_the_known_end_counts_for_nothing() {
        let claimed = Instant::now();
        let mut end = LeaseEnd::claimed(claimed, 3 * S);
        let renewals = end.share();
        // Sent in time, but answered after the end: the store may have
        // stamped it after the lease ended, and voided it.
        renewals.renewed(claimed + 2 * S, claimed + 3 * S, 3 * S);
        assert_eq!(end.left(claimed), 3 * S);
        renewals.renewed(claimed + 4 * S, claimed + 4 * S, 3 * S);
        assert_eq!(end.left(claimed + 3 * S), Duration::ZERO);
    }
}
