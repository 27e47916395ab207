//! A connection's reads take turns with the other tasks of the serving runtime.
//!
//! Every connection is one task on the serving runtime, and that task does the connection's
//! receive work: the socket read, TLS decryption and HTTP/2 framing. An uploader's connection
//! always has bytes waiting (4 MiB blocks, several in flight), so left alone its task reads,
//! decrypts and frames until tokio's cooperative budget runs out — 128 reads of a TLS record,
//! about 2 MiB — before the worker thread picks up anything else; an agent's stat queued on
//! that worker waits the whole stretch. [`FairRead`] ends the stretch sooner: after
//! [`TURN_BYTES`] read since its last turn ended, the next read yields (wakes the task and
//! returns `Pending`, which tokio treats as a yield: the task goes to the back of the run
//! queue), so a busy connection gives the worker up every [`TURN_BYTES`], a few tens of
//! microseconds of work; it pays one task switch per turn (~16 per MiB).
//!
//! A turn is counted in bytes only, across reads that found nothing waiting. On two cores an
//! uploader's socket often runs dry for a moment between TLS records (the uploading client
//! shares the cores), and a turn that ended there would let its task skip the yield nearly
//! always: measured against moto (three alternating pairs of open-loop probe runs), ending
//! turns at such reads lifted stat p99 from 1.52-1.86x to 1.72-2.35x and put p50 from
//! 1.08-1.21x to 1.24-1.38x, worse in every pair (on the local provider two pairs showed no
//! direction either way). The price is that an agent's connection also yields once per
//! [`TURN_BYTES`] it has read over time — one 4 KiB put in ~15 waits behind the tasks already
//! queued — which those same runs include.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Bytes a connection reads before it lets the runtime's other tasks run.
pub const TURN_BYTES: usize = 64 * 1024;

/// A stream whose reads yield to the runtime after every [`TURN_BYTES`] (see the module doc).
pub struct FairRead<S> {
    inner: S,
    /// Bytes read since this connection last yielded; a read that found nothing waiting does
    /// not reset it (see the module doc).
    read_this_turn: usize,
}

impl<S> FairRead<S> {
    pub fn new(inner: S) -> Self {
        FairRead {
            inner,
            read_this_turn: 0,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FairRead<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.read_this_turn >= TURN_BYTES {
            self.read_this_turn = 0;
            // A wake from inside the task's own poll is a yield: tokio polls it again after
            // the tasks already queued.
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = read {
            self.read_this_turn += buf.filled().len() - before;
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FairRead<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Connected for FairRead<TcpStream> {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_connection_that_read_a_turn_yields_before_reading_more() {
        let data = vec![7u8; 3 * TURN_BYTES];
        let mut fair = FairRead::new(&data[..]);
        let mut buf = vec![0u8; TURN_BYTES];
        fair.read_exact(&mut buf).await.unwrap();
        let mut more = [0u8; 1];
        assert!(
            fair.read(&mut more).now_or_never().is_none(),
            "a turn's worth read: the next read yields first"
        );
        assert_eq!(fair.read(&mut more).await.unwrap(), 1, "then it reads on");
    }

    #[tokio::test]
    async fn a_read_that_found_nothing_waiting_does_not_end_the_turn() {
        let (mut peer, conn) = tokio::io::duplex(4 * TURN_BYTES);
        let mut fair = FairRead::new(conn);
        peer.write_all(&vec![3u8; TURN_BYTES - 1]).await.unwrap();
        let mut buf = vec![0u8; TURN_BYTES - 1];
        fair.read_exact(&mut buf).await.unwrap();
        let mut more = [0u8; 2];
        assert!(
            fair.read(&mut more).now_or_never().is_none(),
            "nothing waiting"
        );
        // The socket ran dry for a moment; the bytes read before it still count.
        peer.write_all(&[4, 5, 6]).await.unwrap();
        let mut read = |n| {
            let mut b = vec![0u8; n];
            fair.read(&mut b).now_or_never().map(|r| r.unwrap())
        };
        assert_eq!(read(2), Some(2), "a turn's bytes in all");
        assert_eq!(read(1), None, "so the next read yields");
        assert_eq!(read(1), Some(1), "and then reads on");
    }

    #[tokio::test]
    async fn a_small_request_reads_without_yielding() {
        let data = vec![1u8; 4096];
        let mut fair = FairRead::new(&data[..]);
        let mut all = Vec::new();
        let read = fair.read_to_end(&mut all).now_or_never();
        assert_eq!(read.map(|r| r.unwrap()), Some(4096));
    }

    #[tokio::test]
    async fn every_byte_arrives_in_order_across_turns() {
        let data: Vec<u8> = (0..5 * TURN_BYTES + 17).map(|i| (i % 253) as u8).collect();
        let mut fair = FairRead::new(&data[..]);
        let mut all = Vec::new();
        fair.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, data);
    }
}
