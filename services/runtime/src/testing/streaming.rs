//! An HTTP receiver that streams its answers, for tests of outbound calls.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// An HTTP/1.1 receiver on loopback that answers every request 200, writing
/// the answer's head and, a moment later, its body, as a server that streams
/// does; it counts the connections it accepted.
#[derive(Debug, Clone)]
pub struct StreamingReceiver {
    /// `http://127.0.0.1:<port>/hook`
    pub url: String,
    accepted: Arc<AtomicUsize>,
}

impl StreamingReceiver {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the receiver");
        let url = format!("http://{}/hook", listener.local_addr().expect("the receiver's address"));
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut received = Vec::new();
                    while read_request(&mut socket, &mut received).await {
                        if socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n").await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        if socket.write_all(b"ok").await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Self { url, accepted }
    }

    /// How many connections callers opened.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// Reads one whole request (its head, and the body its `content-length`
/// gives), however the caller's writes were split; `false` once the caller
/// closed. What arrived beyond it stays in `received` for the next.
async fn read_request(socket: &mut tokio::net::TcpStream, received: &mut Vec<u8>) -> bool {
    let mut buffer = vec![0; 64 * 1024];
    loop {
        if let Some(end) = received.windows(4).position(|window| window == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&received[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .and_then(|value| value.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if received.len() >= end + 4 + length {
                received.drain(..end + 4 + length);
                return true;
            }
        }
        match socket.read(&mut buffer).await {
            Ok(read) if read > 0 => received.extend_from_slice(&buffer[..read]),
            _ => return false,
        }
    }
}
