//! Host role: which streams the device may open to this host. A device is
//! not trusted with the host's ports and sockets: it may open only the
//! host-side spec of a reverse forward this connection asked for
//! (`reverse:forward:DEVICE_SPEC;HOST_SPEC`), exactly as written there.
//! The record is kept from the services the host opens, as adb's server
//! keeps it (AOSP `transport.cpp` UpdateReverseConfig and
//! IsReverseConfigured, fed from `sockets.cpp` connect_to_remote), so a
//! reverse asked for through a relay (an adb server passing a client's
//! request on) counts like one asked for directly. Everything else the
//! device opens is refused with CLSE; the connection goes on (adb's
//! server aborts instead).

use oxadb_wire::service::{DeviceService, ForwardRequest};

/// The reverse forwards asked for on one connection: device-side spec to
/// host-side spec, in the order they were made.
#[derive(Debug, Default)]
pub(super) struct ReverseForwards {
    forwards: Vec<(String, String)>,
}

impl ReverseForwards {
    /// Notes a service this host opens: a `reverse:` request changes the
    /// record, anything else leaves it alone. Recorded when asked, not when
    /// the device agrees: what the host asked for is what it allows, and a
    /// device that refused the listener has nothing to open it with anyway.
    pub(super) fn note_opened(&mut self, service: &str) {
        let Ok(DeviceService::Reverse(request)) = DeviceService::parse(service) else {
            return;
        };
        match request {
            ForwardRequest::Forward {
                local: device_spec,
                remote: host_spec,
                no_rebind,
            } => match self.forwards.iter_mut().find(|(d, _)| *d == device_spec) {
                // The device refuses a rebind under norebind: nothing changes.
                Some(_) if no_rebind => {}
                Some(forward) => forward.1 = host_spec,
                None => self.forwards.push((device_spec, host_spec)),
            },
            ForwardRequest::Kill(device_spec) => self.forwards.retain(|(d, _)| *d != device_spec),
            ForwardRequest::KillAll => self.forwards.clear(),
            ForwardRequest::List => {}
        }
    }

    /// Whether the device may open `service` on this host: the host-side
    /// spec of a reverse forward asked for, byte for byte.
    pub(super) fn permits(&self, service: &str) -> bool {
        self.forwards
            .iter()
            .any(|(_, host_spec)| host_spec == service)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(services: &[&str]) -> ReverseForwards {
        let mut record = ReverseForwards::default();
        for service in services {
            record.note_opened(service);
        }
        record
    }

    #[test]
    fn nothing_is_permitted_until_a_reverse_is_asked_for() {
        let record = after(&["shell,v2,raw:id", "sync:", "reverse:list-forward"]);
        for service in ["tcp:8081", "localabstract:x", "shell:", ""] {
            assert!(!record.permits(service), "{service}");
        }
    }

    #[test]
    fn only_the_host_side_spec_exactly_as_asked() {
        let record = after(&["reverse:forward:tcp:9000;tcp:8081"]);
        assert!(record.permits("tcp:8081"));
        // The device-side spec is the device's, never a host address.
        assert!(!record.permits("tcp:9000"));
        for near in ["tcp:08081", "tcp:8081 ", "tcp:127.0.0.1:8081", "TCP:8081"] {
            assert!(!record.permits(near), "{near}");
        }
    }

    #[test]
    fn rebind_kill_and_kill_all_change_the_record() {
        let record = after(&[
            "reverse:forward:tcp:1;localabstract:a",
            "reverse:forward:tcp:1;localfilesystem:/tmp/b",
        ]);
        assert!(!record.permits("localabstract:a"));
        assert!(record.permits("localfilesystem:/tmp/b"));

        // norebind on a device spec already reversed fails on the device.
        let record = after(&[
            "reverse:forward:tcp:1;tcp:10",
            "reverse:forward:norebind:tcp:1;tcp:11",
            "reverse:forward:norebind:tcp:2;tcp:12",
        ]);
        assert!(record.permits("tcp:10"));
        assert!(!record.permits("tcp:11"));
        assert!(record.permits("tcp:12"));

        let record = after(&[
            "reverse:forward:tcp:1;tcp:10",
            "reverse:forward:tcp:2;tcp:10",
            "reverse:killforward:tcp:1",
        ]);
        assert!(record.permits("tcp:10"), "tcp:2 still goes there");
        let record = after(&[
            "reverse:forward:tcp:1;tcp:10",
            "reverse:forward:tcp:2;tcp:11",
            "reverse:killforward-all",
        ]);
        assert!(!record.permits("tcp:10") && !record.permits("tcp:11"));
    }

    #[test]
    fn malformed_requests_change_nothing() {
        let record = after(&[
            "reverse:forward:tcp:1",
            "reverse:forward:;tcp:10",
            "reverse:forward:tcp:1;*smartsocket*",
            "reverse:forward:tcp:1;tcp:10;tcp:11",
            "reversed:forward:tcp:1;tcp:12",
        ]);
        for service in ["tcp:10", "tcp:11", "tcp:12", "*smartsocket*", ""] {
            assert!(!record.permits(service), "{service}");
        }
    }
}
