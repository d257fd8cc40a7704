//! FunctionFS lifecycle events, as read from `ep0`.
//!
//! Each is a `struct usb_functionfs_event`: the 8-byte setup request (valid
//! for SETUP only), a type byte and 3 bytes of padding. One read returns up
//! to four of them; the kernel keeps only the latest of ENABLE/DISABLE.

/// Size of one `struct usb_functionfs_event`.
pub const EVENT_LEN: usize = 12;
/// The kernel queues at most this many events; reading room for all of them
/// takes them in one call.
pub const MAX_EVENTS: usize = 4;

/// A control request addressed to the function (`struct usb_ctrlrequest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetupRequest {
    pub request_type: u8,
    pub request: u8,
    pub value: u16,
    pub index: u16,
    pub length: u16,
}

impl SetupRequest {
    /// Device to host: the host expects data (or a stall) from us.
    pub fn is_in(&self) -> bool {
        self.request_type & 0x80 != 0
    }
}

/// One FunctionFS event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The function was bound to a UDC.
    Bind,
    /// The function was unbound: its endpoints are gone.
    Unbind,
    /// The host selected our configuration: the endpoints work.
    Enable,
    /// The host deconfigured or reset the device, or the cable went: the
    /// endpoints' transfers fail from now on.
    Disable,
    /// A control request for our interface; it must be answered or stalled.
    Setup(SetupRequest),
    Suspend,
    Resume,
    /// A type this code does not know (newer kernel).
    Unknown(u8),
}

impl Event {
    /// Decodes one event.
    pub fn parse(raw: &[u8; EVENT_LEN]) -> Event {
        match raw[8] {
            0 => Event::Bind,
            1 => Event::Unbind,
            2 => Event::Enable,
            3 => Event::Disable,
            4 => Event::Setup(SetupRequest {
                request_type: raw[0],
                request: raw[1],
                value: u16::from_le_bytes([raw[2], raw[3]]),
                index: u16::from_le_bytes([raw[4], raw[5]]),
                length: u16::from_le_bytes([raw[6], raw[7]]),
            }),
            5 => Event::Suspend,
            6 => Event::Resume,
            other => Event::Unknown(other),
        }
    }

    /// Decodes what one read of `ep0` returned; `None` if it is not whole
    /// events.
    pub fn parse_all(raw: &[u8]) -> Option<Vec<Event>> {
        if !raw.len().is_multiple_of(EVENT_LEN) {
            return None;
        }
        Some(
            raw.chunks_exact(EVENT_LEN)
                .map(|chunk| Event::parse(chunk.try_into().expect("exact chunks")))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_decode() {
        let mut raw = Vec::new();
        for kind in [0u8, 2, 3, 1, 5, 6, 9] {
            raw.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, kind, 0, 0, 0]);
        }
        // A vendor request, device to host: bRequestType 0xc1, bRequest 7,
        // wValue 0x0102, wIndex 0, wLength 64.
        raw.extend_from_slice(&[0xc1, 7, 2, 1, 0, 0, 64, 0, 4, 0, 0, 0]);
        let events = Event::parse_all(&raw).unwrap();
        assert_eq!(
            events,
            vec![
                Event::Bind,
                Event::Enable,
                Event::Disable,
                Event::Unbind,
                Event::Suspend,
                Event::Resume,
                Event::Unknown(9),
                Event::Setup(SetupRequest {
                    request_type: 0xc1,
                    request: 7,
                    value: 0x0102,
                    index: 0,
                    length: 64,
                }),
            ]
        );
        let Event::Setup(setup) = events[7] else {
            unreachable!()
        };
        assert!(setup.is_in());
        assert!(Event::parse_all(&raw[..13]).is_none());
    }
}
