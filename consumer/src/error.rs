//! The consumers' errors.

/// Why a consumer stopped (a message's own trouble never stops it: it gets
/// a verdict).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// The RabbitMQ connection or channel failed.
    #[cfg(feature = "rabbitmq")]
    #[error("RabbitMQ: {0}")]
    Rabbit(#[from] lapin::Error),
    /// A RabbitMQ publication (a retry, a parked or dead-lettered copy) was
    /// refused by the broker.
    #[error("the broker did not confirm a publication to {0}")]
    NotConfirmed(String),
    /// The NATS connection or JetStream failed.
    #[cfg(feature = "nats")]
    #[error("NATS: {0}")]
    Nats(#[source] Box<dyn std::error::Error + Send + Sync>),
}
