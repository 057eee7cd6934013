//! The JSON-RPC guard's integration tests (one binary), against the MCP
//! server of the example (the official Rust SDK, `rmcp`) and real stores.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

#[path = "../../examples/mcp-email/email.rs"]
mod email;
mod readme;
mod sdk_clients;
mod sdk_edges;
mod steps;
mod tool_calls;
