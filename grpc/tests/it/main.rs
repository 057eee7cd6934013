//! The gRPC adapter's integration tests.
