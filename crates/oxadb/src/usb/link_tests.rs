//! The USB transport end to end, without hardware: an in-process oxadbd
//! behind a fake USB link. The host's OUT transfers become the daemon's TCP
//! input (zero-length packets dropped); each read from the daemon's socket
//! becomes a device write on the IN endpoint, cut into `wMaxPacketSize`
//! packets with no zero-length packet after a full one, as adbd sends. The
//! socket's reads split and merge ADB packets at random places, which is
//! harsher than adbd (a header, then its payload) and must work all the same.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use nusb::transfer::{Buffer, Completion, TransferError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::read::usb_reader;
use super::write::UsbSink;
use super::{BulkEndpoint, UsbDeviceInfo};
use crate::sync::{self, NoProgress, PullOptions, PushOptions};
use crate::{ConnectOptions, CreditMode, Device, Error};

#[derive(Default)]
struct Wire {
    /// Device-to-host packets not yet taken by a transfer.
    packets: VecDeque<Vec<u8>>,
    waker: Option<Waker>,
    /// The device went away: pending and later transfers fail.
    unplugged: bool,
    /// Unplug once this many more bytes went to the host.
    unplug_after: Option<usize>,
}

type Shared = Arc<Mutex<Wire>>;

struct LinkIn {
    max_packet: usize,
    wire: Shared,
    pending: VecDeque<Buffer>,
}

impl BulkEndpoint for LinkIn {
    fn max_packet_size(&self) -> usize {
        self.max_packet
    }

    fn pending(&self) -> usize {
        self.pending.len()
    }

    fn submit(&mut self, buffer: Buffer) {
        assert!(buffer.requested_len().is_multiple_of(self.max_packet));
        self.pending.push_back(buffer);
    }

    fn poll_next_complete(&mut self, cx: &mut Context<'_>) -> Poll<Completion> {
        let mut wire = self.wire.lock().unwrap();
        let buffer = self.pending.front_mut().expect("no transfer pending");
        let status = loop {
            if wire.unplugged {
                break Err(TransferError::Disconnected);
            }
            if buffer.len() == buffer.requested_len() {
                break Ok(());
            }
            let Some(packet) = wire.packets.pop_front() else {
                wire.waker = Some(cx.waker().clone());
                return Poll::Pending;
            };
            assert!(
                packet.len() <= buffer.requested_len() - buffer.len(),
                "overflow"
            );
            buffer.extend_from_slice(&packet);
            if let Some(left) = wire.unplug_after.as_mut() {
                *left = left.saturating_sub(packet.len());
                if *left == 0 {
                    wire.unplugged = true;
                }
            }
            if packet.len() < self.max_packet {
                break Ok(());
            }
        };
        let buffer = self.pending.pop_front().expect("front");
        Poll::Ready(Completion {
            actual_len: buffer.len(),
            buffer,
            status,
        })
    }

    fn cancel_all(&mut self) {}
}

struct LinkOut {
    max_packet: usize,
    wire: Shared,
    to_device: tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
    pending: VecDeque<Buffer>,
}

impl BulkEndpoint for LinkOut {
    fn max_packet_size(&self) -> usize {
        self.max_packet
    }

    fn pending(&self) -> usize {
        self.pending.len()
    }

    fn submit(&mut self, buffer: Buffer) {
        if !buffer.is_empty() {
            let _ = self.to_device.send(buffer[..].to_vec());
        }
        self.pending.push_back(buffer);
    }

    fn poll_next_complete(&mut self, _cx: &mut Context<'_>) -> Poll<Completion> {
        let buffer = self.pending.pop_front().expect("no transfer pending");
        let status = if self.wire.lock().unwrap().unplugged {
            Err(TransferError::Disconnected)
        } else {
            Ok(())
        };
        Poll::Ready(Completion {
            actual_len: buffer.len(),
            buffer,
            status,
        })
    }

    fn cancel_all(&mut self) {}
}

struct Link {
    device: Device,
    wire: Shared,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.device.close();
        self.server.abort();
    }
}

/// An oxadbd on loopback and a Device connected to it over the fake link.
async fn link(max_packet: usize, credit: CreditMode) -> Link {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let listen = listener.local_addr().unwrap();
    let config = oxadbd::config::DaemonConfig {
        product_model: "Fake USB".into(),
        credit,
        ..oxadbd::config::DaemonConfig::with_defaults(listen).unwrap()
    };
    let server = tokio::spawn(oxadbd::server::serve(listener, config));
    let socket = tokio::net::TcpStream::connect(listen).await.unwrap();
    socket.set_nodelay(true).unwrap();
    let (mut from_daemon, mut to_daemon) = socket.into_split();
    let wire: Shared = Arc::default();
    let (to_device, mut outgoing) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        while let Some(bytes) = outgoing.recv().await {
            if to_daemon.write_all(&bytes).await.is_err() {
                break;
            }
        }
    });
    let feed = wire.clone();
    tokio::spawn(async move {
        let mut buf = vec![0; 64 * 1024];
        loop {
            let n = from_daemon.read(&mut buf).await.unwrap_or(0);
            let mut wire = feed.lock().unwrap();
            if n == 0 {
                wire.unplugged = true;
            } else {
                for packet in buf[..n].chunks(max_packet) {
                    wire.packets.push_back(packet.to_vec());
                }
            }
            if let Some(waker) = wire.waker.take() {
                waker.wake();
            }
            if n == 0 {
                return;
            }
        }
    });
    let info = UsbDeviceInfo::for_test("FAKE0001", "usb:1-1");
    let reader = usb_reader(
        LinkIn {
            max_packet,
            wire: wire.clone(),
            pending: VecDeque::new(),
        },
        info.label(),
    );
    let sink = UsbSink::new(
        LinkOut {
            max_packet,
            wire: wire.clone(),
            to_device,
            pending: VecDeque::new(),
        },
        info.label(),
    );
    let options = ConnectOptions {
        credit,
        authenticate: false,
        timeout: Duration::from_secs(10),
        memory_budget: None,
        ack_headroom: true,
        ..Default::default()
    };
    let device = Device::connect_over_usb(reader, sink, &info, &options, true)
        .await
        .unwrap();
    Link {
        device,
        wire,
        server,
    }
}

/// Bytes whose length is what matters: multiples of every packet size and
/// of the 1 MiB payload included.
fn file_bytes(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 253) as u8).collect()
}

fn remote(path: &Path) -> String {
    path.to_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_push_and_pull_over_the_link() {
    for (max_packet, credit) in [
        (512, CreditMode::Adaptive),
        (1024, CreditMode::Classic),
        (64, CreditMode::Adaptive),
    ] {
        let link = link(max_packet, credit).await;
        assert_eq!(link.device.serial(), "FAKE0001");
        assert_eq!(
            link.device.banner().property("ro.product.model"),
            Some("Fake USB")
        );
        let output = link.device.shell("echo hi").await.unwrap();
        assert_eq!(output.stdout, b"hi\n");
        let dir = tempfile::tempdir().unwrap();
        for len in [0, 1, max_packet, 16384, 1 << 20, (3 << 20) + 512] {
            let local = dir.path().join(format!("in-{len}"));
            let pushed = dir.path().join(format!("pushed-{len}"));
            let back = dir.path().join(format!("back-{len}"));
            let data = file_bytes(len);
            std::fs::write(&local, &data).unwrap();
            sync::push(
                &link.device,
                std::slice::from_ref(&local),
                &remote(&pushed),
                &PushOptions::default(),
                &mut NoProgress,
            )
            .await
            .unwrap();
            assert!(
                std::fs::read(&pushed).unwrap() == data,
                "push of {len} bytes, mps {max_packet}"
            );
            sync::pull(
                &link.device,
                &[remote(&pushed)],
                &back,
                &PullOptions::default(),
                &mut NoProgress,
            )
            .await
            .unwrap();
            assert!(
                std::fs::read(&back).unwrap() == data,
                "pull of {len} bytes, mps {max_packet}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unplugging_mid_pull_fails_it_and_leaves_no_file() {
    let link = link(512, CreditMode::Adaptive).await;
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("big");
    std::fs::write(&source, file_bytes(16 << 20)).unwrap();
    let pulled = dir.path().join("pulled");
    link.wire.lock().unwrap().unplug_after = Some(4 << 20);
    let result = tokio::time::timeout(
        Duration::from_secs(20),
        sync::pull(
            &link.device,
            &[remote(&source)],
            &pulled,
            &PullOptions::default(),
            &mut NoProgress,
        ),
    )
    .await
    .expect("an unplug ends the pull, it does not hang");
    let error = result.unwrap_err().to_string();
    assert!(
        error.contains("USB device FAKE0001 (bus 1, address 3): disconnected"),
        "{error}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        left,
        vec!["big".to_string()],
        "no partial or temporary file"
    );
    // Everything after the unplug fails at once, naming the device.
    let error = link.device.shell("echo hi").await.unwrap_err();
    assert!(matches!(error, Error::ConnectionLost { .. }), "{error}");
    assert!(error.to_string().contains("FAKE0001"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unplugging_mid_push_fails_it_naming_the_device() {
    let link = link(512, CreditMode::Adaptive).await;
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("big");
    std::fs::write(&source, file_bytes(16 << 20)).unwrap();
    // The device's answers during a push are a few OKAYs: unplug after two.
    link.wire.lock().unwrap().unplug_after = Some(48);
    let result = tokio::time::timeout(
        Duration::from_secs(20),
        sync::push(
            &link.device,
            std::slice::from_ref(&source),
            &remote(&dir.path().join("pushed")),
            &PushOptions::default(),
            &mut NoProgress,
        ),
    )
    .await
    .expect("an unplug ends the push, it does not hang");
    let error = result.unwrap_err().to_string();
    assert!(error.contains("FAKE0001"), "{error}");
    assert!(error.contains("disconnected"), "{error}");
}
