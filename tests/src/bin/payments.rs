//! The payments example (`guard/examples/payments.rs`), built as a binary of
//! this crate so end-to-end tests can start it as a real process.

#[path = "../../../guard/examples/payments.rs"]
mod payments;

fn main() -> anyhow::Result<()> {
    payments::main()
}
