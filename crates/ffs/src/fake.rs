//! In-memory bulk endpoints that behave like USB ones, for tests: a read
//! completes when its buffer is full or the host's transfer ends; a write
//! completes when the host takes it. [`FakeUsb::attach_host`] plays a host
//! over them and checks the device's framing (no FunctionFS needed).

use std::collections::VecDeque;
use std::future::poll_fn;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::endpoint::{Buffer, Completion, Endpoint};

#[derive(Default)]
struct State {
    /// Host to device transfers not yet read, and how far into the first.
    host_transfers: VecDeque<Vec<u8>>,
    offset: usize,
    /// Reads the device queued, in order.
    reads: VecDeque<(u64, Vec<u8>)>,
    /// Writes the device queued, in order, not yet taken by the host.
    writes: VecDeque<(u64, Bytes)>,
    max_writes_in_flight: usize,
    finished_out: Vec<Completion>,
    finished_in: Vec<Completion>,
    out_waker: Option<Waker>,
    in_waker: Option<Waker>,
    host_waker: Option<Waker>,
    /// The endpoints were disabled: every transfer fails with this errno.
    failed: Option<i32>,
    /// Reports finished reads in a shuffled order, as AIO may.
    shuffle: Option<StdRng>,
    endpoints_alive: usize,
    transfers_in: usize,
}

impl State {
    /// Moves host data into queued reads, USB style.
    fn pump(&mut self) {
        if let Some(errno) = self.failed {
            for (id, buffer) in self.reads.drain(..) {
                self.finished_out.push(Completion {
                    id,
                    buffer: Buffer::Read(buffer),
                    result: Err(io::Error::from_raw_os_error(errno)),
                });
            }
            for (id, bytes) in self.writes.drain(..) {
                self.finished_in.push(Completion {
                    id,
                    buffer: Buffer::Write(bytes),
                    result: Err(io::Error::from_raw_os_error(errno)),
                });
            }
        }
        let before = self.finished_out.len();
        while !self.reads.is_empty() && !self.host_transfers.is_empty() {
            let (id, mut buffer) = self.reads.pop_front().expect("checked");
            let transfer = self.host_transfers.front().expect("checked");
            let n = (transfer.len() - self.offset).min(buffer.len());
            buffer[..n].copy_from_slice(&transfer[self.offset..self.offset + n]);
            self.offset += n;
            if self.offset == transfer.len() {
                // The host's transfer ended (short packet or ZLP): so does the read.
                self.host_transfers.pop_front();
                self.offset = 0;
            }
            self.finished_out.push(Completion {
                id,
                buffer: Buffer::Read(buffer),
                result: Ok(n),
            });
        }
        if let Some(rng) = &mut self.shuffle {
            self.finished_out[before..].shuffle(rng);
        }
        if !self.finished_out.is_empty() {
            wake(&mut self.out_waker);
        }
        if !self.finished_in.is_empty() {
            wake(&mut self.in_waker);
        }
        if !self.writes.is_empty() || self.failed.is_some() {
            wake(&mut self.host_waker);
        }
    }
}

fn wake(slot: &mut Option<Waker>) {
    if let Some(waker) = slot.take() {
        waker.wake();
    }
}

/// The host's side of a pair of fake endpoints (see [`FakeUsb::endpoints`]).
#[derive(Clone, Default)]
pub struct FakeUsb {
    state: Arc<Mutex<State>>,
}

impl FakeUsb {
    pub fn new() -> FakeUsb {
        FakeUsb::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Finished reads are reported in an order shuffled by `seed`.
    pub fn shuffle_completions(&self, seed: u64) {
        self.lock().shuffle = Some(StdRng::seed_from_u64(seed));
    }

    /// The device's bulk-out and bulk-in endpoints.
    pub fn endpoints(&self) -> (FakeEndpoint, FakeEndpoint) {
        self.lock().endpoints_alive += 2;
        let endpoint = |out, name: &str| FakeEndpoint {
            usb: self.clone(),
            out,
            path: PathBuf::from(format!("fake/{name}")),
        };
        (endpoint(true, "ep1"), endpoint(false, "ep2"))
    }

    /// Endpoints handed out and not dropped yet.
    pub fn endpoints_alive(&self) -> usize {
        self.lock().endpoints_alive
    }

    /// The most bulk-in transfers the device had queued at once.
    pub fn max_writes_in_flight(&self) -> usize {
        self.lock().max_writes_in_flight
    }

    /// Bulk-in transfers the host has taken.
    pub fn transfers_in(&self) -> usize {
        self.lock().transfers_in
    }

    /// The host sends one transfer (empty: a zero-length packet).
    pub fn send(&self, transfer: Vec<u8>) {
        let mut state = self.lock();
        state.host_transfers.push_back(transfer);
        state.pump();
    }

    /// The host takes the device's next bulk-in transfer; `None` once the
    /// endpoints failed or were closed and nothing is left.
    pub async fn receive(&self) -> Option<Bytes> {
        poll_fn(|cx| {
            let mut state = self.lock();
            if let Some((id, bytes)) = state.writes.pop_front() {
                state.transfers_in += 1;
                state.finished_in.push(Completion {
                    id,
                    buffer: Buffer::Write(bytes.clone()),
                    result: Ok(bytes.len()),
                });
                wake(&mut state.in_waker);
                return Poll::Ready(Some(bytes));
            }
            // Disabled, or the device closed its endpoints (ended the connection).
            if state.failed.is_some() || state.endpoints_alive == 0 {
                return Poll::Ready(None);
            }
            state.host_waker = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Disables the endpoints: queued and later transfers fail with `errno`
    /// (FunctionFS uses ESHUTDOWN).
    pub fn fail(&self, errno: i32) {
        let mut state = self.lock();
        state.failed = Some(errno);
        state.pump();
    }

    /// Plays a USB host over these endpoints: returns the host's byte
    /// stream to the device (for a host [`oxadb_io::Connection`]) and a task
    /// that ends with the framing errors it saw (none, for a good device).
    ///
    /// Host to device, the bytes are cut into transfers of random sizes,
    /// each a multiple of `max_packet` followed by a zero-length packet, as
    /// a host must. Device to host, each transfer is checked: a 24-byte
    /// header, then the payload in transfers of which only the last may be
    /// short of a multiple of `max_packet`, none empty.
    pub fn attach_host(
        &self,
        max_packet: usize,
        seed: u64,
    ) -> (
        tokio::io::DuplexStream,
        tokio::task::JoinHandle<Vec<String>>,
    ) {
        let (host_side, adapter_side) = tokio::io::duplex(1 << 20);
        let (mut from_host, mut to_host) = tokio::io::split(adapter_side);
        let usb = self.clone();
        let sender = tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                let limit = rng.random_range(1..=buffer.len());
                let n = match from_host.read(&mut buffer[..limit]).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let mut rest = &buffer[..n];
                while !rest.is_empty() {
                    let cut = rng.random_range(1..=rest.len());
                    usb.send(rest[..cut].to_vec());
                    if oxadb_wire::usb::host_needs_zlp(cut, max_packet) {
                        usb.send(Vec::new());
                    }
                    rest = &rest[cut..];
                }
            }
        });
        let usb = self.clone();
        let checker = tokio::spawn(async move {
            let mut errors = Vec::new();
            // Payload bytes still expected after the last header.
            let mut payload_left = 0usize;
            while let Some(transfer) = usb.receive().await {
                if payload_left == 0 {
                    match <&[u8; 24]>::try_from(&transfer[..]) {
                        Ok(raw) => match oxadb_wire::Header::decode(raw, u32::MAX) {
                            Ok(header) => payload_left = header.data_length as usize,
                            Err(error) => errors.push(format!("bad header transfer: {error}")),
                        },
                        Err(_) => errors.push(format!(
                            "header transfer of {} bytes, not 24",
                            transfer.len()
                        )),
                    }
                } else if transfer.is_empty() || transfer.len() > payload_left {
                    errors.push(format!(
                        "payload transfer of {} bytes with {payload_left} expected",
                        transfer.len()
                    ));
                    payload_left = 0;
                } else {
                    payload_left -= transfer.len();
                    if payload_left > 0 && !transfer.len().is_multiple_of(max_packet) {
                        errors.push(format!(
                            "payload transfer of {} bytes ends short before the payload does",
                            transfer.len()
                        ));
                    }
                }
                if !errors.is_empty() || to_host.write_all(&transfer).await.is_err() {
                    break;
                }
            }
            sender.abort();
            errors
        });
        (host_side, checker)
    }
}

/// One fake endpoint; see [`FakeUsb`].
pub struct FakeEndpoint {
    usb: FakeUsb,
    out: bool,
    path: PathBuf,
}

impl Endpoint for FakeEndpoint {
    fn path(&self) -> &Path {
        &self.path
    }

    fn submit(&mut self, id: u64, buffer: Buffer) -> io::Result<()> {
        let mut state = self.usb.lock();
        match buffer {
            Buffer::Read(buffer) if self.out => state.reads.push_back((id, buffer)),
            Buffer::Write(bytes) if !self.out => {
                state.writes.push_back((id, bytes));
                let queued = state.writes.len();
                state.max_writes_in_flight = state.max_writes_in_flight.max(queued);
            }
            _ => return Err(io::Error::other("transfer in the wrong direction")),
        }
        state.pump();
        Ok(())
    }

    fn poll_complete(
        &mut self,
        cx: &mut Context<'_>,
        done: &mut Vec<Completion>,
    ) -> Poll<io::Result<()>> {
        let mut state = self.usb.lock();
        let (finished, waker) = if self.out {
            let state = &mut *state;
            (&mut state.finished_out, &mut state.out_waker)
        } else {
            let state = &mut *state;
            (&mut state.finished_in, &mut state.in_waker)
        };
        if finished.is_empty() {
            *waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        done.append(finished);
        Poll::Ready(Ok(()))
    }
}

impl Drop for FakeEndpoint {
    fn drop(&mut self) {
        let mut state = self.usb.lock();
        state.endpoints_alive -= 1;
        wake(&mut state.host_waker);
        // Like io_destroy: what this endpoint had queued is cancelled.
        if self.out {
            state.reads.clear();
            state.finished_out.clear();
        } else {
            state.writes.clear();
            state.finished_in.clear();
        }
    }
}

/// A fake [`crate::Gadget`]: the test sends lifecycle events through its
/// [`GadgetControl`] and gets a fresh [`FakeUsb`] for every connection the
/// gadget's server starts.
pub struct FakeGadget {
    events: tokio::sync::mpsc::UnboundedReceiver<crate::Event>,
    opened: tokio::sync::mpsc::UnboundedSender<FakeUsb>,
    shuffle: Option<u64>,
}

/// The test's side of a [`FakeGadget`].
pub struct GadgetControl {
    events: tokio::sync::mpsc::UnboundedSender<crate::Event>,
    opened: tokio::sync::mpsc::UnboundedReceiver<FakeUsb>,
}

impl FakeGadget {
    /// A gadget whose endpoints report completions shuffled by `shuffle`
    /// (a seed), if given.
    pub fn new(shuffle: Option<u64>) -> (FakeGadget, GadgetControl) {
        let (event_sender, events) = tokio::sync::mpsc::unbounded_channel();
        let (opened, opened_receiver) = tokio::sync::mpsc::unbounded_channel();
        (
            FakeGadget {
                events,
                opened,
                shuffle,
            },
            GadgetControl {
                events: event_sender,
                opened: opened_receiver,
            },
        )
    }
}

impl GadgetControl {
    /// Delivers an event as ep0 would.
    pub fn send(&self, event: crate::Event) {
        let _ = self.events.send(event);
    }

    /// The endpoints of the next connection the server starts.
    pub async fn next_usb(&mut self) -> Option<FakeUsb> {
        self.opened.recv().await
    }
}

impl crate::Gadget for FakeGadget {
    type Endpoint = FakeEndpoint;

    async fn next_event(&mut self) -> Result<crate::Event, crate::FfsError> {
        self.events
            .recv()
            .await
            .ok_or_else(|| crate::FfsError::Ep0Closed {
                path: PathBuf::from("fake/ep0"),
            })
    }

    fn open_endpoints(&self) -> Result<(FakeEndpoint, FakeEndpoint), crate::FfsError> {
        let usb = FakeUsb::new();
        if let Some(seed) = self.shuffle {
            usb.shuffle_completions(seed);
        }
        let endpoints = usb.endpoints();
        let _ = self.opened.send(usb);
        Ok(endpoints)
    }
}
