//! [`AdbStream`], one ADB stream as `AsyncRead + AsyncWrite`, and
//! [`ReadChunk`] and [`WriteChunk`], for readers and writers that take owned
//! chunks without copying.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use oxadb_engine::{Read, StreamId, StreamStats};
use oxadb_wire::Payload;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::driver::Shared;
use crate::sink::ReadRanges;

/// One ADB stream. Reads return what the peer sent (EOF once it closed the
/// stream); writes queue data for WRTE packets under the stream's credit;
/// shutdown or drop closes the stream (ADB has no half-close).
pub struct AdbStream {
    pub(crate) shared: Arc<Shared>,
    pub(crate) id: StreamId,
}

impl AdbStream {
    pub fn id(&self) -> StreamId {
        self.id
    }

    /// The stream's counters so far.
    pub fn stats(&self) -> Option<StreamStats> {
        self.shared.lock().engine.stream_stats(self.id)
    }

    /// Reads the next received chunk without copying it; `None` at EOF.
    /// Takes `&self` so that one task can read and [`AdbStream::send`] at
    /// once (each direction has its own waker).
    pub async fn read_chunk(&self, max: usize) -> io::Result<Option<Bytes>> {
        std::future::poll_fn(|cx| self.poll_read_chunk(cx, max)).await
    }

    fn poll_read_chunk(&self, cx: &mut Context<'_>, max: usize) -> Poll<io::Result<Option<Bytes>>> {
        let mut state = self.shared.lock();
        match state.engine.read(self.id, max) {
            Ok(Read::Data(chunk)) => {
                self.shared.after_engine_call(&mut state);
                Poll::Ready(Ok(Some(chunk)))
            }
            Ok(Read::Eof) | Err(_) => Poll::Ready(Ok(None)),
            Ok(Read::WouldBlock) => {
                if state.closed.is_some() {
                    return Poll::Ready(Ok(None));
                }
                if let Some(wakers) = state.streams.get_mut(&self.id) {
                    wakers.read = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}

/// A reader that hands out received chunks without copying them; the sync
/// service parses `DATA` frames in place and passes their payloads on.
pub trait ReadChunk: AsyncRead + Unpin {
    /// The next received chunk, at most `max` bytes; `None` at EOF.
    fn read_chunk(
        &mut self,
        max: usize,
    ) -> impl std::future::Future<Output = io::Result<Option<Bytes>>> + Send;
}

impl ReadChunk for AdbStream {
    async fn read_chunk(&mut self, max: usize) -> io::Result<Option<Bytes>> {
        AdbStream::read_chunk(self, max).await
    }
}

/// In-memory pipes (tests) copy what they read into a new chunk.
impl ReadChunk for tokio::io::DuplexStream {
    async fn read_chunk(&mut self, max: usize) -> io::Result<Option<Bytes>> {
        use tokio::io::AsyncReadExt;
        let mut chunk = bytes::BytesMut::with_capacity(max.min(64 * 1024));
        Ok(match self.read_buf(&mut chunk).await? {
            0 => None,
            _ => Some(chunk.freeze()),
        })
    }
}

/// A writer that can take owned chunks without copying them; the sync
/// service uses it so file data read into a buffer goes out as the WRTE
/// payload itself.
pub trait WriteChunk: AsyncWrite + Unpin {
    fn write_chunk(
        &mut self,
        data: Bytes,
    ) -> impl std::future::Future<Output = io::Result<()>> + Send;

    /// Queues a payload that may hold file ranges: as a whole chunk like
    /// [`WriteChunk::write_chunk`], or with `append` merged into packets like
    /// bytes written with `write_all`. The bytes sent are the same either
    /// way as if the ranges had been read and written.
    fn write_payload(
        &mut self,
        data: Payload,
        append: bool,
    ) -> impl std::future::Future<Output = io::Result<()>> + Send;

    /// Whether file ranges given to [`WriteChunk::write_payload`] leave
    /// without being read into memory (a TCP connection whose peer wants no
    /// checksums); otherwise reading the file into buffers costs less.
    fn takes_file_ranges(&self) -> bool {
        false
    }
}

impl WriteChunk for AdbStream {
    async fn write_chunk(&mut self, data: Bytes) -> io::Result<()> {
        self.write_payload(Payload::from(data), false).await
    }

    fn takes_file_ranges(&self) -> bool {
        self.shared.file_ranges && !self.shared.lock().engine.checksums()
    }

    async fn write_payload(&mut self, data: Payload, append: bool) -> io::Result<()> {
        if append {
            return self.append_payload(data).await;
        }
        self.queue_payload(data).await
    }
}

/// In-memory pipes (tests) take chunks by copying them.
impl WriteChunk for tokio::io::DuplexStream {
    async fn write_chunk(&mut self, data: Bytes) -> io::Result<()> {
        self.write_all(&data).await
    }

    async fn write_payload(&mut self, data: Payload, _append: bool) -> io::Result<()> {
        let data = data.read_into_bytes()?;
        self.write_all(&data).await
    }
}

impl AdbStream {
    /// Queues `data` as one WRTE payload without copying it, waiting while
    /// the stream has no credit; `&self`, as [`AdbStream::read_chunk`].
    pub async fn send(&self, data: Bytes) -> io::Result<()> {
        self.queue_payload(Payload::from(data)).await
    }

    /// [`AdbStream::send`] for a payload that may hold file or pipe ranges
    /// (only where [`WriteChunk::takes_file_ranges`] says the writer sends
    /// them itself).
    pub async fn send_payload(&self, data: Payload) -> io::Result<()> {
        self.queue_payload(data).await
    }

    /// Closes the stream once what was queued has been sent (CLSE follows
    /// the data); reads end too.
    pub fn close(&self) {
        let mut state = self.shared.lock();
        state.engine.close(self.id);
        self.shared.after_engine_call(&mut state);
    }

    /// [`WriteChunk::write_payload`] without `append`: the payload whole.
    async fn queue_payload(&self, data: Payload) -> io::Result<()> {
        let mut data = Some(data);
        std::future::poll_fn(|cx| {
            let mut state = self.shared.lock();
            if let Some(error) = &state.closed {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    format!("{}: connection ended: {error}", self.id),
                )));
            }
            if !state.engine.is_writable(self.id) && !state.engine.is_closed(self.id) {
                if let Some(wakers) = state.streams.get_mut(&self.id) {
                    wakers.write = Some(cx.waker().clone());
                }
                return Poll::Pending;
            }
            let chunk = data.take().expect("polled after completion");
            match state.engine.write_payload(self.id, chunk) {
                Ok(()) => {
                    self.shared.after_engine_call(&mut state);
                    Poll::Ready(Ok(()))
                }
                Err(error) => Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, error))),
            }
        })
        .await
    }

    /// [`WriteChunk::write_payload`] with `append`: the payload goes in as
    /// `write_all` would put its bytes, a send buffer's room at a time.
    async fn append_payload(&mut self, mut data: Payload) -> io::Result<()> {
        std::future::poll_fn(|cx| loop {
            if data.is_empty() {
                return Poll::Ready(Ok(()));
            }
            let mut state = self.shared.lock();
            if let Some(error) = &state.closed {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    format!("{}: connection ended: {error}", self.id),
                )));
            }
            match state.engine.append_payload(self.id, &mut data) {
                Ok(0) => {
                    if let Some(wakers) = state.streams.get_mut(&self.id) {
                        wakers.write = Some(cx.waker().clone());
                    }
                    return Poll::Pending;
                }
                Ok(_) => self.shared.after_engine_call(&mut state),
                Err(error) => {
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, error)))
                }
            }
        })
        .await
    }
}

impl AsyncRead for AdbStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        match self.poll_read_chunk(cx, buf.remaining()) {
            Poll::Ready(Ok(Some(chunk))) => {
                buf.put_slice(&chunk);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Ok(None)) => Poll::Ready(Ok(())),
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncWrite for AdbStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut state = self.shared.lock();
        if let Some(error) = &state.closed {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!("{}: connection ended: {error}", self.id),
            )));
        }
        match state.engine.write(self.id, data) {
            Ok(0) if !data.is_empty() => {
                if let Some(wakers) = state.streams.get_mut(&self.id) {
                    wakers.write = Some(cx.waker().clone());
                }
                Poll::Pending
            }
            Ok(n) => {
                self.shared.after_engine_call(&mut state);
                Poll::Ready(Ok(n))
            }
            Err(error) => Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, error))),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Queued data goes out under credit on its own; nothing to wait for.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.close();
        Poll::Ready(Ok(()))
    }
}

impl Drop for AdbStream {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.engine.close(self.id);
        state.streams.remove(&self.id);
        self.shared.after_engine_call(&mut state);
    }
}
