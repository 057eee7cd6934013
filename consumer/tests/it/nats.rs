//! The NATS JetStream consumer against a real server.
