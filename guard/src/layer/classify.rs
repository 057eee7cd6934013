//! What the layer does with the route's answer, decided from the
//! response's head alone: keep it (store it and replay it to retries),
//! release the key (store nothing: a retry runs), or abandon it (store
//! nothing and vouch for nothing: the outcome is unknown). [`classify`] is
//! the one pure function that says so, tested as a truth table; it answers
//! with the engine's own [`Settle`] without payload (`Settle<(), ()>`), and
//! the service fills it in (a kept response whose body then fails is still
//! released there).

use http::StatusCode;
use http::response::Parts;

use super::markers::{FinalResponse, OutcomeUnknown};
use crate::engine::Settle;
use crate::response::is_no_store;

/// Classifies a route's response from its head: `stored_statuses` is the
/// layer's rule of statuses that are stored.
///
/// In order: a response marked [`OutcomeUnknown`] is abandoned; a 400, 413,
/// 415 or 422 not marked [`FinalResponse`] is an extractor's rejection
/// (Stripe's rule: no work was done) and is released; a response with
/// `Cache-Control: no-store`, or whose status the rule does not store, is
/// released (in transactional mode a `no-store` success keeps its writes,
/// everything else released rolls them back); every other response is
/// kept.
pub(crate) fn classify(parts: &Parts, stored_statuses: fn(StatusCode) -> bool) -> Settle<(), ()> {
    if parts.extensions.get::<OutcomeUnknown>().is_some() {
        return Settle::ABANDON;
    }
    if is_rejection_before_work(parts.status) && parts.extensions.get::<FinalResponse>().is_none() {
        return Settle::RELEASE;
    }
    let no_store = is_no_store(&parts.headers);
    if no_store || !stored_statuses(parts.status) {
        return Settle::Release {
            reply: (),
            keep_writes: no_store && parts.status.is_success(),
        };
    }
    Settle::KEEP
}

/// The statuses an extractor rejection answers with (malformed, too large,
/// wrongly typed or invalid body): released unless marked [`FinalResponse`].
fn is_rejection_before_work(status: StatusCode) -> bool {
    matches!(status.as_u16(), 400 | 413 | 415 | 422)
}

#[cfg(test)]
mod tests {
    use http::{Response, header};

    use super::*;
    use crate::response::default_stored_status;

    /// Only 2xx is stored: a stricter rule than the default.
    fn successes_only(status: StatusCode) -> bool {
        status.is_success()
    }

    /// A response head with `status`, the two marks and `Cache-Control`.
    fn head(status: u16, final_mark: bool, unknown: bool, cache_control: Option<&str>) -> Parts {
        let mut response = Response::builder().status(status);
        if let Some(value) = cache_control {
            response = response.header(header::CACHE_CONTROL, value);
        }
        if final_mark {
            response = response.extension(FinalResponse);
        }
        if unknown {
            response = response.extension(OutcomeUnknown);
        }
        response.body(()).unwrap().into_parts().0
    }

    #[test]
    fn truth_table() {
        const NO_STORE: Option<&str> = Some("no-store");
        const PRIVATE: Option<&str> = Some("private, max-age=60");
        let (keep, abandon) = (Settle::KEEP, Settle::ABANDON);
        let release = Settle::RELEASE;
        let release_keeping_writes = Settle::Release {
            reply: (),
            keep_writes: true,
        };
        let default: fn(StatusCode) -> bool = default_stored_status;
        let strict: fn(StatusCode) -> bool = successes_only;
        type Row = (
            u16,
            bool,
            bool,
            Option<&'static str>,
            fn(StatusCode) -> bool,
            Settle<(), ()>,
        );
        #[rustfmt::skip]
        let table: &[Row] = &[
            // status, FinalResponse, OutcomeUnknown, Cache-Control, stored statuses => settle
            (200, false, false, None, default, keep),
            (201, false, false, None, default, keep),
            (204, false, false, PRIVATE, default, keep),
            (302, false, false, None, default, keep),
            (404, false, false, None, default, keep),
            (409, false, false, None, default, keep),
            // Stripe's rule: an extractor's rejection did no work.
            (400, false, false, None, default, release),
            (413, false, false, None, default, release),
            (415, false, false, None, default, release),
            (422, false, false, None, default, release),
            (400, true, false, None, default, keep),
            (413, true, false, None, default, keep),
            (415, true, false, None, default, keep),
            (422, true, false, None, default, keep),
            // The mark keeps a client error only if the rule stores its status.
            (422, true, false, None, strict, release),
            // "Try again" statuses and server errors.
            (408, false, false, None, default, release),
            (425, false, false, None, default, release),
            (429, false, false, None, default, release),
            (500, false, false, None, default, release),
            (502, false, false, None, default, release),
            (503, false, false, None, default, release),
            (500, true, false, None, default, release),
            // The rule decides the rest.
            (201, false, false, None, strict, keep),
            (404, false, false, None, strict, release),
            (302, false, false, None, strict, release),
            // `no-store`: released; only a success keeps its writes.
            (200, false, false, NO_STORE, default, release_keeping_writes),
            (204, false, false, NO_STORE, default, release_keeping_writes),
            (201, false, false, NO_STORE, strict, release_keeping_writes),
            (302, false, false, NO_STORE, default, release),
            (404, false, false, NO_STORE, default, release),
            (500, false, false, NO_STORE, default, release),
            (422, true, false, NO_STORE, default, release),
            (400, false, false, NO_STORE, default, release),
            // OutcomeUnknown wins over everything.
            (200, false, true, None, default, abandon),
            (502, false, true, None, default, abandon),
            (504, false, true, None, strict, abandon),
            (422, false, true, None, default, abandon),
            (422, true, true, None, default, abandon),
            (200, false, true, NO_STORE, default, abandon),
        ];
        for (i, &(status, final_mark, unknown, cache_control, rule, expected)) in
            table.iter().enumerate()
        {
            let got = classify(&head(status, final_mark, unknown, cache_control), rule);
            assert_eq!(got, expected, "row {i}: {status}");
        }
    }
}
