//! The gateway's integration tests: real processes on 127.0.0.1 (the
//! gateway binary, a Python standard-library backend counting executions
//! in SQLite, the fault-injecting proxy of `idempotency-tests`).

mod files;
mod hostile_clients;
mod hostile_input;
mod lifecycle;
mod mcp;
mod outcomes;
mod pass_through;
mod scope;
mod startup;
mod stores;
mod storm;
mod support;
