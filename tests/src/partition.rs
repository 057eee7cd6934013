//! A TCP forwarder on loopback that can be cut: a network partition between
//! a client and one server, on demand.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

/// Forwards connections from [`Partition::address`] to a target until cut.
pub struct Partition {
    /// Where clients connect instead of the target.
    pub address: SocketAddr,
    cut: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
}

impl Partition {
    /// Starts forwarding a free loopback port to `target`.
    ///
    /// # Panics
    ///
    /// When no port can be bound.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a free port");
        let address = listener.local_addr().expect("a local address");
        let cut = Arc::new(AtomicBool::new(false));
        let connections: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let accept = tokio::spawn({
            let cut = Arc::clone(&cut);
            let connections = Arc::clone(&connections);
            async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    if cut.load(Ordering::SeqCst) {
                        continue; // dropped: the connection is refused
                    }
                    let forward = tokio::spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(target).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                    connections
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(forward.abort_handle());
                }
            }
        })
        .abort_handle();
        Self {
            address,
            cut,
            connections,
            accept,
        }
    }

    /// Cuts every open connection and refuses new ones until healed.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for connection in self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            connection.abort();
        }
    }

    /// Lets connections through again.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}
