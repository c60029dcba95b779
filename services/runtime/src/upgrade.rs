//! HTTP/1.1 upgrades (WebSocket) on the shared port.
//!
//! tonic's server speaks HTTP/1.1 and HTTP/2 but completes no upgrade, so
//! the accept loop here looks at how each new connection opens: one that
//! opens with a WebSocket handshake goes to an axum server of the same
//! routes (axum completes upgrades), every other one to tonic.

use std::{io, net::SocketAddr, time::Duration};

use tokio::{
    net::{TcpListener, TcpStream},
    sync::mpsc,
};
use tokio_util::sync::CancellationToken;

use crate::flat_writes::FlatWrites;

/// How long a new connection may take to send its first bytes before it is
/// handed to tonic unexamined.
const FIRST_BYTES: Duration = Duration::from_secs(10);
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
    receiver: mpsc::Receiver<(TcpStream, SocketAddr)>,
    local: Option<SocketAddr>,
}

impl axum::serve::Listener for Upgrades {
    type Io = TcpStream;
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

/// Accepts from `listener` until `shutdown`, sorting the connections.
pub(crate) fn split(listener: TcpListener, shutdown: CancellationToken) -> Split {
    let local = listener.local_addr().ok();
    let (grpc_tx, grpc_rx) = mpsc::channel(256);
    let (upgrade_tx, upgrade_rx) = mpsc::channel(64);
    tokio::spawn(async move {
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
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!(%error, "cannot set TCP_NODELAY");
            }
            let (grpc_tx, upgrade_tx) = (grpc_tx.clone(), upgrade_tx.clone());
            tokio::spawn(async move {
                if opens_with_websocket_handshake(&stream).await {
                    let _ = upgrade_tx.send((stream, peer)).await;
                } else {
                    let _ = grpc_tx.send(Ok(FlatWrites(stream))).await;
                }
            });
        }
    });
    let grpc = tokio_stream::wrappers::ReceiverStream::new(grpc_rx);
    Split { grpc, upgrades: Upgrades { receiver: upgrade_rx, local } }
}

/// Whether the connection's first request is a WebSocket handshake (looked
/// at without consuming it).
async fn opens_with_websocket_handshake(stream: &TcpStream) -> bool {
    let mut head = vec![0; HEAD_BYTES];
    let Ok(Ok(mut read)) = tokio::time::timeout(FIRST_BYTES, stream.peek(&mut head)).await else {
        return false;
    };
    for _ in 0..HEAD_TRIES {
        match classify(&head[..read]) {
            Some(upgrade) => return upgrade,
            None => tokio::time::sleep(HEAD_PAUSE).await,
        }
        read = match stream.peek(&mut head).await {
            Ok(read) => read,
            Err(_) => return false,
        };
    }
    false
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
}
