//! HTTP/1.1 upgrades (WebSocket) on the shared port.
//!
//! tonic's server speaks HTTP/1.1 and HTTP/2 but completes no upgrade, so
//! the accept loop here looks at how each new connection opens: one that
//! opens with a WebSocket handshake goes to an axum server of the same
//! routes (axum completes upgrades), every other one to tonic.
//!
//! It also keeps the listener's connections within a limit, so that idle
//! connections cannot take every file descriptor of the process (its
//! database connections and outbound calls need some too): past the limit
//! new connections are closed as they come. A connection that sends nothing
//! in its first ten seconds is closed: tonic would wait for its first bytes
//! for ever.

use std::{io, net::SocketAddr, sync::Arc, time::Duration};

use tokio::{
    net::{TcpListener, TcpStream},
    sync::{Semaphore, mpsc},
};
use tokio_util::sync::CancellationToken;

use crate::flat_writes::FlatWrites;

/// How long a new connection may take to send its first bytes before it is closed.
const FIRST_BYTES: Duration = Duration::from_secs(10);
/// The connection limit when the process's open-file limit is unknown or unlimited.
const DEFAULT_CONNECTIONS: usize = 16_384;
/// How often, and how far apart, an incomplete request head is looked at again.
const HEAD_TRIES: u32 = 250;
const HEAD_PAUSE: Duration = Duration::from_millis(2);
/// The most of a request head that is looked at.
const HEAD_BYTES: usize = 8 * 1024;

/// The connections of one listener, split by how they open.
#[derive(Debug)]
pub(crate) struct Split {
    /// Everything but WebSocket handshakes, for tonic.
    pub(crate) grpc: tokio_stream::wrappers::ReceiverStream<io::Result<FlatWrites>>,
    /// WebSocket handshakes, for axum.
    pub(crate) upgrades: Upgrades,
}

/// The connections that open with a WebSocket handshake, as an axum listener.
#[derive(Debug)]
pub(crate) struct Upgrades {
    receiver: mpsc::Receiver<(FlatWrites, SocketAddr)>,
    local: Option<SocketAddr>,
}

impl axum::serve::Listener for Upgrades {
    type Io = FlatWrites;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.receiver.recv().await {
            Some(accepted) => accepted,
            // The accept loop stopped (shutdown): nothing more comes.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.local.ok_or_else(|| io::Error::other("the listener has no local address"))
    }
}

/// How many connections a listener holds at once: `configured`, or, when
/// that is 0, three quarters of the process's open-file limit.
pub(crate) fn connection_limit(configured: usize) -> usize {
    if configured > 0 {
        return configured;
    }
    let files = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    files
        .and_then(|files| usize::try_from(files / 4 * 3).ok())
        .filter(|&limit| limit > 0)
        .unwrap_or(DEFAULT_CONNECTIONS)
}

/// Accepts from `listener` until `shutdown`, at most `limit` connections at
/// once, sorting the connections.
pub(crate) fn split(listener: TcpListener, limit: usize, shutdown: CancellationToken) -> Split {
    let local = listener.local_addr().ok();
    let (grpc_tx, grpc_rx) = mpsc::channel(256);
    let (upgrade_tx, upgrade_rx) = mpsc::channel(64);
    let places = Arc::new(Semaphore::new(limit));
    tokio::spawn(async move {
        let mut full = false;
        loop {
            let accepted = tokio::select! {
                () = shutdown.cancelled() => return,
                accepted = listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: pause, then go on.
                    tracing::warn!(%error, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(place) = Arc::clone(&places).try_acquire_owned() else {
                if !full {
                    tracing::warn!(
                        limit,
                        "connection limit reached: new connections are closed until some end \
                        (server.max_connections)"
                    );
                }
                full = true;
                continue;
            };
            full = false;
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!(%error, "cannot set TCP_NODELAY");
            }
            let (grpc_tx, upgrade_tx) = (grpc_tx.clone(), upgrade_tx.clone());
            tokio::spawn(async move {
                match opening(&stream).await {
                    Opening::WebSocket => {
                        let _ = upgrade_tx.send((FlatWrites::new(stream, place), peer)).await;
                    }
                    Opening::Other => {
                        let _ = grpc_tx.send(Ok(FlatWrites::new(stream, place))).await;
                    }
                    Opening::Silent => tracing::debug!(%peer, "closed a connection that sent nothing"),
                }
            });
        }
    });
    let grpc = tokio_stream::wrappers::ReceiverStream::new(grpc_rx);
    Split { grpc, upgrades: Upgrades { receiver: upgrade_rx, local } }
}

/// How a connection opens.
#[derive(Debug, PartialEq, Eq)]
enum Opening {
    /// With a WebSocket handshake.
    WebSocket,
    /// With anything else: HTTP/2, another HTTP/1.1 request.
    Other,
    /// With nothing within [`FIRST_BYTES`], or closed before it said anything.
    Silent,
}

/// How the connection opens (looked at without consuming what it sent).
async fn opening(stream: &TcpStream) -> Opening {
    let mut head = vec![0; HEAD_BYTES];
    let mut read = match tokio::time::timeout(FIRST_BYTES, stream.peek(&mut head)).await {
        Ok(Ok(read)) if read > 0 => read,
        _ => return Opening::Silent,
    };
    for _ in 0..HEAD_TRIES {
        match classify(&head[..read]) {
            Some(true) => return Opening::WebSocket,
            Some(false) => return Opening::Other,
            None => tokio::time::sleep(HEAD_PAUSE).await,
        }
        read = match stream.peek(&mut head).await {
            Ok(read) => read,
            Err(_) => return Opening::Other,
        };
    }
    Opening::Other
}

/// `Some(true)` for a complete WebSocket handshake head, `Some(false)` for
/// anything else, `None` while a `GET` head is incomplete.
fn classify(head: &[u8]) -> Option<bool> {
    if head.is_empty() {
        return Some(false);
    }
    let method = b"GET ";
    let prefix = &head[..head.len().min(method.len())];
    if prefix != &method[..prefix.len()] {
        return Some(false);
    }
    let Some(end) = head.windows(4).position(|window| window == b"\r\n\r\n") else {
        return (head.len() >= HEAD_BYTES).then_some(false);
    };
    let text = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
    let upgrade = text.lines().any(|line| {
        line.split_once(':').is_some_and(|(name, value)| name.trim() == "upgrade" && value.trim() == "websocket")
    });
    Some(upgrade)
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio_stream::StreamExt as _;

    use super::*;

    #[test]
    fn only_a_complete_websocket_handshake_is_an_upgrade() {
        let handshake = b"GET /acp HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: WebSocket\r\n\r\n";
        assert_eq!(classify(handshake), Some(true));
        assert_eq!(classify(&handshake[..20]), None, "an incomplete head waits");
        assert_eq!(classify(b"GE"), None);
        assert_eq!(classify(b"GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n"), Some(false));
        assert_eq!(classify(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), Some(false), "gRPC's HTTP/2 preface");
        assert_eq!(classify(b"POST /a2a/echo HTTP/1.1\r\n"), Some(false));
        assert_eq!(classify(b""), Some(false), "a closed connection");
    }

    async fn listening(limit: usize) -> (Split, SocketAddr, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let shutdown = CancellationToken::new();
        (split(listener, limit, shutdown.clone()), address, shutdown)
    }

    /// Whether the server closed the connection: its read ends, or fails.
    async fn closed(client: &mut TcpStream, within: Duration) -> bool {
        let mut byte = [0; 1];
        matches!(tokio::time::timeout(within, client.read(&mut byte)).await, Ok(Ok(0) | Err(_)))
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_sends_nothing_is_closed() {
        let (_split, address, _shutdown) = listening(8).await;
        let mut silent = TcpStream::connect(address).await.expect("connect");
        assert!(closed(&mut silent, FIRST_BYTES * 2).await, "closed once its first bytes were due");
    }

    #[tokio::test]
    async fn connections_past_the_limit_are_closed_until_one_ends() {
        let (mut split, address, _shutdown) = listening(1).await;
        let mut first = TcpStream::connect(address).await.expect("connect");
        first.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.expect("write");
        let served = split.grpc.next().await.expect("the first connection").expect("accepted");
        let mut second = TcpStream::connect(address).await.expect("connect");
        assert!(closed(&mut second, Duration::from_secs(5)).await, "past the limit");
        assert!(!closed(&mut first, Duration::from_millis(100)).await, "the first is served");

        drop(served);
        let mut third = TcpStream::connect(address).await.expect("connect");
        third.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.expect("write");
        assert!(split.grpc.next().await.is_some(), "a place came free");
    }
}
