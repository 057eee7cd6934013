//! The JSON-RPC guard's integration tests (one binary), against the MCP
//! server of the example (the official Rust SDK, `rmcp`) and real stores.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

#[path = "../../examples/mcp-email/email.rs"]
mod email;
mod sdk_clients;
mod tool_calls;
