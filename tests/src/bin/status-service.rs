//! `idempotency-service` (`service/src/main.rs`), built as a binary of this
//! crate so end-to-end tests can start it as a real process.

#[path = "../../../service/src/main.rs"]
mod service;

fn main() -> anyhow::Result<()> {
    service::main()
}
