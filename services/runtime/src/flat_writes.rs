//! The server's connections, written one buffer at a time.
//!
//! Over a connection that takes vectored writes, h2 sends a DATA frame of
//! more than 256 bytes from the caller's buffer, beside its own, and must
//! flush that pair before it can buffer the next frame: a gRPC response whose
//! message is a few hundred bytes (a task) then leaves in two writes, the
//! headers and message first and the trailers alone after them. That is a
//! second syscall here and a second wake-up of the client, which cannot
//! finish the call before the trailers arrive. Over a connection without
//! vectored writes h2 copies DATA frames of up to 1 KiB into its own buffer,
//! so such a response leaves in one write (and hyper's HTTP/1.1 flattens a
//! response's head and body the same way).

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
    sync::OwnedSemaphorePermit,
};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// An accepted connection that does not offer vectored writes, holding its
/// place among the listener's connections until it is dropped.
#[derive(Debug)]
pub(crate) struct FlatWrites {
    stream: TcpStream,
    _place: OwnedSemaphorePermit,
}

impl FlatWrites {
    pub(crate) fn new(stream: TcpStream, place: OwnedSemaphorePermit) -> Self {
        Self { stream, _place: place }
    }
}

impl AsyncRead for FlatWrites {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for FlatWrites {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl Connected for FlatWrites {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}
