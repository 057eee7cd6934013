//! End-to-end tests across crates and real processes: the payments example
//! and the key-status service, on one database.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod compose;
mod consumer_storm;
mod crash;
mod deploy_files;
mod hostile_input;
mod lost_response;
mod resume_crash;
mod retry_client;
mod sealed;
mod startup;
mod storm;
