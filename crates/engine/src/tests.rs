//! Engine tests: two engines wired back to back, no I/O.

use bytes::Bytes;
use oxadb_wire::packet::{VERSION_CHECKSUMMED, VERSION_SKIP_CHECKSUM};
use oxadb_wire::{feature, Banner, Command, Header, Packet, HEADER_LEN, MAX_PAYLOAD};

use std::time::Duration;

use crate::*;

fn banner(kind: &str, delayed_ack: bool) -> Banner {
    let mut banner = Banner::new(kind);
    banner.features.push(feature::SHELL_V2.into());
    if delayed_ack {
        banner.features.push(feature::DELAYED_ACK.into());
    }
    banner
}

fn config(role: Role, delayed_ack: bool) -> Config {
    let kind = if role == Role::Host { "host" } else { "device" };
    Config::new(role, banner(kind, delayed_ack))
}

/// Sends a packet through the real header codec, as a driver would.
fn deliver(to: &mut Connection, from: &Connection, packet: &Packet) -> Result<(), ProtocolError> {
    let raw: [u8; HEADER_LEN] = from.header_for(packet).encode();
    let header = Header::decode(&raw, to.max_incoming_payload()).expect("valid header");
    to.handle_packet(&header, packet.payload.clone())
}

struct Pair {
    host: Connection,
    device: Connection,
    /// Every packet that crossed, host to device and device to host.
    to_device: Vec<Packet>,
    to_host: Vec<Packet>,
}

impl Pair {
    fn new(host: Config, device: Config) -> Pair {
        let mut pair = Pair {
            host: Connection::new(host),
            device: Connection::new(device),
            to_device: Vec::new(),
            to_host: Vec::new(),
        };
        pair.drive();
        assert!(pair.host.is_online() && pair.device.is_online());
        assert_eq!(pair.host.poll_event(), Some(Event::Connected));
        assert_eq!(pair.device.poll_event(), Some(Event::Connected));
        pair
    }

    /// Moves packets both ways until both sides are quiet.
    fn drive(&mut self) {
        loop {
            let mut moved = false;
            while let Some(packet) = self.host.poll_transmit() {
                deliver(&mut self.device, &self.host, &packet).unwrap();
                self.to_device.push(packet);
                moved = true;
            }
            while let Some(packet) = self.device.poll_transmit() {
                deliver(&mut self.host, &self.device, &packet).unwrap();
                self.to_host.push(packet);
                moved = true;
            }
            if !moved {
                break;
            }
        }
    }

    /// Host opens `service`, device accepts; returns (host id, device id).
    fn open(&mut self, service: &str) -> (StreamId, StreamId) {
        let host_id = self.host.open(service).unwrap();
        self.drive();
        let Some(Event::OpenRequest { id, service: got }) = self.device.poll_event() else {
            panic!("no OpenRequest");
        };
        assert_eq!(got, service);
        self.device.accept(id).unwrap();
        self.drive();
        assert_eq!(self.host.poll_event(), Some(Event::Opened(host_id)));
        (host_id, id)
    }
}

fn read_all(connection: &mut Connection, id: StreamId) -> Vec<u8> {
    let mut out = Vec::new();
    while let Read::Data(chunk) = connection.read(id, usize::MAX).unwrap() {
        out.extend_from_slice(&chunk);
    }
    out
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn handshake_negotiates_minimums_and_features() {
    let mut host = config(Role::Host, true);
    host.max_payload = 256 * 1024;
    let pair = Pair::new(host, config(Role::Device, true));
    for side in [&pair.host, &pair.device] {
        let peer = side.peer().unwrap();
        assert_eq!(peer.max_payload, 256 * 1024);
        assert_eq!(peer.version, VERSION_SKIP_CHECKSUM);
        assert!(peer.delayed_ack);
    }
    assert_eq!(pair.device.peer().unwrap().banner.kind, "host");
    assert!(pair.host.peer().unwrap().banner.has_feature("shell_v2"));
    // Only the host speaks first; the device answers with one CNXN.
    assert_eq!(pair.to_device.len(), 1);
    assert_eq!(pair.to_host.len(), 1);
    assert_eq!(pair.to_host[0].command, Command::Cnxn);
}

#[test]
fn features_only_if_asked_reach_only_hosts_that_asked() {
    let mut device = config(Role::Device, true);
    device.banner.features.push(feature::OXADB_DELTA.into());
    // Stock adb does not name it: the device does not either.
    let pair = Pair::new(config(Role::Host, true), device.clone());
    let seen = &pair.host.peer().unwrap().banner;
    assert!(!seen.has_feature(feature::OXADB_DELTA));
    assert!(seen.has_feature(feature::SHELL_V2));
    // A host that names it sees it.
    let mut host = config(Role::Host, true);
    host.banner.features.push(feature::OXADB_DELTA.into());
    let pair = Pair::new(host, device);
    assert!(pair
        .host
        .peer()
        .unwrap()
        .banner
        .has_feature(feature::OXADB_DELTA));
}

#[test]
fn delayed_ack_needs_both_sides() {
    let pair = Pair::new(config(Role::Host, false), config(Role::Device, true));
    assert!(!pair.device.peer().unwrap().delayed_ack);
    assert!(!pair.host.peer().unwrap().delayed_ack);
}

#[test]
fn classic_stream_keeps_one_packet_in_flight() {
    let mut host_config = config(Role::Host, false);
    host_config.max_payload = 4096;
    let mut device_config = config(Role::Device, false);
    // Consumer never reads until the end: acks must still come one per packet
    // while the local buffer has room, then stop.
    device_config.local_buffer = 16 * 1024;
    let mut pair = Pair::new(host_config, device_config);
    let (host_id, device_id) = pair.open("exec:cat");
    assert!(
        pair.to_device.last().unwrap().arg1 == 0,
        "classic OPEN.arg1 is 0"
    );
    assert!(
        pair.to_host.last().unwrap().payload.is_empty(),
        "classic OKAY is empty"
    );

    let data = pattern(64 * 1024);
    let mut written = 0;
    let mut received = Vec::new();
    let mut rounds = 0;
    while received.len() < data.len() {
        rounds += 1;
        assert!(rounds < 1000, "stalled");
        written += pair.host.write(host_id, &data[written..]).unwrap();
        // One step: the host may emit at most one WRTE before the next OKAY.
        let mut wrtes = 0;
        while let Some(packet) = pair.host.poll_transmit() {
            if packet.command == Command::Wrte {
                wrtes += 1;
            }
            deliver(&mut pair.device, &pair.host, &packet).unwrap();
        }
        assert!(
            wrtes <= 1,
            "classic mode sent {wrtes} WRTEs without an OKAY"
        );
        if pair.device.readable_bytes(device_id) >= 16 * 1024 || wrtes == 0 {
            received.extend(read_all(&mut pair.device, device_id));
        }
        while let Some(packet) = pair.device.poll_transmit() {
            deliver(&mut pair.host, &pair.device, &packet).unwrap();
        }
    }
    assert_eq!(received, data);
    let stats = pair.device.stream_stats(device_id).unwrap();
    assert_eq!(stats.packets_received, 16);
    assert_eq!(stats.okays_sent, 16, "one OKAY per WRTE in classic mode");
}

#[test]
fn delayed_ack_grants_credit_and_stops_at_zero() {
    let mut host_config = config(Role::Host, true);
    host_config.max_payload = 64 * 1024;
    host_config.credit_policy = CreditPolicy::Aosp;
    host_config.initial_credit = 1024 * 1024;
    let mut device_config = config(Role::Device, true);
    device_config.credit_policy = CreditPolicy::Aosp;
    device_config.initial_credit = 100 * 1024;
    device_config.local_buffer = 0;
    host_config.send_buffer = 4 * 1024 * 1024;
    let mut pair = Pair::new(host_config, device_config);
    let (host_id, device_id) = pair.open("sync:");
    let open = pair
        .to_device
        .iter()
        .find(|p| p.command == Command::Open)
        .unwrap();
    assert_eq!(
        open.arg1,
        1024 * 1024,
        "OPEN.arg1 carries the opener's credit"
    );
    let okay = pair.to_host.last().unwrap();
    assert_eq!(okay.command, Command::Okay);
    assert_eq!(okay.payload.as_ref(), &(100 * 1024i32).to_le_bytes());

    let data = pattern(1024 * 1024);
    assert_eq!(pair.host.write(host_id, &data).unwrap(), data.len());
    let mut burst = Vec::new();
    while let Some(packet) = pair.host.poll_transmit() {
        burst.push(packet);
    }
    // 100 KiB of credit: 64 KiB, then 64 KiB more (one packet of overshoot), then stop.
    assert_eq!(burst.len(), 2);
    for packet in &burst {
        deliver(&mut pair.device, &pair.host, packet).unwrap();
    }
    assert_eq!(
        pair.device.poll_transmit(),
        None,
        "consumer has not read: no credit back"
    );
    let chunk = match pair.device.read(device_id, 10_000).unwrap() {
        Read::Data(chunk) => chunk,
        other => panic!("{other:?}"),
    };
    assert_eq!(chunk.len(), 10_000);
    let okay = pair.device.poll_transmit().unwrap();
    assert_eq!(okay.command, Command::Okay);
    assert_eq!(okay.payload.as_ref(), &10_000i32.to_le_bytes());
    deliver(&mut pair.host, &pair.device, &okay).unwrap();
    // Credit is 100K - 128K + 10K = -18K: still blocked.
    assert_eq!(pair.host.poll_transmit(), None);

    let mut received = chunk.to_vec();
    let mut rounds = 0;
    while received.len() < data.len() {
        rounds += 1;
        assert!(rounds < 1000, "stalled");
        received.extend(read_all(&mut pair.device, device_id));
        pair.drive();
    }
    assert_eq!(received, data);
}

#[test]
fn open_arg1_must_match_delayed_ack() {
    let mut pair = Pair::new(config(Role::Host, true), config(Role::Device, true));
    let open = Packet::new(Command::Open, 77, 0, &b"shell:\0"[..]);
    deliver(&mut pair.device, &pair.host, &open).unwrap();
    assert_eq!(pair.device.poll_event(), None);
    let refusal = pair.device.poll_transmit().unwrap();
    assert_eq!(
        (refusal.command, refusal.arg0, refusal.arg1),
        (Command::Clse, 0, 77)
    );

    let mut classic = Pair::new(config(Role::Host, false), config(Role::Device, true));
    let open = Packet::new(Command::Open, 5, 4096, &b"shell:\0"[..]);
    deliver(&mut classic.device, &classic.host, &open).unwrap();
    let refusal = classic.device.poll_transmit().unwrap();
    assert_eq!((refusal.command, refusal.arg1), (Command::Clse, 5));
}

#[test]
fn refused_open_reaches_the_opener() {
    let mut pair = Pair::new(config(Role::Host, true), config(Role::Device, true));
    let host_id = pair.host.open("nonsense:").unwrap();
    pair.drive();
    let Some(Event::OpenRequest { id, .. }) = pair.device.poll_event() else {
        panic!()
    };
    pair.device.refuse(id).unwrap();
    pair.drive();
    assert_eq!(pair.host.poll_event(), Some(Event::Refused(host_id)));
    assert!(pair.host.write(host_id, b"x").is_err());
}

/// `adb reverse`: the device opens streams to the host (service = the
/// host-side spec), beside streams the host opened, with the same credit.
#[test]
fn the_device_opens_streams_to_the_host() {
    for delayed_ack in [false, true] {
        let mut pair = Pair::new(
            config(Role::Host, delayed_ack),
            config(Role::Device, delayed_ack),
        );
        let (host_shell, device_shell) = pair.open("shell:");
        // The reverses that let the device open tcp:8080 and tcp:1 here.
        pair.open("reverse:forward:tcp:9000;tcp:8080");
        pair.open("reverse:forward:tcp:9001;tcp:1");
        let device_id = pair.device.open("tcp:8080").unwrap();
        pair.drive();
        let open = pair.to_host.last().unwrap();
        assert_eq!(open.command, Command::Open);
        assert_eq!(open.payload.as_ref(), b"tcp:8080\0");
        assert_eq!(
            open.arg1 != 0,
            delayed_ack,
            "OPEN.arg1 carries credit only in burst mode"
        );
        let Some(Event::OpenRequest {
            id: host_id,
            service,
        }) = pair.host.poll_event()
        else {
            panic!("the host saw no OpenRequest");
        };
        assert_eq!(service, "tcp:8080");
        pair.host.accept(host_id).unwrap();
        pair.drive();
        assert_eq!(pair.device.poll_event(), Some(Event::Opened(device_id)));

        // Both ways, more than one window's worth, then the same on the
        // host-opened stream to show the two id spaces do not collide.
        let data = pattern(3 << 20);
        for (from_device, id_from, id_to) in [
            (true, device_id, host_id),
            (false, host_id, device_id),
            (false, host_shell, device_shell),
        ] {
            let mut written = 0;
            let mut received = Vec::new();
            let mut rounds = 0;
            while received.len() < data.len() {
                rounds += 1;
                assert!(rounds < 10_000, "stalled (delayed_ack {delayed_ack})");
                let sender = if from_device {
                    &mut pair.device
                } else {
                    &mut pair.host
                };
                written += sender.write(id_from, &data[written..]).unwrap();
                pair.drive();
                let receiver = if from_device {
                    &mut pair.host
                } else {
                    &mut pair.device
                };
                received.extend(read_all(receiver, id_to));
                pair.drive();
            }
            assert_eq!(received, data);
        }
        let stats = pair.device.stream_stats(device_id).unwrap();
        assert_eq!(stats.delayed_ack, delayed_ack);
        assert_eq!(stats.bytes_sent, 3 << 20);
        assert_eq!(stats.bytes_received, 3 << 20);

        // The host refusing (nothing listens there) reaches the device.
        let refused = pair.device.open("tcp:1").unwrap();
        pair.drive();
        let id = std::iter::from_fn(|| pair.host.poll_event())
            .find_map(|event| match event {
                Event::OpenRequest { id, .. } => Some(id),
                _ => None,
            })
            .expect("no second OpenRequest");
        pair.host.refuse(id).unwrap();
        pair.drive();
        assert!(std::iter::from_fn(|| pair.device.poll_event())
            .any(|event| event == Event::Refused(refused)));
    }
}

/// A device reaches nothing on the host but what a reverse forward of this
/// connection names: any other OPEN is answered CLSE at once, no stream is
/// made and the connection goes on (AOSP `adb.cpp` aborts the whole server).
#[test]
fn the_device_opens_only_what_a_reverse_asked_for() {
    for delayed_ack in [false, true] {
        let mut pair = Pair::new(
            config(Role::Host, delayed_ack),
            config(Role::Device, delayed_ack),
        );
        let refused_at_once = |pair: &mut Pair, service: &str| {
            let id = pair.device.open(service).unwrap();
            pair.drive();
            assert_eq!(pair.host.poll_event(), None, "{service} reached the host");
            assert_eq!(pair.device.poll_event(), Some(Event::Refused(id)));
            assert_eq!(pair.to_host.last().unwrap().command, Command::Open);
            assert_eq!(pair.to_device.last().unwrap().command, Command::Clse);
        };
        for service in [
            "tcp:8080",
            "localfilesystem:/run/docker.sock",
            "localabstract:x",
            "localreserved:x",
            "jdwp:1",
            "shell:",
        ] {
            refused_at_once(&mut pair, service);
        }
        pair.open("reverse:forward:tcp:9000;tcp:8080");
        // The device-side spec is no host spec.
        refused_at_once(&mut pair, "tcp:9000");
        pair.device.open("tcp:8080").unwrap();
        pair.drive();
        assert!(matches!(
            pair.host.poll_event(),
            Some(Event::OpenRequest { service, .. }) if service == "tcp:8080"
        ));
        pair.open("reverse:killforward:tcp:9000");
        refused_at_once(&mut pair, "tcp:8080");
        // Still online, and the host's own streams still work.
        let (host_id, device_id) = pair.open("shell:");
        pair.device.write(device_id, b"alive").unwrap();
        pair.drive();
        assert_eq!(read_all(&mut pair.host, host_id), b"alive");
    }
}

#[test]
fn peer_close_keeps_buffered_data_then_eof() {
    let mut pair = Pair::new(config(Role::Host, true), config(Role::Device, true));
    let (host_id, device_id) = pair.open("exec:true");
    pair.device.write(device_id, b"last words").unwrap();
    pair.device.close(device_id);
    pair.drive();
    // Data is sent before the CLSE, and the host answers CLSE with CLSE (as AOSP).
    let commands: Vec<Command> = pair
        .to_host
        .iter()
        .rev()
        .take(2)
        .map(|p| p.command)
        .collect();
    assert_eq!(commands, vec![Command::Clse, Command::Wrte]);
    assert_eq!(pair.to_device.last().unwrap().command, Command::Clse);
    let events: Vec<Event> = std::iter::from_fn(|| pair.host.poll_event()).collect();
    assert!(events.contains(&Event::Closed(host_id)));
    assert_eq!(read_all(&mut pair.host, host_id), b"last words");
    assert_eq!(pair.host.read(host_id, 10).unwrap(), Read::Eof);
    assert_eq!(
        pair.host.write(host_id, b"x"),
        Err(StreamError::Closed(host_id))
    );
    pair.host.close(host_id);
    pair.drive();
    assert_eq!(pair.host.stream_ids().count(), 0);
    assert_eq!(pair.device.stream_ids().count(), 0);
}

/// A device that keeps opening what nobody asked for is read at a pace
/// past its burst; a well-behaved one never is.
#[test]
fn a_flood_of_refused_opens_pauses_reading_past_its_burst() {
    let mut pair = Pair::new(config(Role::Host, false), config(Role::Device, false));
    pair.host.set_time(Duration::from_secs(1));
    let (_, device_id) = pair.open("shell:");
    pair.device.write(device_id, &pattern(1 << 20)).unwrap();
    pair.drive();
    assert_eq!(pair.host.reading_paused_until(), None, "ordinary traffic");
    let open = |id: u32| Packet::new(Command::Open, id, 0, &b"tcp:1\0"[..]);
    for id in 0..MISBEHAVIOUR_BURST as u32 {
        deliver(&mut pair.host, &pair.device, &open(1000 + id)).unwrap();
    }
    assert_eq!(pair.host.reading_paused_until(), None, "the burst");
    for id in 0..MISBEHAVIOUR_PER_SECOND as u32 {
        deliver(&mut pair.host, &pair.device, &open(5000 + id)).unwrap();
    }
    let until = pair.host.reading_paused_until().expect("paced");
    assert!(
        until > Duration::from_millis(1990) && until <= Duration::from_secs(2),
        "{until:?}"
    );
    pair.host.set_time(until);
    assert_eq!(pair.host.reading_paused_until(), None);
}

/// A peer repeating its CLSE gets neither another CLSE nor another
/// `Closed` (adbd removes the socket at the first).
#[test]
fn a_second_clse_is_ignored() {
    let mut pair = Pair::new(config(Role::Host, true), config(Role::Device, true));
    let (host_id, device_id) = pair.open("shell:");
    pair.device.write(device_id, b"unread").unwrap();
    pair.drive();
    let clse = Packet::new(Command::Clse, device_id.0, host_id.0, Bytes::new());
    for round in 0..3 {
        deliver(&mut pair.host, &pair.device, &clse).unwrap();
        let events: Vec<Event> = std::iter::from_fn(|| pair.host.poll_event()).collect();
        let answers: Vec<Packet> = std::iter::from_fn(|| pair.host.poll_transmit()).collect();
        let closed = events
            .iter()
            .filter(|e| **e == Event::Closed(host_id))
            .count();
        let clses = answers
            .iter()
            .filter(|p| p.command == Command::Clse)
            .count();
        assert_eq!((closed, clses), if round == 0 { (1, 1) } else { (0, 0) });
    }
    assert_eq!(read_all(&mut pair.host, host_id), b"unread");
    assert_eq!(pair.host.read(host_id, 10).unwrap(), Read::Eof);
}

#[test]
fn late_packets_for_closed_streams_are_ignored() {
    let mut pair = Pair::new(config(Role::Host, false), config(Role::Device, false));
    let (host_id, device_id) = pair.open("shell:");
    pair.device.close(device_id);
    // A WRTE the host sent before seeing the CLSE must not kill the connection.
    let late = Packet::new(Command::Wrte, host_id.0, device_id.0, &b"late"[..]);
    deliver(&mut pair.device, &pair.host, &late).unwrap();
}

#[test]
fn hostile_packets_are_protocol_errors() {
    let mut device = Connection::new(config(Role::Device, true));
    let open = Packet::new(Command::Open, 1, 0, &b"shell:\0"[..]);
    let header = open.header(false);
    assert_eq!(
        device.handle_packet(&header, open.payload.clone()),
        Err(ProtocolError::BeforeHandshake(Command::Open))
    );

    let mut pair = Pair::new(config(Role::Host, true), config(Role::Device, true));
    let wrte = Packet::new(Command::Wrte, 1, 999, &b"x"[..]);
    assert_eq!(
        deliver(&mut pair.device, &pair.host, &wrte),
        Err(ProtocolError::UnknownStream {
            command: Command::Wrte,
            id: 999
        })
    );
    let cnxn = Packet::new(Command::Cnxn, VERSION_SKIP_CHECKSUM, 4096, &b"garbage"[..]);
    assert!(matches!(
        pair.device
            .handle_packet(&cnxn.header(false), cnxn.payload.clone()),
        Err(ProtocolError::Banner(_))
    ));
}

#[test]
fn checksums_are_used_with_version_1_0_peers() {
    let mut host = config(Role::Host, false);
    host.version = VERSION_CHECKSUMMED;
    let mut pair = Pair::new(host, config(Role::Device, false));
    assert!(pair.device.checksums());
    let (host_id, device_id) = pair.open("exec:cat");
    let mut bad = Packet::new(Command::Wrte, host_id.0, device_id.0, &b"abc"[..]).header(true);
    bad.data_crc32 += 1;
    assert!(matches!(
        pair.device.handle_packet(&bad, Bytes::from_static(b"abc")),
        Err(ProtocolError::Checksum { .. })
    ));
    pair.host.write(host_id, b"abc").unwrap();
    pair.drive();
    assert_eq!(read_all(&mut pair.device, device_id), b"abc");
}

#[test]
fn many_streams_share_the_connection_fairly() {
    let mut host_config = config(Role::Host, true);
    host_config.max_payload = 4096;
    let mut pair = Pair::new(host_config, config(Role::Device, true));
    let streams: Vec<(StreamId, StreamId)> =
        (0..8).map(|i| pair.open(&format!("exec:{i}"))).collect();
    for (host_id, _) in &streams {
        pair.host.write(*host_id, &pattern(4096 * 3)).unwrap();
    }
    // The first 8 WRTEs go to 8 different streams (round robin).
    let first: Vec<u32> = (0..8)
        .map(|_| {
            let packet = pair.host.poll_transmit().unwrap();
            deliver(&mut pair.device, &pair.host, &packet).unwrap();
            packet.arg0
        })
        .collect();
    let mut sorted = first.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), 8, "{first:?}");
    // The adaptive window is two packets: reading returns credit, so read
    // and move packets until everything arrived.
    let mut received = vec![Vec::new(); streams.len()];
    for _ in 0..100 {
        pair.drive();
        for (i, (_, device_id)) in streams.iter().enumerate() {
            received[i].extend(read_all(&mut pair.device, *device_id));
        }
    }
    for data in received {
        assert_eq!(data, pattern(4096 * 3));
    }
}

#[test]
fn host_answers_auth_challenges() {
    let mut host = Connection::new(config(Role::Host, true));
    let cnxn = host.poll_transmit().unwrap();
    assert_eq!(cnxn.command, Command::Cnxn);
    // The device challenges instead of answering CNXN.
    let token = Packet::new(Command::Auth, AUTH_TOKEN, 0, vec![7u8; 20]);
    host.handle_packet(&token.header(false), token.payload.clone())
        .unwrap();
    assert_eq!(
        host.poll_event(),
        Some(Event::AuthChallenge {
            token: Bytes::from(vec![7u8; 20]),
            attempt: 1
        })
    );
    host.send_auth(AuthReply::Signature(Bytes::from_static(b"sig")));
    let reply = host.poll_transmit().unwrap();
    assert_eq!((reply.command, reply.arg0), (Command::Auth, AUTH_SIGNATURE));
    host.handle_packet(&token.header(false), token.payload.clone())
        .unwrap();
    assert!(matches!(
        host.poll_event(),
        Some(Event::AuthChallenge { attempt: 2, .. })
    ));
    host.send_auth(AuthReply::PublicKey(Bytes::from_static(b"key\0")));
    assert_eq!(host.poll_transmit().unwrap().arg0, AUTH_RSAPUBLICKEY);
    // A device never sends a signature to a host.
    let bogus = Packet::new(Command::Auth, AUTH_SIGNATURE, 0, vec![1u8]);
    assert_eq!(
        host.handle_packet(&bogus.header(false), bogus.payload.clone()),
        Err(ProtocolError::BadAuth(AUTH_SIGNATURE))
    );
}

/// Moves every packet `from` has for `to`; returns them.
fn pass(to: &mut Connection, from: &mut Connection) -> Vec<Packet> {
    let mut moved = Vec::new();
    while let Some(packet) = from.poll_transmit() {
        deliver(to, from, &packet).unwrap();
        moved.push(packet);
    }
    moved
}

fn auth_packet(kind: u32, payload: &'static [u8]) -> Packet {
    Packet::new(Command::Auth, kind, 0, Bytes::from_static(payload))
}

#[test]
fn a_device_requiring_auth_answers_cnxn_only_once_authorized() {
    let mut device_config = config(Role::Device, true);
    device_config.require_auth = true;
    let mut device = Connection::new(device_config);
    let mut host = Connection::new(config(Role::Host, true));
    pass(&mut device, &mut host);
    assert_eq!(device.poll_event(), Some(Event::TokenNeeded));
    assert!(device.awaiting_auth() && !device.is_online());
    assert!(device.poll_transmit().is_none(), "no CNXN before auth");

    device.send_auth_token(Bytes::from_static(&[1; 20]));
    let sent = pass(&mut host, &mut device);
    assert_eq!((sent[0].command, sent[0].arg0), (Command::Auth, AUTH_TOKEN));
    assert!(matches!(
        host.poll_event(),
        Some(Event::AuthChallenge { .. })
    ));

    // A signature is handed over with the token it must sign, once.
    let signature = auth_packet(AUTH_SIGNATURE, b"sig");
    deliver(&mut device, &host, &signature).unwrap();
    assert_eq!(
        device.poll_event(),
        Some(Event::AuthSignature {
            token: Bytes::from_static(&[1; 20]),
            signature: Bytes::from_static(b"sig"),
        })
    );
    deliver(&mut device, &host, &signature).unwrap();
    assert_eq!(
        device.poll_event(),
        None,
        "a second signature for a used token"
    );

    // Refused: a new token; the host offers its key, which the driver may trust.
    device.send_auth_token(Bytes::from_static(&[2; 20]));
    pass(&mut host, &mut device);
    let key = auth_packet(AUTH_RSAPUBLICKEY, b"key\0");
    deliver(&mut device, &host, &key).unwrap();
    assert_eq!(
        device.poll_event(),
        Some(Event::AuthPublicKey {
            key: Bytes::from_static(b"key\0")
        })
    );
    // Streams before authentication end the connection.
    let open = Packet::new(Command::Open, 1, 0, Bytes::from_static(b"shell:id\0"));
    assert_eq!(
        deliver(&mut device, &host, &open),
        Err(ProtocolError::BeforeAuth(Command::Open))
    );

    device.authorize();
    assert_eq!(device.poll_event(), Some(Event::Connected));
    let sent = pass(&mut host, &mut device);
    assert_eq!(sent.last().unwrap().command, Command::Cnxn);
    assert!(host.is_online() && device.is_online());
    assert_eq!(
        deliver(&mut device, &host, &signature),
        Err(ProtocolError::AuthWhenOnline)
    );
}

#[test]
fn auth_packets_out_of_place_are_protocol_errors() {
    let mut device_config = config(Role::Device, true);
    device_config.require_auth = true;
    let mut device = Connection::new(device_config);
    let host = Connection::new(config(Role::Host, true));
    // Before CNXN.
    assert_eq!(
        deliver(&mut device, &host, &auth_packet(AUTH_SIGNATURE, b"sig")),
        Err(ProtocolError::BeforeHandshake(Command::Auth))
    );
    let cnxn = Packet::new(
        Command::Cnxn,
        VERSION_SKIP_CHECKSUM,
        4096,
        Bytes::from_static(b"host::\0"),
    );
    deliver(&mut device, &host, &cnxn).unwrap();
    // A token sent to a device.
    assert_eq!(
        deliver(&mut device, &host, &auth_packet(AUTH_TOKEN, &[0; 20])),
        Err(ProtocolError::BadAuth(AUTH_TOKEN))
    );
}

#[test]
fn opens_beyond_the_stream_limit_are_refused() {
    let mut device_config = config(Role::Device, true);
    device_config.max_streams = 3;
    let mut pair = Pair::new(config(Role::Host, true), device_config);
    for _ in 0..3 {
        pair.open("sink:");
    }
    let refused = pair.host.open("sink:").unwrap();
    pair.drive();
    assert_eq!(pair.host.poll_event(), Some(Event::Refused(refused)));
    assert_eq!(pair.device.poll_event(), None);
}

/// A device's stream whose data waits for the host's credit from
/// `stall_at`, and an idle one.
struct Stalled {
    pair: Pair,
    stalled: StreamId,
    idle: StreamId,
    /// The stream's first packet, held in flight: in classic mode the host
    /// would OKAY it on arrival.
    held: Packet,
}

/// Starts a classic stream whose second write waits for credit from `stall_at`.
fn stalled_stream(device: Config, stall_at: Duration) -> Stalled {
    let mut pair = Pair::new(config(Role::Host, false), device);
    let (_, stalled) = pair.open("shell:yes");
    let (_, idle) = pair.open("shell:");
    pair.device.set_time(stall_at);
    pair.device.write(stalled, &pattern(8192)).unwrap();
    let held = pair.device.poll_transmit().unwrap();
    assert_eq!(held.command, Command::Wrte);
    pair.device.write(stalled, &pattern(8192)).unwrap();
    assert!(
        pair.device.poll_transmit().is_none(),
        "waiting for the OKAY"
    );
    Stalled {
        pair,
        stalled,
        idle,
        held,
    }
}

#[test]
fn streams_the_peer_stopped_crediting_are_aborted_exactly_at_the_limit() {
    let mut device = config(Role::Device, false);
    device.stalled_stream_timeout = Some(Duration::from_secs(300));
    let stall_at = Duration::from_millis(1500);
    let Stalled {
        mut pair,
        stalled,
        idle,
        held,
    } = stalled_stream(device, stall_at);
    let deadline = stall_at + Duration::from_secs(300);
    assert_eq!(pair.device.poll_timeout(), Some(deadline));
    pair.device
        .handle_timeout(deadline - Duration::from_nanos(1));
    assert_eq!(pair.device.poll_event(), None, "not before the limit");
    assert!(!pair.device.has_transmit());
    assert_eq!(pair.device.poll_timeout(), Some(deadline));

    pair.device.handle_timeout(deadline);
    assert_eq!(pair.device.poll_event(), Some(Event::Closed(stalled)));
    assert_eq!(pair.device.poll_event(), None, "an idle stream stays");
    let clse = pair.device.poll_transmit().unwrap();
    assert_eq!(
        (clse.command, clse.arg0, clse.arg1),
        (Command::Clse, stalled.0, held.arg1)
    );
    assert!(
        pair.device.poll_transmit().is_none(),
        "its queued data is dropped"
    );
    assert!(pair.device.stream_stats(idle).is_some());
    assert!(pair.device.write(stalled, b"more").is_err());
    assert_eq!(pair.device.poll_timeout(), None, "nothing left to wait for");
}

#[test]
fn no_timer_runs_while_nothing_waits() {
    let mut device = config(Role::Device, false);
    device.stalled_stream_timeout = Some(Duration::from_secs(300));
    let mut pair = Pair::new(config(Role::Host, false), device);
    assert_eq!(pair.device.poll_timeout(), None, "no streams");
    let (host_id, device_id) = pair.open("shell:");
    assert_eq!(pair.device.poll_timeout(), None, "an idle stream");
    // Data that leaves with credit to spare, acknowledged.
    pair.device.write(device_id, &pattern(100)).unwrap();
    pair.drive();
    assert_eq!(read_all(&mut pair.host, host_id).len(), 100);
    pair.drive();
    assert_eq!(pair.device.poll_timeout(), None, "credit came back");
    // Far in the future, nothing fires.
    pair.device.handle_timeout(Duration::from_secs(1 << 20));
    while let Some(event) = pair.device.poll_event() {
        assert!(!matches!(event, Event::Closed(_)), "{event:?}");
    }
    assert!(pair.device.stream_stats(device_id).is_some());

    // Without a limit a stalled stream has no deadline.
    let Stalled {
        mut pair, stalled, ..
    } = stalled_stream(config(Role::Device, false), Duration::ZERO);
    assert_eq!(pair.device.poll_timeout(), None);
    pair.device.handle_timeout(Duration::from_secs(1 << 20));
    assert_eq!(pair.device.poll_event(), None);
    assert!(pair.device.stream_stats(stalled).is_some());
}

#[test]
fn a_stall_that_ends_and_starts_again_moves_the_deadline_later() {
    let mut device = config(Role::Device, false);
    device.stalled_stream_timeout = Some(Duration::from_secs(10));
    let Stalled {
        mut pair,
        stalled,
        held,
        ..
    } = stalled_stream(device, Duration::from_secs(1));
    assert_eq!(pair.device.poll_timeout(), Some(Duration::from_secs(11)));
    // The host's OKAY for the first packet arrives at 8 s: the second
    // leaves (held in flight) and a third waits again from then on.
    deliver(&mut pair.host, &pair.device, &held).unwrap();
    let okay = pair.host.poll_transmit().unwrap();
    assert_eq!(okay.command, Command::Okay);
    pair.device.set_time(Duration::from_secs(8));
    deliver(&mut pair.device, &pair.host, &okay).unwrap();
    assert_eq!(pair.device.poll_transmit().unwrap().command, Command::Wrte);
    assert_eq!(pair.device.poll_timeout(), None, "nothing waits");
    pair.device.write(stalled, &pattern(100)).unwrap();
    assert_eq!(pair.device.poll_timeout(), Some(Duration::from_secs(18)));
    // Waking at the old deadline fires nothing.
    pair.device.handle_timeout(Duration::from_secs(11));
    assert_eq!(pair.device.poll_event(), None);
    pair.device.handle_timeout(Duration::from_secs(18));
    assert_eq!(pair.device.poll_event(), Some(Event::Closed(stalled)));
}

/// A stream the peer closed, or whose peer restarted (a second CNXN), has
/// its unsent data dropped: it waits for no credit any more, so the stall
/// timer must not close it later. It did (caught by the `host_connection`
/// fuzz target's property that the timer closes only streams with data
/// waiting): a second CLSE went to the peer, the application saw `Closed`
/// twice, and the stream went away with what it had not read yet.
#[test]
fn a_stream_the_peer_closed_waits_for_no_credit() {
    for restart in [false, true] {
        let mut device = config(Role::Device, false);
        device.stalled_stream_timeout = Some(Duration::from_secs(10));
        let Stalled {
            mut pair,
            stalled,
            held,
            ..
        } = stalled_stream(device, Duration::from_secs(1));
        let host_id = held.arg1;
        // Something from the host the device's application has not read.
        let unread = Packet::new(Command::Wrte, host_id, stalled.0, &b"unread"[..]);
        deliver(&mut pair.device, &pair.host, &unread).unwrap();
        assert_eq!(pair.device.poll_event(), Some(Event::Readable(stalled)));
        while pair.device.poll_transmit().is_some() {}
        assert_eq!(pair.device.poll_timeout(), Some(Duration::from_secs(11)));

        let end = if restart {
            let banner = pair.host.config().banner.encode();
            Packet::new(Command::Cnxn, VERSION_SKIP_CHECKSUM, MAX_PAYLOAD, banner)
        } else {
            Packet::new(Command::Clse, host_id, stalled.0, Bytes::new())
        };
        deliver(&mut pair.device, &pair.host, &end).unwrap();
        let events: Vec<Event> = std::iter::from_fn(|| pair.device.poll_event()).collect();
        assert!(events.contains(&Event::Closed(stalled)), "{events:?}");
        while pair.device.poll_transmit().is_some() {}

        assert_eq!(pair.device.poll_timeout(), None, "nothing waits for credit");
        pair.device.handle_timeout(Duration::from_secs(60));
        assert_eq!(pair.device.poll_event(), None, "closed once");
        assert!(pair.device.poll_transmit().is_none(), "one CLSE");
        assert_eq!(
            pair.device.read(stalled, 100),
            Ok(Read::Data(Bytes::from_static(b"unread")))
        );
        assert_eq!(pair.device.read(stalled, 100), Ok(Read::Eof));
    }
}

#[test]
fn a_refused_signature_gets_its_next_token_after_the_delay() {
    let mut device_config = config(Role::Device, true);
    device_config.require_auth = true;
    device_config.stalled_stream_timeout = Some(Duration::from_secs(300));
    let mut device = Connection::new(device_config);
    let mut host = Connection::new(config(Role::Host, true));
    pass(&mut device, &mut host);
    assert_eq!(device.poll_event(), Some(Event::TokenNeeded));
    assert_eq!(device.poll_timeout(), None, "no timer before a refusal");
    let challenge = |device: &mut Connection, host: &mut Connection, fill: u8| {
        device.send_auth_token(Bytes::from(vec![fill; 20]));
        pass(host, device);
        deliver(device, host, &auth_packet(AUTH_SIGNATURE, b"sig")).unwrap();
        assert!(matches!(
            device.poll_event(),
            Some(Event::AuthSignature { .. })
        ));
    };

    // No delay: the next token is asked for at once.
    challenge(&mut device, &mut host, 1);
    device.refuse_signature(Duration::ZERO);
    assert_eq!(device.poll_event(), Some(Event::TokenNeeded));
    assert_eq!(device.poll_timeout(), None);

    // A delay: nothing until it is over, then exactly one token.
    challenge(&mut device, &mut host, 2);
    device.set_time(Duration::from_secs(5));
    device.refuse_signature(Duration::from_millis(250));
    assert_eq!(device.poll_event(), None);
    let due = Duration::from_secs(5) + Duration::from_millis(250);
    assert_eq!(device.poll_timeout(), Some(due));
    device.handle_timeout(due - Duration::from_nanos(1));
    assert_eq!(device.poll_event(), None, "not before the delay");
    device.handle_timeout(due);
    assert_eq!(device.poll_event(), Some(Event::TokenNeeded));
    assert_eq!(device.poll_timeout(), None);
    device.handle_timeout(due + Duration::from_secs(1));
    assert_eq!(device.poll_event(), None, "once");

    // A host let in meanwhile is owed no token.
    challenge(&mut device, &mut host, 3);
    device.refuse_signature(Duration::from_secs(2));
    assert!(device.poll_timeout().is_some());
    device.authorize();
    assert_eq!(device.poll_event(), Some(Event::Connected));
    assert_eq!(device.poll_timeout(), None);
    device.handle_timeout(Duration::from_secs(60));
    assert_eq!(device.poll_event(), None);
    // Online, a refusal means nothing.
    device.refuse_signature(Duration::ZERO);
    assert_eq!(device.poll_event(), None);
}

/// A device bounded as over TCP (`handshake_timeout`, and `auth_timeout`
/// when `require_auth`) or, with `handshake_timeout` `None`, as over USB.
fn device_with_deadlines(
    handshake_timeout: Option<Duration>,
    auth_timeout: Option<Duration>,
    require_auth: bool,
) -> Connection {
    let mut device_config = config(Role::Device, true);
    device_config.handshake_timeout = handshake_timeout;
    device_config.auth_timeout = auth_timeout;
    device_config.require_auth = require_auth;
    Connection::new(device_config)
}

const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);
const AUTH_LIMIT: Duration = Duration::from_secs(60);

#[test]
fn a_peer_without_cnxn_times_out_exactly_at_the_handshake_limit() {
    let mut device = device_with_deadlines(Some(HANDSHAKE_LIMIT), Some(AUTH_LIMIT), true);
    assert_eq!(device.poll_timeout(), Some(HANDSHAKE_LIMIT));
    device.handle_timeout(HANDSHAKE_LIMIT - Duration::from_nanos(1));
    assert_eq!(device.poll_event(), None, "not before the limit");
    assert_eq!(device.poll_timeout(), Some(HANDSHAKE_LIMIT));

    device.handle_timeout(HANDSHAKE_LIMIT);
    assert_eq!(
        device.poll_event(),
        Some(Event::HandshakeTimedOut {
            stage: HandshakeStage::Cnxn,
            limit: HANDSHAKE_LIMIT,
        })
    );
    assert_eq!(device.poll_timeout(), None);
    // A CNXN read before the driver closed the connection is not answered.
    let mut host = Connection::new(config(Role::Host, true));
    pass(&mut device, &mut host);
    assert!(!device.is_online() && !device.awaiting_auth());
    assert_eq!(device.poll_event(), None);
    assert!(!device.has_transmit());
}

#[test]
fn a_host_that_never_finishes_stls_times_out_at_the_handshake_limit() {
    let (mut host, mut device) = tls_pair(Tls::Required, &[feature::SENDRECV_V2]);
    let mut device_config = device.config().clone();
    device_config.handshake_timeout = Some(HANDSHAKE_LIMIT);
    device_config.auth_timeout = Some(AUTH_LIMIT);
    device = Connection::new(device_config);
    device.set_time(Duration::from_secs(2));
    pass(&mut device, &mut host);
    assert!(device.tls_pending());
    assert_eq!(
        device.poll_timeout(),
        Some(HANDSHAKE_LIMIT),
        "still from the start"
    );
    device.handle_timeout(HANDSHAKE_LIMIT - Duration::from_nanos(1));
    assert_eq!(device.poll_event(), None);
    device.handle_timeout(HANDSHAKE_LIMIT);
    assert_eq!(
        device.poll_event(),
        Some(Event::HandshakeTimedOut {
            stage: HandshakeStage::Tls,
            limit: HANDSHAKE_LIMIT,
        })
    );
    assert!(!device.has_transmit(), "the unsent STLS is dropped");
    assert!(!device.tls_pending());
}

#[test]
fn over_tcp_authentication_counts_from_the_start() {
    let mut device = device_with_deadlines(Some(HANDSHAKE_LIMIT), Some(AUTH_LIMIT), true);
    let mut host = Connection::new(config(Role::Host, true));
    // CNXN in time, at 5 s: the handshake deadline is over, the
    // authentication one counts from the start, not from the CNXN.
    device.set_time(Duration::from_secs(5));
    pass(&mut device, &mut host);
    assert_eq!(device.poll_event(), Some(Event::TokenNeeded));
    device.send_auth_token(Bytes::from(vec![7; 20]));
    assert_eq!(device.poll_timeout(), Some(AUTH_LIMIT));
    device.handle_timeout(HANDSHAKE_LIMIT);
    assert_eq!(device.poll_event(), None, "CNXN came in time");
    device.handle_timeout(AUTH_LIMIT - Duration::from_nanos(1));
    assert_eq!(device.poll_event(), None);
    assert!(device.awaiting_auth());

    device.handle_timeout(AUTH_LIMIT);
    assert_eq!(
        device.poll_event(),
        Some(Event::HandshakeTimedOut {
            stage: HandshakeStage::Auth,
            limit: AUTH_LIMIT,
        })
    );
    assert!(!device.has_transmit(), "the unsent token is dropped");
    assert!(!device.awaiting_auth());
    assert_eq!(device.poll_timeout(), None);
    // Authorizing too late lets nobody in.
    device.authorize();
    assert!(!device.is_online());
    assert_eq!(device.poll_event(), None);
}

#[test]
fn over_usb_cnxn_has_no_deadline_and_authentication_counts_from_it() {
    let mut device = device_with_deadlines(None, Some(AUTH_LIMIT), true);
    assert_eq!(device.poll_timeout(), None);
    device.handle_timeout(Duration::from_secs(3600));
    assert_eq!(device.poll_event(), None, "the host may come any time");

    let mut host = Connection::new(config(Role::Host, true));
    let cnxn = host.poll_transmit().unwrap();
    deliver(&mut device, &host, &cnxn).unwrap();
    assert_eq!(device.poll_event(), Some(Event::TokenNeeded));
    let deadline = Duration::from_secs(3600) + AUTH_LIMIT;
    assert_eq!(device.poll_timeout(), Some(deadline));
    // The host repeats its CNXN (its adb server restarted): the time to
    // authenticate still counts from the first.
    device.set_time(Duration::from_secs(3630));
    deliver(&mut device, &host, &cnxn).unwrap();
    assert_eq!(device.poll_event(), Some(Event::TokenNeeded));
    assert_eq!(device.poll_timeout(), Some(deadline));
    device.handle_timeout(deadline - Duration::from_nanos(1));
    assert_eq!(device.poll_event(), None);
    device.handle_timeout(deadline);
    assert_eq!(
        device.poll_event(),
        Some(Event::HandshakeTimedOut {
            stage: HandshakeStage::Auth,
            limit: AUTH_LIMIT,
        })
    );
}

#[test]
fn a_completed_handshake_cancels_both_deadlines() {
    // Authenticated in time.
    let mut device = device_with_deadlines(Some(HANDSHAKE_LIMIT), Some(AUTH_LIMIT), true);
    let mut host = Connection::new(config(Role::Host, true));
    pass(&mut device, &mut host);
    assert_eq!(device.poll_event(), Some(Event::TokenNeeded));
    device.set_time(Duration::from_secs(3));
    device.authorize();
    assert_eq!(device.poll_event(), Some(Event::Connected));
    assert_eq!(device.poll_timeout(), None);
    device.handle_timeout(Duration::from_secs(3600));
    assert_eq!(device.poll_event(), None);
    assert!(device.is_online());
    // A second CNXN (the host restarted) asks it to authenticate again,
    // with no deadline: the handshake was done.
    let cnxn = host.config().banner.encode();
    let cnxn = Packet::new(Command::Cnxn, VERSION_SKIP_CHECKSUM, MAX_PAYLOAD, cnxn);
    deliver(&mut device, &host, &cnxn).unwrap();
    assert_eq!(device.poll_event(), Some(Event::TokenNeeded));
    assert!(device.awaiting_auth());
    assert_eq!(device.poll_timeout(), None);

    // No authentication asked for: CNXN in time is the whole handshake.
    let mut device = device_with_deadlines(Some(HANDSHAKE_LIMIT), Some(AUTH_LIMIT), false);
    let mut host = Connection::new(config(Role::Host, true));
    device.set_time(HANDSHAKE_LIMIT - Duration::from_nanos(1));
    pass(&mut device, &mut host);
    assert_eq!(device.poll_event(), Some(Event::Connected));
    assert_eq!(device.poll_timeout(), None);
    device.handle_timeout(AUTH_LIMIT);
    assert_eq!(device.poll_event(), None);
}

#[test]
fn no_handshake_deadline_by_default() {
    for role in [Role::Host, Role::Device] {
        let mut connection = Connection::new(config(role, true));
        assert_eq!(connection.poll_timeout(), None, "{role:?}");
        connection.handle_timeout(Duration::from_secs(1 << 20));
        assert_eq!(connection.poll_event(), None, "{role:?}");
    }
    let mut device = device_with_deadlines(None, None, true);
    let mut host = Connection::new(config(Role::Host, true));
    pass(&mut device, &mut host);
    assert_eq!(device.poll_event(), Some(Event::TokenNeeded));
    assert_eq!(device.poll_timeout(), None);
}

#[test]
fn a_peer_sending_beyond_its_credit_is_a_protocol_error() {
    for delayed_ack in [false, true] {
        let mut pair = Pair::new(
            config(Role::Host, delayed_ack),
            config(Role::Device, delayed_ack),
        );
        let (host_id, device_id) = pair.open("sink:");
        let remote = pair.to_host.last().unwrap().arg0;
        assert_eq!(remote, device_id.0);
        // Nobody reads on the device; the host forges WRTEs past every OKAY.
        let chunk = Bytes::from(vec![0u8; MAX_PAYLOAD as usize]);
        let mut result = Ok(());
        for _ in 0..64 {
            let wrte = Packet::new(Command::Wrte, host_id.0, device_id.0, chunk.clone());
            result = deliver(&mut pair.device, &pair.host, &wrte);
            while pair.device.poll_transmit().is_some() {}
            if result.is_err() {
                break;
            }
        }
        let error = result.expect_err("64 MiB into a stream nobody reads");
        assert!(
            matches!(error, ProtocolError::BeyondCredit { id, .. } if id == device_id.0),
            "{error}"
        );
        let held = pair.device.readable_bytes(device_id);
        assert!(
            held <= 34 * MAX_PAYLOAD as usize,
            "delayed_ack {delayed_ack}: held {held} before refusing"
        );
    }
}

#[test]
fn whole_chunks_keep_flowing() {
    for delayed_ack in [true, false] {
        let mut pair = Pair::new(
            config(Role::Host, delayed_ack),
            config(Role::Device, delayed_ack),
        );
        let (host_id, device_id) = pair.open("source:");
        let chunk = Bytes::from(vec![3u8; 64 * 1024]);
        let mut sent = 0usize;
        let mut received = 0usize;
        let mut idle_rounds = 0;
        while received < 400 * chunk.len() {
            let mut progressed = false;
            while sent < 400 && pair.device.is_writable(device_id) {
                pair.device.write_bytes(device_id, chunk.clone()).unwrap();
                sent += 1;
                progressed = true;
            }
            pair.drive();
            while let Read::Data(data) = pair.host.read(host_id, 64 * 1024).unwrap() {
                received += data.len();
                progressed = true;
            }
            pair.drive();
            if progressed {
                idle_rounds = 0;
            } else {
                idle_rounds += 1;
                assert!(idle_rounds < 3, "stalled after {sent} chunks sent, {received} bytes received (delayed_ack {delayed_ack})");
            }
        }
    }
}

/// xorshift64*: a fixed, dependency-free generator so failures replay exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One side of a randomised bidirectional transfer.
struct Side {
    connection: Connection,
    id: StreamId,
    to_send: Vec<u8>,
    sent: usize,
    received: Vec<u8>,
    /// Packets on the wire towards the other side, in order.
    wire: std::collections::VecDeque<Packet>,
}

impl Side {
    fn check_receive_bound(&self, max_payload: u64, seed: u64) {
        let Some(stats) = self.connection.stream_stats(self.id) else {
            return;
        };
        let (Some(window), Some(outstanding)) = (stats.window, stats.credit_outstanding) else {
            return;
        };
        // The sender stays within its credit but for one packet...
        let buffered = self.connection.readable_bytes(self.id) as u64;
        assert!(
            buffered <= outstanding + max_payload,
            "seed {seed}: {buffered} bytes buffered, {outstanding} granted and unconsumed"
        );
        // ...so with a budget, what it holds is the budget's share plus its
        // one-packet floor and the one-packet overshoot.
        if let Some(budget) = &self.connection.config().memory_budget {
            assert!(
                buffered <= budget.limits().limit + 2 * max_payload,
                "seed {seed}: {buffered} bytes buffered over a budget of {}",
                budget.limits().limit
            );
        }
        // The window never goes beyond the per-stream cap.
        assert!(
            window <= u64::from(AOSP_INITIAL_CREDIT),
            "seed {seed}: window {window}"
        );
    }
}

#[test]
fn randomised_transfers_complete_within_credit_under_every_policy_pair() {
    let policies = [
        (
            true,
            CreditPolicy::Adaptive {
                max_window: 1 << 20,
            },
        ),
        (true, CreditPolicy::Aosp),
        (
            false,
            CreditPolicy::Adaptive {
                max_window: 1 << 20,
            },
        ),
    ];
    for seed in 1..=2000u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let max_payload = [4096u32, 16 * 1024, 64 * 1024][rng.below(3) as usize];
        let make = |role: Role, rng: &mut Rng| {
            let (delayed, policy) = policies[rng.below(3) as usize];
            let mut config = config(role, delayed);
            config.max_payload = max_payload;
            config.credit_policy = policy;
            config.initial_credit = 8 * 1024 + rng.below(256 * 1024) as u32;
            config.local_buffer = rng.below(2 * max_payload as u64) as usize;
            config.ack_headroom = rng.below(2) == 0;
            if rng.below(2) == 0 {
                let limit = 16 * 1024 + rng.below(1 << 20);
                config.memory_budget = Some(std::sync::Arc::new(MemoryBudget::new(
                    BudgetLimits::from_limit(limit),
                )));
            }
            config
        };
        let host_config = make(Role::Host, &mut rng);
        let device_config = make(Role::Device, &mut rng);
        let budgets: Vec<_> = [&host_config, &device_config]
            .iter()
            .filter_map(|c| c.memory_budget.clone())
            .collect();
        let mut pair = Pair::new(host_config, device_config);
        let (host_id, device_id) = pair.open("exec:cat");
        let mut sides = [
            Side {
                connection: pair.host,
                id: host_id,
                to_send: pattern(rng.below(600_000) as usize),
                sent: 0,
                received: Vec::new(),
                wire: Default::default(),
            },
            Side {
                connection: pair.device,
                id: device_id,
                to_send: pattern(rng.below(600_000) as usize),
                sent: 0,
                received: Vec::new(),
                wire: Default::default(),
            },
        ];
        let mut now_us = 0u64;
        let mut steps = 0;
        let done = |sides: &[Side; 2]| {
            sides[0].received.len() == sides[1].to_send.len()
                && sides[1].received.len() == sides[0].to_send.len()
        };
        while !done(&sides) {
            steps += 1;
            assert!(steps < 200_000, "seed {seed}: stalled (deadlock?)");
            now_us += rng.below(300);
            let who = rng.below(2) as usize;
            let side = &mut sides[who];
            side.connection
                .set_time(std::time::Duration::from_micros(now_us));
            match rng.below(4) {
                0 => {
                    let end = (side.sent + 1 + rng.below(100_000) as usize).min(side.to_send.len());
                    if let Ok(n) = side
                        .connection
                        .write(side.id, &side.to_send[side.sent..end])
                    {
                        side.sent += n;
                    }
                }
                1 => {
                    while let Some(packet) = side.connection.poll_transmit() {
                        side.wire.push_back(packet);
                    }
                }
                2 => {
                    let max = 1 + rng.below(80_000) as usize;
                    if let Ok(Read::Data(chunk)) = side.connection.read(side.id, max) {
                        side.received.extend_from_slice(&chunk);
                    }
                }
                _ => {
                    let count = 1 + rng.below(4);
                    let [a, b] = &mut sides;
                    let (from, to) = if who == 0 { (a, b) } else { (b, a) };
                    to.connection
                        .set_time(std::time::Duration::from_micros(now_us));
                    for _ in 0..count {
                        let Some(packet) = from.wire.pop_front() else {
                            break;
                        };
                        deliver(&mut to.connection, &from.connection, &packet).unwrap();
                    }
                    to.check_receive_bound(u64::from(max_payload), seed);
                }
            }
        }
        assert_eq!(sides[0].received, sides[1].to_send, "seed {seed}");
        assert_eq!(sides[1].received, sides[0].to_send, "seed {seed}");
        drop(sides);
        for budget in budgets {
            // Beyond the limit only what cannot be refused: the stream's
            // floor, the sender's overshoot and a partly read packet.
            assert!(
                budget.peak() <= budget.limits().limit + 3 * u64::from(max_payload),
                "seed {seed}: budget exceeded"
            );
            assert_eq!(budget.committed(), 0, "seed {seed}: budget leaked");
        }
    }
}

/// Many streams on one connection draw from one small budget while their
/// consumers read at random (some stall for long stretches): the device never
/// holds more than the budget plus each stream's floor and one-packet
/// overshoot, every transfer completes, and the budget is whole again after.
#[test]
fn streams_sharing_a_small_budget_stay_within_it_and_complete() {
    for seed in 1..=60u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let max_payload = [4096u32, 16 * 1024][rng.below(2) as usize];
        let limit = 8 * u64::from(max_payload) + rng.below(256 * 1024);
        let budget = std::sync::Arc::new(MemoryBudget::new(BudgetLimits::from_limit(limit)));
        let mut host_config = config(Role::Host, true);
        host_config.max_payload = max_payload;
        host_config.send_buffer = 4 * max_payload as usize;
        let mut device_config = config(Role::Device, true);
        device_config.max_payload = max_payload;
        device_config.memory_budget = Some(budget.clone());
        device_config.ack_headroom = rng.below(2) == 0;
        let mut pair = Pair::new(host_config, device_config);
        let streams = 2 + rng.below(23) as usize;
        let ids: Vec<_> = (0..streams).map(|_| pair.open("exec:cat")).collect();
        let sizes: Vec<usize> = (0..streams)
            .map(|_| 1 + rng.below(400_000) as usize)
            .collect();
        let mut sent = vec![0usize; streams];
        let mut received = vec![0usize; streams];
        // A stalled consumer reads nothing until this step.
        let stalled_until: Vec<u64> = (0..streams)
            .map(|_| {
                if rng.below(3) == 0 {
                    rng.below(3000)
                } else {
                    0
                }
            })
            .collect();
        let bound = limit + streams as u64 * 2 * u64::from(max_payload);
        let mut now_us = 0u64;
        let mut step = 0u64;
        while received != sizes {
            step += 1;
            assert!(
                step < 500_000,
                "seed {seed}: stalled at {received:?} of {sizes:?}"
            );
            // Steps of up to 20 ms: round trips long enough for windows to grow
            // past what the budget allows them all.
            now_us += rng.below(20_000);
            pair.host.set_time(std::time::Duration::from_micros(now_us));
            pair.device
                .set_time(std::time::Duration::from_micros(now_us));
            let s = rng.below(streams as u64) as usize;
            let (host_id, device_id) = ids[s];
            if rng.below(2) == 0 && sent[s] < sizes[s] {
                let end = (sent[s] + 1 + rng.below(50_000) as usize).min(sizes[s]);
                sent[s] += pair.host.write(host_id, &pattern(end - sent[s])).unwrap();
            } else if step >= stalled_until[s] {
                let max = 1 + rng.below(40_000) as usize;
                if let Ok(Read::Data(chunk)) = pair.device.read(device_id, max) {
                    received[s] += chunk.len();
                }
            }
            pair.drive();
            let buffered: u64 = ids
                .iter()
                .map(|&(_, d)| pair.device.readable_bytes(d) as u64)
                .sum();
            assert!(
                buffered <= bound,
                "seed {seed}: {buffered} bytes held over a budget of {limit} ({streams} streams)"
            );
        }
        // Beyond the limit only what cannot be refused: each stream's floor,
        // its sender's overshoot and a partly read packet.
        assert!(budget.peak() <= limit + streams as u64 * 3 * u64::from(max_payload));
        drop(pair);
        assert_eq!(budget.committed(), 0, "seed {seed}: budget leaked");
    }
}

/// A consumer that reads nothing for 10 ms stalls the sender for as long:
/// the receiver counts it as time blocked on its consumer, the sender as
/// time blocked on credit.
#[test]
fn blocked_time_is_charged_to_the_consumer_and_to_credit() {
    let mut host_config = config(Role::Host, true);
    host_config.max_payload = 64 * 1024;
    host_config.send_buffer = 1 << 20;
    let mut device_config = config(Role::Device, true);
    device_config.max_payload = 64 * 1024;
    let mut pair = Pair::new(host_config, device_config);
    let (host_id, device_id) = pair.open("exec:cat");
    let at = |pair: &mut Pair, ms: u64| {
        let now = std::time::Duration::from_millis(ms);
        pair.host.set_time(now);
        pair.device.set_time(now);
    };
    at(&mut pair, 1);
    pair.host.write(host_id, &pattern(1 << 20)).unwrap();
    pair.drive();
    // The two-packet window is full; nobody reads until 11 ms.
    at(&mut pair, 11);
    let device = pair.device.stream_stats(device_id).unwrap();
    let host = pair.host.stream_stats(host_id).unwrap();
    assert_eq!(device.consumer_blocked_ns, 10_000_000, "{device:?}");
    assert_eq!(host.credit_blocked_ns, 10_000_000, "{host:?}");
    let mut received = 0;
    while received < 1 << 20 {
        received += read_all(&mut pair.device, device_id).len();
        pair.drive();
    }
    at(&mut pair, 20);
    let device = pair.device.stream_stats(device_id).unwrap();
    let host = pair.host.stream_stats(host_id).unwrap();
    assert_eq!(
        device.consumer_blocked_ns, 10_000_000,
        "the consumer caught up at 11 ms"
    );
    assert_eq!(
        host.credit_blocked_ns, 10_000_000,
        "nothing waits after 11 ms"
    );
}

/// A credit mode decides both what the banner offers and how grants are made.
#[test]
fn a_credit_mode_sets_the_banner_and_the_policy_together() {
    let mut config = config(Role::Host, false);
    config.set_credit_mode(CreditMode::Aosp);
    assert_eq!(config.banner.features, ["shell_v2", "delayed_ack"]);
    assert_eq!(config.credit_policy, CreditPolicy::Aosp);
    config.set_credit_mode(CreditMode::Adaptive);
    assert_eq!(config.banner.features, ["shell_v2", "delayed_ack"]);
    assert_eq!(
        config.credit_policy,
        CreditPolicy::Adaptive {
            max_window: MAX_ADAPTIVE_WINDOW
        }
    );
    config.set_credit_mode(CreditMode::Classic);
    assert_eq!(config.banner.features, ["shell_v2"]);
}

/// Appended payloads are taken as `write` takes bytes (a send buffer's room
/// at a time) and cut into the same WRTEs as the same bytes written.
#[test]
fn appended_payloads_make_the_same_packets_as_written_bytes() {
    let data = pattern(5 * 1024 * 1024 + 300);
    let mut sizes = Vec::new();
    for append in [false, true] {
        let mut host_config = config(Role::Host, true);
        host_config.send_buffer = 3 * 1024 * 1024;
        let mut pair = Pair::new(host_config, config(Role::Device, true));
        let (host_id, device_id) = pair.open("sink:");
        let sent_before = pair.to_device.len();
        let mut offset = 0;
        let mut received = Vec::new();
        // Batches of 1 MiB + 128, as a push's 16 DATA frames.
        while received.len() < data.len() {
            while offset < data.len() {
                let end = (offset + 1024 * 1024 + 128).min(data.len());
                let want = end - offset;
                let taken = if append {
                    let mut payload =
                        oxadb_wire::Payload::from(Bytes::copy_from_slice(&data[offset..end]));
                    let taken = pair.host.append_payload(host_id, &mut payload).unwrap();
                    assert_eq!(payload.len(), end - offset - taken, "the rest stays");
                    taken
                } else {
                    pair.host.write(host_id, &data[offset..end]).unwrap()
                };
                offset += taken;
                if taken < want {
                    break; // the send buffer is full
                }
            }
            pair.drive();
            received.extend_from_slice(&read_all(&mut pair.device, device_id));
            pair.drive();
        }
        assert_eq!(received, data);
        sizes.push(
            pair.to_device[sent_before..]
                .iter()
                .filter(|p| p.command == Command::Wrte)
                .map(|p| p.payload.len())
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(sizes[0], sizes[1]);
    assert!(sizes[0].iter().all(|&n| n <= 1024 * 1024));
}

/// A file range's source that must never be touched: the engine only
/// counts a range's length and hands it to the driver.
#[derive(Debug)]
struct Untouchable;

impl oxadb_wire::RangeSource for Untouchable {
    fn sendfile_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        panic!("the engine asked for a descriptor")
    }
    fn sendfile_refused(&self) {
        panic!("the engine sent a file")
    }
    fn sent(&self, _: u64) {
        panic!("the engine sent a file")
    }
    fn read_exact_at(&self, _: &mut [u8], _: u64) -> std::io::Result<()> {
        panic!("the engine read a file")
    }
    fn shrank(&self, _: u64) -> std::io::Error {
        panic!("the engine read a file")
    }
}

#[test]
fn file_ranges_pass_through_the_engine_unread() {
    let mut pair = Pair::new(config(Role::Host, true), config(Role::Device, true));
    let (host_id, _) = pair.open("sink:");
    let source: std::sync::Arc<dyn oxadb_wire::RangeSource> = std::sync::Arc::new(Untouchable);
    let mut payload = oxadb_wire::Payload::from(Bytes::from_static(b"DATA\0\0\x01\0"));
    payload.push(oxadb_wire::Part::File(oxadb_wire::FileRange {
        source: source.clone(),
        offset: 4096,
        len: 65536,
    }));
    pair.host.write_payload(host_id, payload).unwrap();
    let outgoing = pair.host.poll_outgoing().unwrap();
    assert_eq!(outgoing.command, Command::Wrte);
    let header = pair.host.header_for_outgoing(&outgoing);
    assert_eq!(header.data_length, 8 + 65536);
    let parts: Vec<_> = outgoing.payload.parts().cloned().collect();
    let oxadb_wire::Part::File(range) = &parts[1] else {
        panic!("the range was not handed on: {parts:?}");
    };
    assert!(std::sync::Arc::ptr_eq(&range.source, &source));
    assert_eq!((range.offset, range.len), (4096, 65536));
    assert!(outgoing.into_packet().is_none(), "not in memory");
}

/// Moves every queued packet from `from` to `to`; returns their commands.
fn flush(from: &mut Connection, to: &mut Connection) -> Vec<Command> {
    let mut commands = Vec::new();
    while let Some(packet) = from.poll_transmit() {
        deliver(to, from, &packet).unwrap();
        commands.push(packet.command);
    }
    commands
}

fn tls_pair(device_tls: Tls, host_features: &[&str]) -> (Connection, Connection) {
    let mut host_config = config(Role::Host, true);
    host_config.tls = Tls::On;
    for f in host_features {
        host_config.banner.features.push(f.to_string());
    }
    let mut device_config = config(Role::Device, true);
    device_config.tls = device_tls;
    device_config.require_auth = true;
    (Connection::new(host_config), Connection::new(device_config))
}

#[test]
fn stls_replaces_auth_and_cnxn_follows_tls() {
    let (mut host, mut device) = tls_pair(Tls::Required, &[feature::SENDRECV_V2]);
    assert_eq!(flush(&mut host, &mut device), vec![Command::Cnxn]);
    // The device answers CNXN with STLS, not AUTH, and asks for no token.
    let Some(packet) = device.poll_transmit() else {
        panic!("no answer to CNXN");
    };
    assert_eq!(
        (packet.command, packet.arg0, packet.arg1),
        (Command::Stls, STLS_VERSION, 0)
    );
    assert_eq!(device.poll_event(), None);
    deliver(&mut host, &device, &packet).unwrap();
    // The host answers STLS with STLS; both now run the TLS handshake.
    assert!(host.starting_tls());
    assert_eq!(flush(&mut host, &mut device), vec![Command::Stls]);
    assert!(device.starting_tls());
    assert!(!device.has_transmit() && !host.has_transmit());
    device.tls_established();
    host.tls_established();
    assert_eq!(flush(&mut device, &mut host), vec![Command::Cnxn]);
    assert!(host.is_online() && device.is_online());
    assert_eq!(host.poll_event(), Some(Event::Connected));
    assert_eq!(device.poll_event(), Some(Event::Connected));
}

#[test]
fn tls_on_gives_old_hosts_plaintext_and_required_refuses_them() {
    let (mut host, mut device) = tls_pair(Tls::On, &[]);
    assert_eq!(flush(&mut host, &mut device), vec![Command::Cnxn]);
    assert_eq!(device.poll_event(), Some(Event::TokenNeeded));
    assert!(!device.starting_tls());

    let (mut host, mut device) = tls_pair(Tls::Required, &[]);
    let packet = host.poll_transmit().unwrap();
    assert_eq!(
        deliver(&mut device, &host, &packet),
        Err(ProtocolError::TlsRequired)
    );
}

#[test]
fn stls_is_refused_where_not_expected() {
    // A host with TLS off, and a device that never sent STLS.
    let mut host_config = config(Role::Host, false);
    host_config.tls = Tls::Off;
    let mut host = Connection::new(host_config);
    let stls = Packet::new(Command::Stls, STLS_VERSION, 0, Bytes::new());
    let device = Connection::new(config(Role::Device, false));
    assert!(matches!(
        deliver(&mut host, &device, &stls),
        Err(ProtocolError::UnexpectedStls(_))
    ));
    let mut device = Connection::new(config(Role::Device, false));
    let host = Connection::new(config(Role::Host, false));
    assert!(matches!(
        deliver(&mut device, &host, &stls),
        Err(ProtocolError::UnexpectedStls(_))
    ));
    // A version other than AOSP's only one.
    let (mut host, mut device) = tls_pair(Tls::Required, &[feature::SENDRECV_V2]);
    flush(&mut host, &mut device);
    let bad = Packet::new(Command::Stls, 2, 0, Bytes::new());
    assert_eq!(
        deliver(&mut device, &host, &bad),
        Err(ProtocolError::BadStlsVersion(2))
    );
}

#[test]
fn a_host_stls_that_follows_its_tls_handshake_is_ignored_once() {
    let (mut host, mut device) = tls_pair(Tls::Required, &[feature::SENDRECV_V2]);
    flush(&mut host, &mut device);
    assert_eq!(flush(&mut device, &mut host), vec![Command::Stls]);
    // The host's TLS began before its STLS arrived.
    device.tls_began_early();
    assert!(device.starting_tls());
    device.tls_established();
    host.tls_established();
    let stls = host.poll_transmit().unwrap();
    assert_eq!(stls.command, Command::Stls);
    deliver(&mut device, &host, &stls).unwrap();
    assert_eq!(flush(&mut device, &mut host), vec![Command::Cnxn]);
    assert!(device.is_online() && host.is_online());
    assert!(matches!(
        deliver(&mut device, &host, &stls),
        Err(ProtocolError::UnexpectedStls(_))
    ));
}
