//! [`Accept`]: which forms of answer (JSON, an event stream) the client's
//! `Accept` header allows, and the form an answer takes.

use http::{HeaderMap, header};

/// Which forms of answer the client's `Accept` allows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Accept {
    json: bool,
    sse: bool,
}

impl Accept {
    /// The forms `headers` allow (no `Accept` at all: both).
    pub(crate) fn of(headers: &HeaderMap) -> Self {
        let mut accept = Self {
            json: false,
            sse: false,
        };
        let mut any = false;
        for value in headers.get_all(header::ACCEPT) {
            let Ok(value) = value.to_str() else { continue };
            for range in value.split(',') {
                let media = range.split(';').next().unwrap_or("").trim();
                any = true;
                match media.to_ascii_lowercase().as_str() {
                    "application/json" | "application/*" => accept.json = true,
                    "text/event-stream" | "text/*" => accept.sse = true,
                    "*/*" => {
                        accept.json = true;
                        accept.sse = true;
                    }
                    _ => {}
                }
            }
        }
        if !any {
            return Self {
                json: true,
                sse: true,
            };
        }
        accept
    }

    /// Whether to answer as an event stream, given the form the server chose.
    pub(crate) fn wants_sse(self, server_sent_sse: bool) -> bool {
        match (self.json, self.sse) {
            (true, false) => false,
            (false, true) => true,
            _ => server_sent_sse,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answers_form_follows_accept() {
        let accept = |value: Option<&str>| {
            let mut headers = HeaderMap::new();
            if let Some(value) = value {
                headers.insert(header::ACCEPT, value.parse().unwrap());
            }
            Accept::of(&headers)
        };
        let both = accept(Some("application/json, text/event-stream"));
        assert!(both.wants_sse(true));
        assert!(!both.wants_sse(false));
        assert!(accept(Some("text/event-stream")).wants_sse(false));
        assert!(!accept(Some("application/json")).wants_sse(true));
        assert!(accept(None).wants_sse(true));
        assert!(!accept(Some("*/*;q=0.8")).wants_sse(false));
    }
}
