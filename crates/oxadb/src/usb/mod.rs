//! ADB over USB: finding devices with an ADB interface, claiming it, and
//! running the connection over its two bulk endpoints with nusb.
//!
//! The engine and io crates see a byte stream coming in ([`read::UsbReader`])
//! and packets going out ([`write::UsbSink`]); what is USB-specific is how
//! those map onto bulk transfers, which is where the device's fixed-size
//! reads and the missing zero-length packets from the device matter.

pub(crate) mod descriptor;
pub(crate) mod read;
pub(crate) mod write;

#[cfg(test)]
mod link_tests;

use std::io;
use std::task::{Context, Poll};

use nusb::transfer::{Buffer, Bulk, Completion, EndpointDirection, In, Out, TransferError};

use crate::error::{Error, Result};
use descriptor::{find_adb_interface, is_adb_class};

/// A USB device with an ADB interface, as listed (not yet opened).
#[derive(Debug, Clone)]
pub struct UsbDeviceInfo {
    /// The device's serial number string (`iSerialNumber`), or its
    /// [`path`](Self::path) when it has none, as Google's adb names it.
    pub serial: String,
    /// Where it is plugged in: `usb:BUS-PORT[.PORT...]`, stable across
    /// reconnections to the same port.
    pub path: String,
    /// The bus it is on.
    pub bus: String,
    /// Its address on that bus (changes with every reconnection).
    pub address: u8,
    pub vendor_id: u16,
    pub product_id: u16,
    /// The product string, when the OS has it without asking the device.
    pub product: Option<String>,
    /// nusb's handle for opening it; `None` in tests.
    pub(crate) info: Option<nusb::DeviceInfo>,
}

impl UsbDeviceInfo {
    /// How errors and logs name it: `USB device SERIAL (bus 1, address 3)`.
    pub fn label(&self) -> String {
        format!(
            "USB device {} (bus {}, address {})",
            self.serial, self.bus, self.address
        )
    }

    fn from_nusb(info: nusb::DeviceInfo) -> UsbDeviceInfo {
        let ports: Vec<String> = info.port_chain().iter().map(|p| p.to_string()).collect();
        // Linux names buses "001"; adb's paths and lsusb's "Bus 1" do not pad.
        let bus = match info.bus_id().trim_start_matches('0') {
            "" => "0".to_string(),
            bus => bus.to_string(),
        };
        let path = format!("usb:{bus}-{}", ports.join("."));
        let serial = match info.serial_number() {
            Some(serial) if !serial.trim().is_empty() => serial.to_string(),
            _ => path.clone(),
        };
        UsbDeviceInfo {
            serial,
            path,
            bus,
            address: info.device_address(),
            vendor_id: info.vendor_id(),
            product_id: info.product_id(),
            product: info.product_string().map(str::to_string),
            info: Some(info),
        }
    }

    #[cfg(test)]
    pub(crate) fn for_test(serial: &str, path: &str) -> UsbDeviceInfo {
        UsbDeviceInfo {
            serial: serial.to_string(),
            path: path.to_string(),
            bus: "1".to_string(),
            address: 3,
            vendor_id: 0x18d1,
            product_id: 0x4ee7,
            product: None,
            info: None,
        }
    }
}

/// The USB devices that have an interface with ADB's class triple, sorted
/// by path. Reads only what the OS has cached (sysfs on Linux): no device is
/// opened, so this needs no permissions. Whether the interface also has the
/// two bulk endpoints is checked when one is opened.
pub async fn list_devices() -> Result<Vec<UsbDeviceInfo>> {
    let devices = nusb::list_devices().await.map_err(Error::UsbList)?;
    let mut found: Vec<UsbDeviceInfo> = devices
        .filter(|info| {
            info.interfaces()
                .any(|i| is_adb_class(i.class(), i.subclass(), i.protocol()))
        })
        .map(UsbDeviceInfo::from_nusb)
        .collect();
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}

/// Whether listing failed because this system has no USB at all (Linux: no
/// `/sys/bus/usb`, as in many VMs and containers) rather than for a fault.
pub fn no_usb_here(error: &Error) -> bool {
    matches!(error, Error::UsbList(e) if e.os_error() == Some(libc::ENOENT as u32))
}

/// The two halves of a claimed ADB interface.
pub(crate) type Opened = (
    read::UsbReader<nusb::Endpoint<Bulk, In>>,
    write::UsbSink<nusb::Endpoint<Bulk, Out>>,
);

/// Opens `device`, claims its ADB interface and its two bulk endpoints.
pub(crate) async fn open(device: &UsbDeviceInfo) -> Result<Opened> {
    let label = device.label();
    let usb_error = |context: &str, error: nusb::Error| match error.kind() {
        nusb::ErrorKind::PermissionDenied => Error::UsbPermission {
            device: label.clone(),
            vendor_id: device.vendor_id,
        },
        nusb::ErrorKind::Disconnected | nusb::ErrorKind::NotFound => Error::Usb {
            device: label.clone(),
            message: format!("{context}: it is gone (unplugged?): {error}"),
        },
        _ => Error::Usb {
            device: label.clone(),
            message: format!("{context}: {error}"),
        },
    };
    let info = device.info.as_ref().ok_or_else(|| Error::Usb {
        device: label.clone(),
        message: "not a device listed by this process".to_string(),
    })?;
    let handle = info.open().await.map_err(|e| usb_error("opening", e))?;
    let adb = {
        let config = handle.active_configuration().map_err(|e| Error::Usb {
            device: label.clone(),
            message: format!("reading its configuration: {e}"),
        })?;
        find_adb_interface(&config).ok_or_else(|| Error::Usb {
            device: label.clone(),
            message: "no ADB interface with a bulk IN and a bulk OUT endpoint".to_string(),
        })?
    };
    let interface = handle
        .claim_interface(adb.number)
        .await
        .map_err(|e| match e.kind() {
            // EBUSY: another process (usually Google's adb server) holds it.
            nusb::ErrorKind::Busy => Error::UsbClaimed {
                device: label.clone(),
            },
            _ => usb_error(&format!("claiming interface {}", adb.number), e),
        })?;
    if adb.alt_setting != 0 {
        interface
            .set_alt_setting(adb.alt_setting)
            .await
            .map_err(|e| {
                usb_error(
                    &format!("selecting alternate setting {}", adb.alt_setting),
                    e,
                )
            })?;
    }
    let endpoint_in = interface
        .endpoint::<Bulk, In>(adb.endpoint_in)
        .map_err(|e| usb_error(&format!("opening endpoint {:#04x}", adb.endpoint_in), e))?;
    let endpoint_out = interface
        .endpoint::<Bulk, Out>(adb.endpoint_out)
        .map_err(|e| usb_error(&format!("opening endpoint {:#04x}", adb.endpoint_out), e))?;
    tracing::debug!(
        device = %label,
        interface = adb.number,
        endpoint_in = adb.endpoint_in,
        endpoint_out = adb.endpoint_out,
        max_packet = endpoint_in.max_packet_size(),
        "claimed the ADB interface"
    );
    Ok((
        read::usb_reader(endpoint_in, label.clone()),
        write::UsbSink::new(endpoint_out, label),
    ))
}

/// What the reader and the sink need of a bulk endpoint: nusb's queue of
/// submitted transfers, behind a trait so that tests can play the device.
pub(crate) trait BulkEndpoint: Send + Unpin + 'static {
    fn max_packet_size(&self) -> usize;
    /// Transfers submitted and not yet returned by `poll_next_complete`.
    fn pending(&self) -> usize;
    /// A buffer of at least `len` bytes (zero-copy where the OS allows;
    /// a plain heap buffer otherwise, which is all the test fakes need).
    fn allocate(&self, len: usize) -> Buffer {
        Buffer::new(len)
    }
    fn submit(&mut self, buffer: Buffer);
    /// The oldest pending transfer, once it completed (panics when none is pending).
    fn poll_next_complete(&mut self, cx: &mut Context<'_>) -> Poll<Completion>;
    fn cancel_all(&mut self);
}

impl<Dir: EndpointDirection> BulkEndpoint for nusb::Endpoint<Bulk, Dir>
where
    nusb::Endpoint<Bulk, Dir>: Send + Unpin + 'static,
{
    fn max_packet_size(&self) -> usize {
        nusb::Endpoint::max_packet_size(self)
    }

    fn pending(&self) -> usize {
        nusb::Endpoint::pending(self)
    }

    fn allocate(&self, len: usize) -> Buffer {
        nusb::Endpoint::allocate(self, len)
    }

    fn submit(&mut self, buffer: Buffer) {
        nusb::Endpoint::submit(self, buffer)
    }

    fn poll_next_complete(&mut self, cx: &mut Context<'_>) -> Poll<Completion> {
        nusb::Endpoint::poll_next_complete(self, cx)
    }

    fn cancel_all(&mut self) {
        nusb::Endpoint::cancel_all(self)
    }
}

/// An I/O error for a failed transfer, naming the device. An unplugged
/// device (or a device whose USB controller unbound the function) fails its
/// pending transfers with `Disconnected`, which ends the connection.
pub(crate) fn transfer_error(
    label: &str,
    doing: &str,
    error: TransferError,
) -> (io::ErrorKind, String) {
    match error {
        TransferError::Disconnected => (
            io::ErrorKind::ConnectionAborted,
            format!("{label}: disconnected"),
        ),
        TransferError::Cancelled => (
            io::ErrorKind::ConnectionAborted,
            format!("{label}: transfer cancelled while {doing}"),
        ),
        TransferError::Stall => (
            io::ErrorKind::ConnectionReset,
            format!("{label}: endpoint stalled while {doing} (the device ended its ADB function?)"),
        ),
        // An unplug in the middle of a transfer often ends it this way
        // (EPROTO), not as a disconnection.
        TransferError::Fault => (
            io::ErrorKind::ConnectionAborted,
            format!("{label}: {doing} failed: {error} (unplugged, or its ADB function went away?)"),
        ),
        other => (
            io::ErrorKind::Other,
            format!("{label}: {doing} failed: {other}"),
        ),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! Fake endpoints that behave as USB does: a transfer ends when its
    //! request is full or a short packet arrives, and waits otherwise.

    use std::collections::VecDeque;
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    use nusb::transfer::{Buffer, Completion, TransferError};

    use super::BulkEndpoint;

    /// Polls `future` once: the fakes complete transfers synchronously, so
    /// anything but `Ready` means a request waits for data the device never
    /// sends (a stall).
    pub(crate) fn block_on_ready<F: Future>(future: F) -> F::Output {
        let mut future = std::pin::pin!(future);
        match future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(output) => output,
            Poll::Pending => panic!("stalled: a transfer waits for data that never comes"),
        }
    }

    #[derive(Debug, Default, Clone, Copy)]
    pub(crate) struct InStats {
        pub max_pending: usize,
        /// Packets that did not fit their transfer (a babble error on real hardware).
        pub overflows: usize,
    }

    /// A device's bulk IN endpoint: it sends its scripted writes, each cut
    /// into `max_packet` packets, with no zero-length packet after a write
    /// that ends on a packet boundary (as adbd never sends one).
    pub(crate) struct FakeIn {
        max_packet: usize,
        packets: VecDeque<Vec<u8>>,
        pending: VecDeque<Buffer>,
        fail: Option<TransferError>,
        stats: InStats,
    }

    impl FakeIn {
        pub(crate) fn new(max_packet: usize, writes: Vec<Vec<u8>>) -> FakeIn {
            let mut packets = VecDeque::new();
            for write in writes {
                for packet in write.chunks(max_packet) {
                    packets.push_back(packet.to_vec());
                }
            }
            FakeIn {
                max_packet,
                packets,
                pending: VecDeque::new(),
                fail: None,
                stats: InStats::default(),
            }
        }

        /// Once the script is sent, fail transfers with `error`.
        pub(crate) fn then_fail(&mut self, error: TransferError) {
            self.fail = Some(error);
        }

        pub(crate) fn stats(&self) -> InStats {
            self.stats
        }
    }

    impl BulkEndpoint for FakeIn {
        fn max_packet_size(&self) -> usize {
            self.max_packet
        }

        fn pending(&self) -> usize {
            self.pending.len()
        }

        fn submit(&mut self, buffer: Buffer) {
            let len = buffer.requested_len();
            assert!(
                len > 0 && len.is_multiple_of(self.max_packet),
                "nusb refuses IN requests of {len} bytes (not a multiple of {})",
                self.max_packet
            );
            self.pending.push_back(buffer);
            self.stats.max_pending = self.stats.max_pending.max(self.pending.len());
        }

        fn poll_next_complete(&mut self, _cx: &mut Context<'_>) -> Poll<Completion> {
            let buffer = self.pending.front_mut().expect("no transfer pending");
            loop {
                if buffer.len() == buffer.requested_len() {
                    break;
                }
                let Some(packet) = self.packets.pop_front() else {
                    if let Some(error) = self.fail {
                        let buffer = self.pending.pop_front().expect("front");
                        return Poll::Ready(Completion {
                            actual_len: buffer.len(),
                            buffer,
                            status: Err(error),
                        });
                    }
                    return Poll::Pending;
                };
                if packet.len() > buffer.requested_len() - buffer.len() {
                    self.stats.overflows += 1;
                    let buffer = self.pending.pop_front().expect("front");
                    return Poll::Ready(Completion {
                        actual_len: buffer.len(),
                        buffer,
                        status: Err(TransferError::Fault),
                    });
                }
                buffer.extend_from_slice(&packet);
                if packet.len() < self.max_packet {
                    break;
                }
            }
            let buffer = self.pending.pop_front().expect("front");
            Poll::Ready(Completion {
                actual_len: buffer.len(),
                buffer,
                status: Ok(()),
            })
        }

        fn cancel_all(&mut self) {}
    }

    /// A device's bulk OUT endpoint that records every transfer (a
    /// zero-length packet is an empty one) and completes them in order.
    pub(crate) struct FakeOut {
        max_packet: usize,
        pub(crate) transfers: Vec<Vec<u8>>,
        pending: VecDeque<Buffer>,
        fail: Option<TransferError>,
        max_pending: usize,
    }

    impl FakeOut {
        pub(crate) fn new(max_packet: usize) -> FakeOut {
            FakeOut {
                max_packet,
                transfers: Vec::new(),
                pending: VecDeque::new(),
                fail: None,
                max_pending: 0,
            }
        }

        pub(crate) fn fail_with(&mut self, error: TransferError) {
            self.fail = Some(error);
        }

        pub(crate) fn transfer_lengths(&self) -> Vec<usize> {
            self.transfers.iter().map(Vec::len).collect()
        }

        pub(crate) fn bytes(&self) -> Vec<u8> {
            self.transfers.concat()
        }

        pub(crate) fn max_pending(&self) -> usize {
            self.max_pending
        }
    }

    impl BulkEndpoint for FakeOut {
        fn max_packet_size(&self) -> usize {
            self.max_packet
        }

        fn pending(&self) -> usize {
            self.pending.len()
        }

        fn submit(&mut self, buffer: Buffer) {
            self.transfers.push(buffer[..].to_vec());
            self.pending.push_back(buffer);
            self.max_pending = self.max_pending.max(self.pending.len());
        }

        fn poll_next_complete(&mut self, _cx: &mut Context<'_>) -> Poll<Completion> {
            let buffer = self.pending.pop_front().expect("no transfer pending");
            Poll::Ready(Completion {
                actual_len: buffer.len(),
                buffer,
                status: self.fail.map_or(Ok(()), Err),
            })
        }

        fn cancel_all(&mut self) {}
    }
}
