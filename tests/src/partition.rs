//! A TCP forwarder on loopback that can be cut: a network partition between
//! a client and one server, on demand. It can also hold the server's
//! replies back for a while (a slow network, a reply that arrives after its
//! sender stopped waiting).
//!
//! A cut is immediate: nothing read from either side after
//! [`Partition::cut`] returns is passed on. (Aborting the forwarding tasks
//! alone is not: an abort takes effect when the task is next polled, and a
//! loaded runtime can poll it late enough to pass on a write the test made
//! after the cut, such as the primary's copy of a completion to a replica.)

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
    /// Incremented by every cut: a connection passes bytes on only while
    /// it is the generation it was accepted in.
    generation: Arc<AtomicU64>,
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
        let generation = Arc::new(AtomicU64::new(0));
        let reply_delay_ms = Arc::new(AtomicU64::new(0));
        let target = Arc::new(Mutex::new(target));
        let connections: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let accept = tokio::spawn({
            let cut = Arc::clone(&cut);
            let generation = Arc::clone(&generation);
            let target = Arc::clone(&target);
            let connections = Arc::clone(&connections);
            let reply_delay_ms = Arc::clone(&reply_delay_ms);
            async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    // Read before the cut flag: a cut between the two leaves
                    // this connection in an old generation, which passes
                    // nothing on.
                    let accepted_in = generation.load(Ordering::SeqCst);
                    if cut.load(Ordering::SeqCst) {
                        continue; // dropped: the connection is refused
                    }
                    let live = Live {
                        generation: Arc::clone(&generation),
                        accepted_in,
                    };
                    let delay = Arc::clone(&reply_delay_ms);
                    let target = *target.lock().unwrap_or_else(PoisonError::into_inner);
                    let forward = tokio::spawn(async move {
                        if let Ok(outbound) = TcpStream::connect(target).await {
                            forward(inbound, outbound, delay, live).await;
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
            generation,
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
        self.generation.fetch_add(1, Ordering::SeqCst);
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

/// Whether a connection may still pass bytes on: no cut since it was
/// accepted.
struct Live {
    generation: Arc<AtomicU64>,
    accepted_in: u64,
}

impl Live {
    fn get(&self) -> bool {
        self.generation.load(Ordering::SeqCst) == self.accepted_in
    }
}

/// Copies both ways until either side closes or the partition is cut; the
/// server's replies wait out the current delay. Every chunk is checked
/// after it is read and before it is written, so nothing read after a cut
/// goes through.
async fn forward(inbound: TcpStream, outbound: TcpStream, delay: Arc<AtomicU64>, live: Live) {
    let (mut client_read, mut client_write) = inbound.into_split();
    let (mut server_read, mut server_write) = outbound.into_split();
    let requests = async {
        let mut buffer = vec![0_u8; 64 * 1024];
        loop {
            let read = match client_read.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => read,
            };
            if !live.get() || server_write.write_all(&buffer[..read]).await.is_err() {
                return;
            }
        }
    };
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
            if !live.get() || client_write.write_all(&buffer[..read]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = requests => {}
        () = replies => {}
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}
