//! A TCP forwarder on loopback that can be cut: a network partition between
//! a client and one server, on demand. It can also hold the server's
//! replies back for a while (a slow network, a reply that arrives after its
//! sender stopped waiting).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

/// Forwards connections from [`Partition::address`] to a target until cut.
pub struct Partition {
    /// Where clients connect instead of the target.
    pub address: SocketAddr,
    cut: Arc<AtomicBool>,
    reply_delay_ms: Arc<AtomicU64>,
    target: Arc<Mutex<SocketAddr>>,
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
        let reply_delay_ms = Arc::new(AtomicU64::new(0));
        let target = Arc::new(Mutex::new(target));
        let connections: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let accept = tokio::spawn({
            let cut = Arc::clone(&cut);
            let target = Arc::clone(&target);
            let connections = Arc::clone(&connections);
            let reply_delay_ms = Arc::clone(&reply_delay_ms);
            async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    if cut.load(Ordering::SeqCst) {
                        continue; // dropped: the connection is refused
                    }
                    let delay = Arc::clone(&reply_delay_ms);
                    let target = *target.lock().unwrap_or_else(PoisonError::into_inner);
                    let forward = tokio::spawn(async move {
                        if let Ok(outbound) = TcpStream::connect(target).await {
                            forward(inbound, outbound, delay).await;
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
            reply_delay_ms,
            target,
            connections,
            accept,
        }
    }

    /// Sends new connections to `target` from now on (a virtual IP or a
    /// DNS name moved to another server, a proxy that follows a failover);
    /// connections already open stay where they are.
    pub fn redirect(&self, target: SocketAddr) {
        *self.target.lock().unwrap_or_else(PoisonError::into_inner) = target;
    }

    /// Holds every reply from the server back by `delay` before passing it
    /// on (zero: pass replies at once). Requests still go through at once,
    /// so the server acts on them while their replies are late.
    pub fn delay_replies(&self, delay: Duration) {
        let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.reply_delay_ms.store(millis, Ordering::SeqCst);
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

/// Copies both ways; the server's replies wait out the current delay.
async fn forward(inbound: TcpStream, outbound: TcpStream, delay: Arc<AtomicU64>) {
    let (mut client_read, mut client_write) = inbound.into_split();
    let (mut server_read, mut server_write) = outbound.into_split();
    let requests = tokio::io::copy(&mut client_read, &mut server_write);
    let replies = async {
        let mut buffer = vec![0_u8; 64 * 1024];
        loop {
            let read = match server_read.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => read,
            };
            let millis = delay.load(Ordering::SeqCst);
            if millis > 0 {
                tokio::time::sleep(Duration::from_millis(millis)).await;
            }
            if client_write.write_all(&buffer[..read]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = requests => {}
        () = replies => {}
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}
