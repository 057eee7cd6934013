//! Webhook receivers.
