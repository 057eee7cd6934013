//! The JSON-RPC guard's integration tests (one binary).
