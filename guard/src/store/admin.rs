//! What [`AdminStore`](crate::store::AdminStore) trades in: which records a listing returns
//! ([`StateFilter`], [`PageRequest`], [`Page`]) and which a forget may
//! delete ([`ForgetRule`], [`Forgotten`]).
//!
//! The trait itself is declared with the store's other contracts, in
//! `store/mod.rs` (a sub-trait, so the core [`Store`](crate::store::Store)
//! stays small); it is named here too, the path the admin API imports.

use crate::key::{IdempotencyKey, Scope};
use crate::record::{Record, RecordState};
use crate::store::StoreError;

/// The most records one page of [`AdminStore::list`](crate::store::AdminStore::list) holds.
pub const MAX_PAGE: u32 = 1000;

/// Which records [`AdminStore::list`](crate::store::AdminStore::list) returns, by [`RecordState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StateFilter {
    /// Every record not past its retention.
    #[default]
    Any,
    /// Records whose handler is running (live lease).
    InFlight,
    /// Records with a stored response.
    Completed,
    /// Records whose lease lapsed before the handler finished: outcome
    /// unknown, the key answers `outcome-unknown` until it is forgotten or
    /// expires. Transactional-mode records are left out: their lapse means
    /// nothing committed, and the next request takes them over by itself.
    Abandoned,
}

impl StateFilter {
    /// The filter's name in the admin API (`any`, `in_flight`, `completed`,
    /// `abandoned`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Any => "any",
            Self::InFlight => "in_flight",
            Self::Completed => "completed",
            Self::Abandoned => "abandoned",
        }
    }

    /// Whether `record` passes the filter (for stores that filter after
    /// reading). Expired records never pass.
    pub fn accepts(self, record: &Record) -> bool {
        if record.is_expired() {
            return false;
        }
        match self {
            Self::Any => true,
            Self::InFlight => record.state() == RecordState::InFlight,
            Self::Completed => record.state() == RecordState::Completed,
            Self::Abandoned => record.state() == RecordState::Abandoned && !record.transactional,
        }
    }
}

impl std::str::FromStr for StateFilter {
    type Err = UnknownStateFilter;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "any" => Ok(Self::Any),
            "in_flight" => Ok(Self::InFlight),
            "completed" => Ok(Self::Completed),
            "abandoned" => Ok(Self::Abandoned),
            _ => Err(UnknownStateFilter),
        }
    }
}

/// A state filter other than `any`, `in_flight`, `completed`, `abandoned`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown state: expected any, in_flight, completed or abandoned")]
pub struct UnknownStateFilter;

/// Which page of a listing to read: keyset pagination by key, in byte order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRequest<'a> {
    /// Only keys after this one (the previous page's [`Page::next`]).
    pub after: Option<&'a str>,
    /// At most this many records (1 to [`MAX_PAGE`]; stores clamp it).
    pub limit: u32,
}

impl PageRequest<'_> {
    /// The limit, clamped to 1..=[`MAX_PAGE`].
    pub fn clamped_limit(&self) -> u32 {
        self.limit.clamp(1, MAX_PAGE)
    }
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// The records, by key in byte order.
    pub records: Vec<Record>,
    /// The cursor of the next page (the last key of this one), or `None`
    /// when this page is the last.
    pub next: Option<String>,
}

impl Page {
    /// Builds a page from up to `limit + 1` records read in key order: the
    /// extra one only says that a next page exists.
    pub fn from_overfetch(mut records: Vec<Record>, limit: u32) -> Self {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let more = records.len() > limit;
        records.truncate(limit);
        let next = more
            .then(|| records.last().map(|r| r.key.as_str().to_owned()))
            .flatten();
        Self { records, next }
    }
}

/// Which records [`AdminStore::forget`](crate::store::AdminStore::forget) may delete. A live in-flight
/// record is never deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ForgetRule {
    /// Only a completed record (its replay is forgotten; the next request
    /// with the key runs).
    Completed,
    /// Only an abandoned record: in flight, its lease lapsed.
    Abandoned,
    /// A completed or an abandoned record.
    CompletedOrAbandoned,
}

impl ForgetRule {
    /// Whether the rule allows deleting a record in `state`.
    pub fn allows(self, state: RecordState) -> bool {
        matches!(
            (self, state),
            (
                Self::Completed | Self::CompletedOrAbandoned,
                RecordState::Completed
            ) | (
                Self::Abandoned | Self::CompletedOrAbandoned,
                RecordState::Abandoned
            )
        )
    }
}

/// What [`AdminStore::forget`](crate::store::AdminStore::forget) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Forgotten {
    /// The record was deleted; it was in this state.
    Deleted(RecordState),
    /// The record was kept: the rule does not allow its state (a live
    /// in-flight record is always kept).
    Refused(RecordState),
    /// There is no record of that key in that scope.
    Missing,
}

/// Reads the record an admin call names by text (the admin contract takes
/// the scope and key as text): a scope or key that breaks its rule names
/// no record, since no store holds one.
pub(crate) async fn get_named<S: crate::store::Store>(
    store: &S,
    scope: &str,
    key: &str,
) -> Result<Option<Record>, StoreError> {
    match (Scope::try_from(scope), IdempotencyKey::from_raw(key)) {
        (Ok(scope), Ok(key)) => store.get(&scope, &key).await,
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_never_allow_a_live_in_flight_record() {
        for rule in [
            ForgetRule::Completed,
            ForgetRule::Abandoned,
            ForgetRule::CompletedOrAbandoned,
        ] {
            assert!(!rule.allows(RecordState::InFlight), "{rule:?}");
        }
        assert!(ForgetRule::Completed.allows(RecordState::Completed));
        assert!(!ForgetRule::Completed.allows(RecordState::Abandoned));
        assert!(ForgetRule::Abandoned.allows(RecordState::Abandoned));
        assert!(!ForgetRule::Abandoned.allows(RecordState::Completed));
        assert!(ForgetRule::CompletedOrAbandoned.allows(RecordState::Abandoned));
    }

    #[test]
    fn filters_parse_from_their_names() {
        for filter in [
            StateFilter::Any,
            StateFilter::InFlight,
            StateFilter::Completed,
            StateFilter::Abandoned,
        ] {
            assert_eq!(filter.as_str().parse::<StateFilter>(), Ok(filter));
        }
        assert!("stuck".parse::<StateFilter>().is_err());
    }

    #[test]
    fn limits_are_clamped() {
        let page = |limit| PageRequest { after: None, limit };
        assert_eq!(page(0).clamped_limit(), 1);
        assert_eq!(page(50).clamped_limit(), 50);
        assert_eq!(page(u32::MAX).clamped_limit(), MAX_PAGE);
    }
}
