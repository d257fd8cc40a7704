//! The host's connection engine (`oxadb_engine::Connection` in `Role::Host`)
//! against a device, which the host does not trust.
//!
//! Input: a byte choosing the host's configuration (credit mode, small
//! buffers, stream limit, stall timeout, memory budget), a byte choosing the
//! device's CNXN (fed first, so every input is online), then operations, each
//! an opcode byte and its operands: a device packet, either 24 raw header bytes
//! and the payload they announce or a command, ids and payload framed with
//! the right magic and checksum; or a host action: open a service (reverse
//! forwards above all), accept or refuse an OPEN from the device, write, read
//! or close a stream, let time pass. Device packets go through
//! `Header::decode` with the engine's `max_incoming_payload()`, as a driver
//! reads them; a header or protocol error ends the input, as it ends the
//! connection.
#![no_main]

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use oxadb_engine::{
    BudgetLimits, Config, Connection, CreditMode, CreditPolicy, Event, MemoryBudget, Read, Role,
    StreamId,
};
use oxadb_wire::packet::{VERSION_CHECKSUMMED, VERSION_SKIP_CHECKSUM};
use oxadb_wire::{feature, Banner, Command, Header, Packet, HEADER_LEN, MAX_PAYLOAD};

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let (Some(host), Some(device)) = (input.byte(), input.byte()) else {
        return;
    };
    let budget = (host & 0x80 != 0)
        .then(|| Arc::new(MemoryBudget::new(BudgetLimits::from_limit(16 * 1024))));
    let mut host = Host::new(host_config(host, budget.clone()));
    host.device_cnxn(device);
    while let Some(op) = input.byte() {
        if host.step(op, &mut input).is_none() {
            break;
        }
    }
    // Whatever the device did, nothing stays charged to the process's
    // budget once its connection is gone.
    drop(host);
    if let Some(budget) = budget {
        assert_eq!(budget.committed(), 0, "budget leaked");
    }
});

/// The fuzz input, read from the front.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (taken, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(taken)
    }

    /// A u32 that is usually small, as stream ids are: one byte below 0xf0,
    /// else the four bytes that follow.
    fn number(&mut self) -> Option<u32> {
        match self.byte()? {
            b if b < 0xf0 => Some(u32::from(b)),
            _ => Some(u32::from_le_bytes(self.take(4)?.try_into().unwrap())),
        }
    }

    /// Text from a length byte and that many bytes (invalid UTF-8 replaced).
    fn text(&mut self) -> Option<String> {
        let len = usize::from(self.byte()?);
        Some(String::from_utf8_lossy(self.take(len)?).into_owned())
    }
}

/// Specs as `adb reverse` takes them, and some that are malformed on one
/// side or the other.
const SPECS: &[&str] = &[
    "tcp:8080",
    "tcp:9000",
    "tcp:1",
    "localabstract:x",
    "localfilesystem:/tmp/s",
    "",
    "*smartsocket*",
    "tcp:1;tcp:2",
    "norebind:tcp:1",
    "tcp:8080\0",
];

/// Services a host opens that are no reverse forward (or a malformed one).
const OTHER_SERVICES: &[&str] = &[
    "shell,v2,raw:id",
    "sync:",
    "tcp:8080",
    "reverse:list-forward",
    "reverse:forward:tcp:1",
    "reverse:killforward:",
    "reverse:",
    "reversed:forward:tcp:1;tcp:8080",
];

fn spec(input: &mut Input) -> Option<String> {
    match input.byte()? {
        b if b < 0x80 => Some(SPECS[usize::from(b) % SPECS.len()].to_string()),
        b => {
            let len = usize::from(b & 0x0f);
            Some(String::from_utf8_lossy(input.take(len)?).into_owned())
        }
    }
}

fn service(input: &mut Input) -> Option<String> {
    Some(match input.byte()? % 7 {
        0 => format!("reverse:forward:{};{}", spec(input)?, spec(input)?),
        1 => format!("reverse:forward:norebind:{};{}", spec(input)?, spec(input)?),
        2 => format!("reverse:killforward:{}", spec(input)?),
        3 => "reverse:killforward-all".to_string(),
        4 => format!("reverse:forward:{};{}", spec(input)?, input.text()?),
        5 => OTHER_SERVICES[usize::from(input.byte()?) % OTHER_SERVICES.len()].to_string(),
        _ => input.text()?,
    })
}

/// Bit 0-1: credit mode (classic, AOSP's, adaptive); bit 2: a 64-byte local
/// buffer; bit 3: a 64-byte send buffer; bit 4: three streams at most;
/// bit 5: stalled streams close after 1 s; bit 6: small grants; bit 7: a
/// 16 KiB memory budget.
fn host_config(control: u8, budget: Option<Arc<MemoryBudget>>) -> Config {
    let mut banner = Banner::new("host");
    banner.features = vec![
        feature::SHELL_V2.into(),
        feature::SENDRECV_V2.into(),
        feature::STAT_V2.into(),
    ];
    let mut config = Config::new(Role::Host, banner);
    config.set_credit_mode(match control & 3 {
        0 => CreditMode::Classic,
        1 => CreditMode::Aosp,
        _ => CreditMode::Adaptive,
    });
    if control & 0x04 != 0 {
        config.local_buffer = 64;
    }
    if control & 0x08 != 0 {
        config.send_buffer = 64;
    }
    if control & 0x10 != 0 {
        config.max_streams = 3;
    }
    if control & 0x20 != 0 {
        config.stalled_stream_timeout = Some(Duration::from_secs(1));
    }
    if control & 0x40 != 0 {
        config.initial_credit = 256;
        if let CreditPolicy::Adaptive { .. } = config.credit_policy {
            config.credit_policy = CreditPolicy::Adaptive { max_window: 512 };
        }
    }
    config.memory_budget = budget;
    config
}

/// What the host should do with a device's OPEN, worked out before the
/// engine sees it.
#[derive(Debug, PartialEq)]
enum OpenAnswer {
    /// Remote id 0: nothing to answer.
    Ignore,
    /// CLSE to the device; the host's application never hears of it.
    Refuse,
    /// An `Event::OpenRequest` for this service.
    Request(String),
}

/// The reverse forwards the host asked for, from the `reverse:` services it
/// opened, as the device applies them (AOSP daemon/services.cpp hands them
/// to adb.cpp handle_forward_request): device spec to host spec.
#[derive(Debug, Default)]
struct Reverses(Vec<(String, String)>);

impl Reverses {
    fn opened(&mut self, service: &str) {
        let Some(request) = service.strip_prefix("reverse:") else {
            return;
        };
        if request == "killforward-all" {
            self.0.clear();
        } else if let Some(device) = request.strip_prefix("killforward:") {
            if !device.is_empty() && !device.contains(';') {
                self.0.retain(|(d, _)| d != device);
            }
        } else if let Some(rest) = request.strip_prefix("forward:") {
            let (norebind, pair) = match rest.strip_prefix("norebind:") {
                Some(pair) => (true, pair),
                None => (false, rest),
            };
            // LOCAL;REMOTE: two specs, neither empty, the host's not a
            // `*smartsocket*`-like name.
            let specs: Vec<&str> = pair.split(';').collect();
            let [device, host] = specs[..] else {
                return;
            };
            if device.is_empty() || host.is_empty() || host.starts_with('*') {
                return;
            }
            match self.0.iter_mut().find(|(d, _)| d == device) {
                // The device refuses to rebind a spec under norebind.
                Some(_) if norebind => {}
                Some(forward) => forward.1 = host.to_string(),
                None => self.0.push((device.to_string(), host.to_string())),
            }
        }
    }

    fn permits(&self, service: &str) -> bool {
        self.0.iter().any(|(_, host)| host == service)
    }
}

struct Host {
    conn: Connection,
    now: Duration,
    reverses: Reverses,
    /// The host's OPENs with an `Opened` or `Refused` still owed.
    opening: HashSet<u32>,
    /// Every stream id the host was given: its OPENs, the device's.
    known: Vec<StreamId>,
    /// The device's OPENs the host has not answered.
    pending: Vec<StreamId>,
    /// Streams the host closed.
    closed: HashSet<u32>,
    /// What the host wrote on each stream, and how much of it left as WRTE.
    written: HashMap<u32, (Vec<u8>, usize)>,
    /// Streams whose unsent data the engine dropped: the device closed
    /// them, or restarted.
    dropped: HashSet<u32>,
    /// What the device sent on each stream that the host has not read.
    unread: HashMap<u32, VecDeque<u8>>,
    /// The most each stream may hold unread (`holding_bound`).
    bound: HashMap<u32, usize>,
}

impl Host {
    fn new(config: Config) -> Host {
        let mut conn = Connection::new(config);
        // The host speaks first: its CNXN, nothing else.
        let cnxn = conn.poll_transmit().expect("the host's CNXN");
        assert_eq!(cnxn.command, Command::Cnxn);
        assert!(conn.poll_transmit().is_none());
        Host {
            conn,
            now: Duration::ZERO,
            reverses: Reverses::default(),
            opening: HashSet::new(),
            known: Vec::new(),
            pending: Vec::new(),
            closed: HashSet::new(),
            written: HashMap::new(),
            dropped: HashSet::new(),
            unread: HashMap::new(),
            bound: HashMap::new(),
        }
    }

    /// The device's CNXN. Bits 0-1: its max payload (64 bytes to 1 MiB);
    /// bit 2: it offers delayed_ack; bit 3: protocol version 1.0, which
    /// checksums payloads.
    fn device_cnxn(&mut self, control: u8) {
        let mut banner = Banner::new("device");
        banner
            .properties
            .push(("ro.product.name".into(), "fuzz".into()));
        banner.features = vec![feature::SHELL_V2.into()];
        if control & 4 != 0 {
            banner.features.push(feature::DELAYED_ACK.into());
        }
        let max_payload = [64, 256, 4096, MAX_PAYLOAD][usize::from(control & 3)];
        let version = if control & 8 != 0 {
            VERSION_CHECKSUMMED
        } else {
            VERSION_SKIP_CHECKSUM
        };
        let packet = Packet::new(
            Command::Cnxn,
            version,
            max_payload,
            banner.encode().into_bytes(),
        );
        assert_eq!(self.packet(&packet), Some(()), "the device's CNXN");
        let peer = self.conn.peer().expect("online");
        assert_eq!(peer.max_payload, max_payload);
        assert_eq!(self.conn.max_incoming_payload(), max_payload);
    }

    /// One operation, by `op % 10`: 0-1 a raw device packet, 2-3 a framed
    /// one (its command from `op >> 5`), 4 open, 5 accept (refuse with bit
    /// 7), 6 write, 7 read, 8 close, 9 let time pass. `None` ends the input.
    fn step(&mut self, op: u8, input: &mut Input) -> Option<()> {
        match op % 10 {
            // As the wire carries it: any header, then its payload.
            0 | 1 => {
                let raw: [u8; HEADER_LEN] = input.take(HEADER_LEN)?.try_into().unwrap();
                let header = Header::decode(&raw, self.conn.max_incoming_payload()).ok()?;
                let payload = input.take(header.data_length as usize)?;
                self.device(header, Bytes::copy_from_slice(payload))
            }
            // A well-framed packet: any command, ids and payload.
            2 | 3 => {
                let command = [
                    Command::Open,
                    Command::Okay,
                    Command::Wrte,
                    Command::Clse,
                    Command::Wrte,
                    Command::Cnxn,
                    Command::Auth,
                    Command::Stls,
                ][usize::from(op >> 5)];
                let (arg0, arg1) = (input.number()?, input.number()?);
                let payload = match input.byte()? {
                    // An OPEN's name as a device sends it.
                    b if b >= 0xc0 => {
                        let mut name = SPECS[usize::from(b) % SPECS.len()].as_bytes().to_vec();
                        name.push(0);
                        name
                    }
                    len => input.take(usize::from(len))?.to_vec(),
                };
                self.packet(&Packet::new(command, arg0, arg1, payload))
            }
            4 => {
                let service = service(input)?;
                self.open(&service);
                Some(())
            }
            5 => {
                let pick = input.byte()?;
                self.answer(pick, op & 0x80 != 0);
                Some(())
            }
            6 => {
                let id = self.stream(input.byte()?);
                let len = usize::from(input.byte()?);
                let data = input.take(len.min(input.0.len()))?;
                self.write(id, data);
                Some(())
            }
            7 => {
                let id = self.stream(input.byte()?);
                let max = usize::from(input.byte()?) * 4;
                self.read(id, max);
                Some(())
            }
            8 => {
                let id = self.stream(input.byte()?);
                self.close(id);
                Some(())
            }
            _ => {
                let ms = u64::from(input.byte()?) * 10;
                self.advance(Duration::from_millis(ms));
                Some(())
            }
        }
    }

    /// A stream: one the host knows, or (from 0xf0) a small id, perhaps of
    /// no stream.
    fn stream(&self, pick: u8) -> StreamId {
        if pick >= 0xf0 || self.known.is_empty() {
            return StreamId(u32::from(pick & 0x0f));
        }
        self.known[usize::from(pick) % self.known.len()]
    }

    /// Frames `packet` as a device does (magic, and the checksum a 1.0 peer
    /// expects) and reads its header back like a driver.
    fn packet(&mut self, packet: &Packet) -> Option<()> {
        let raw = packet.header(self.conn.checksums()).encode();
        let header = Header::decode(&raw, self.conn.max_incoming_payload()).ok()?;
        self.device(header, packet.payload.clone())
    }

    /// A packet from the device, and everything the host does about it.
    fn device(&mut self, header: Header, payload: Bytes) -> Option<()> {
        self.conn.set_time(self.now);
        let open = (header.command == Command::Open).then(|| self.open_answer(&header, &payload));
        self.conn.handle_packet(&header, payload.clone()).ok()?;
        // Sending can end a writer's wait (`Event::Writable`): packets first.
        let sent = self.transmit();
        let events = self.events();

        // Every event has its cause in this packet.
        for event in &events {
            let cause = match event {
                Event::Connected => header.command == Command::Cnxn,
                Event::AuthChallenge { .. } => header.command == Command::Auth,
                Event::OpenRequest { .. } => header.command == Command::Open,
                Event::Opened(id) => header.command == Command::Okay && header.arg1 == id.0,
                Event::Refused(id) => header.command == Command::Clse && header.arg1 == id.0,
                Event::Readable(id) => header.command == Command::Wrte && header.arg1 == id.0,
                // A second CNXN closes every stream.
                Event::Closed(_) => matches!(header.command, Command::Clse | Command::Cnxn),
                // Credit came back and the WRTEs it let out drained the queue.
                Event::Writable(_) => header.command == Command::Okay,
                _ => false,
            };
            assert!(cause, "{event:?} after {header:?}");
        }
        for event in &events {
            if let Event::Closed(id) = event {
                self.dropped.insert(id.0);
            }
        }
        if events.contains(&Event::Readable(StreamId(header.arg1))) {
            // Delivered: the host's application reads these bytes next.
            self.unread
                .entry(header.arg1)
                .or_default()
                .extend(&payload[..]);
        }

        // The answer to one packet is at most one packet of the engine's own:
        // an OKAY returning credit for a WRTE (a window is at most 256 MiB, one
        // i32), or a CLSE refusing an OPEN, answering a CLSE or closing an OPEN
        // the host gave up. Besides it, only what the host itself queued: the
        // WRTEs an OKAY lets out (checked in `transmit`) and the CLSE of a
        // stream the host closed once its last WRTE is gone. A second CNXN or
        // an AUTH gets no answer from the engine.
        for packet in &sent {
            assert!(
                matches!(packet.command, Command::Okay | Command::Clse),
                "{:?} in answer to {header:?}",
                packet.command
            );
        }
        let own_close = sent
            .iter()
            .filter(|p| p.command == Command::Clse && self.closed.contains(&p.arg0))
            .count();
        assert!(
            sent.len() - own_close <= 1 && sent.len() <= 2,
            "{} packets in answer to {header:?}: {sent:?}",
            sent.len()
        );

        if let Some(answer) = open {
            let requests: Vec<&Event> = events
                .iter()
                .filter(|e| matches!(e, Event::OpenRequest { .. }))
                .collect();
            match &answer {
                OpenAnswer::Ignore => assert!(requests.is_empty() && sent.is_empty()),
                OpenAnswer::Refuse => {
                    assert!(requests.is_empty(), "{header:?} reached the host");
                    assert_eq!(sent.len(), 1, "{header:?} was not refused");
                    assert_eq!(
                        (sent[0].command, sent[0].arg0, sent[0].arg1),
                        (Command::Clse, 0, header.arg0)
                    );
                }
                OpenAnswer::Request(service) => {
                    assert!(sent.is_empty(), "{header:?} refused");
                    let request = Event::OpenRequest {
                        id: StreamId(self.known.last().expect("learnt").0),
                        service: service.clone(),
                    };
                    assert_eq!(requests, [&request], "{header:?}");
                }
            }
        }
        self.check_streams();
        Some(())
    }

    /// What a device's OPEN must get. Its name is the payload without its
    /// trailing NULs (AOSP adb.cpp handle_packet, StripTrailingNulls).
    /// OPEN.arg1 is the opener's credit, non-zero exactly with delayed_ack
    /// (AOSP refuses a mismatch); the name must be the host side of a reverse
    /// forward asked for; and the stream must fit the limit.
    fn open_answer(&self, header: &Header, payload: &[u8]) -> OpenAnswer {
        if header.arg0 == 0 {
            return OpenAnswer::Ignore;
        }
        let delayed_ack = self.conn.peer().expect("online").delayed_ack;
        let end = payload.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        let Ok(service) = std::str::from_utf8(&payload[..end]) else {
            return OpenAnswer::Refuse;
        };
        if (header.arg1 != 0) != delayed_ack
            || !self.reverses.permits(service)
            || self.conn.stream_ids().count() >= self.conn.config().max_streams
        {
            return OpenAnswer::Refuse;
        }
        OpenAnswer::Request(service.to_string())
    }

    fn open(&mut self, service: &str) {
        let id = self.conn.open(service).expect("online");
        self.reverses.opened(service);
        self.opening.insert(id.0);
        self.learn(id);
        let sent = self.transmit();
        let mut name = service.as_bytes().to_vec();
        name.push(0);
        let open = Packet::new(
            Command::Open,
            id.0,
            sent.first().map_or(0, |p| p.arg1),
            name,
        );
        assert_eq!(sent, [open], "open({service:?})");
        self.host_events();
    }

    /// Accepts (or refuses) one of the device's OPENs; with none waiting,
    /// tries a stream that is not one.
    fn answer(&mut self, pick: u8, refuse: bool) {
        if self.pending.is_empty() {
            let id = self.stream(pick);
            let result = if refuse {
                self.conn.refuse(id)
            } else {
                self.conn.accept(id)
            };
            assert!(result.is_err(), "{id} answered twice");
            return;
        }
        let id = self.pending.remove(usize::from(pick) % self.pending.len());
        let expected = if refuse {
            self.conn.refuse(id).expect("a waiting OPEN");
            Command::Clse
        } else {
            self.conn.accept(id).expect("a waiting OPEN");
            Command::Okay
        };
        let sent = self.transmit();
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert_eq!(sent[0].command, expected);
        assert_eq!(sent[0].arg0, if refuse { 0 } else { id.0 });
        self.host_events();
    }

    fn write(&mut self, id: StreamId, data: &[u8]) {
        if let Ok(taken) = self.conn.write(id, data) {
            assert!(taken <= data.len());
            let written = &mut self.written.entry(id.0).or_default().0;
            written.extend_from_slice(&data[..taken]);
        }
        // Only WRTEs, checked there.
        assert_eq!(self.transmit(), []);
        self.host_events();
    }

    /// The host reads what the device sent on the stream, in order.
    fn read(&mut self, id: StreamId, max: usize) {
        let unread = self.unread.entry(id.0).or_default();
        match self.conn.read(id, max) {
            Ok(Read::Data(data)) => {
                assert!(data.len() <= max && data.len() <= unread.len());
                let sent: Vec<u8> = unread.drain(..data.len()).collect();
                assert_eq!(data[..], sent[..], "read data the device did not send");
                assert!(!data.is_empty() || max == 0);
            }
            Ok(Read::WouldBlock | Read::Eof) => assert!(unread.is_empty(), "data not handed out"),
            Err(_) => assert!(unread.is_empty() && !self.conn.stream_ids().any(|s| s == id)),
        }
        // Reading returns credit: OKAYs only.
        for packet in self.transmit() {
            assert_eq!(packet.command, Command::Okay);
        }
        self.host_events();
    }

    fn close(&mut self, id: StreamId) {
        self.conn.close(id);
        self.closed.insert(id.0);
        // A closed OPEN is answered to nobody; a closed waiting one is refused.
        self.opening.remove(&id.0);
        self.pending.retain(|&p| p != id);
        for packet in self.transmit() {
            assert_eq!(packet.command, Command::Clse);
        }
        self.host_events();
    }

    fn advance(&mut self, by: Duration) {
        self.now += by;
        self.conn.handle_timeout(self.now);
        // Stalled streams close: CLSE (after nothing, their data is dropped).
        for packet in self.transmit() {
            assert_eq!(packet.command, Command::Clse);
        }
        for event in self.events() {
            let Event::Closed(id) = event else {
                panic!("{event:?} when time passed");
            };
            // Only a stream whose data waits for credit: one whose queue the
            // engine dropped (the device closed it, or restarted) waits for
            // nothing.
            let (written, sent) = self.written.get(&id.0).map_or((0, 0), |w| (w.0.len(), w.1));
            assert!(
                sent < written && !self.dropped.contains(&id.0),
                "the stall timer closed {id}, which had nothing to send"
            );
        }
        self.check_streams();
        // Nothing due is left behind, or a driver would spin.
        if let Some(at) = self.conn.poll_timeout() {
            assert!(at > self.now, "deadline {at:?} due at {:?}", self.now);
        }
    }

    fn learn(&mut self, id: StreamId) {
        assert!(!self.known.contains(&id), "{id} given twice");
        self.known.push(id);
        self.bound.insert(id.0, self.holding_bound());
    }

    /// The most a stream opened now may hold unread, whatever the device
    /// sends, derived from the credit rules (docs/flow-control.md). Classic:
    /// an OKAY only while what waits fits the local buffer, and one WRTE
    /// per OKAY. AOSP's burst mode: the initial grant, plus what was
    /// returned, which is at most what was read plus the local buffer.
    /// Adaptive: grants stay within the window (at most the cap, or one
    /// packet) of what was read. A delayed-ack device may overshoot its
    /// credit by one packet.
    fn holding_bound(&self) -> usize {
        let config = self.conn.config();
        let peer = self.conn.peer().expect("online");
        let packet = peer.max_payload as usize;
        if !peer.delayed_ack {
            return config.local_buffer + packet;
        }
        match config.credit_policy {
            CreditPolicy::Aosp => config.initial_credit as usize + config.local_buffer + packet,
            CreditPolicy::Adaptive { max_window } => (max_window as usize).max(packet) + packet,
        }
    }

    /// Every event, checked against what the host knows.
    fn events(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        while let Some(event) = self.conn.poll_event() {
            match &event {
                Event::OpenRequest { id, service } => {
                    // The heart of it: the device reaches only what the host
                    // asked a reverse forward to reach.
                    assert!(
                        self.reverses.permits(service),
                        "the device opened {service:?}; reverse forwards: {:?}",
                        self.reverses.0
                    );
                    self.learn(*id);
                    self.pending.push(*id);
                }
                Event::Opened(id) | Event::Refused(id) => {
                    assert!(self.opening.remove(&id.0), "{event:?} for no OPEN of ours");
                }
                Event::Readable(id) | Event::Writable(id) | Event::Closed(id) => {
                    assert!(self.known.contains(id), "{event:?} of an unknown stream");
                }
                Event::Connected | Event::AuthChallenge { .. } => {}
                // The device role's, or a handshake that is long over.
                other => panic!("a host that is online saw {other:?}"),
            }
            events.push(event);
        }
        events
    }

    /// Events after a host action: only a queue that drained.
    fn host_events(&mut self) {
        for event in self.events() {
            assert!(
                matches!(event, Event::Writable(_)),
                "{event:?} from the host's own action"
            );
        }
        self.check_streams();
    }

    /// Takes every packet the engine has to send. A WRTE carries the next
    /// bytes the host wrote on its stream, at most a negotiated payload; the
    /// others are returned. The host sends no CNXN, AUTH or STLS once online.
    fn transmit(&mut self) -> Vec<Packet> {
        let mut others = Vec::new();
        while let Some(packet) = self.conn.poll_transmit() {
            match packet.command {
                Command::Wrte => {
                    let max = self.conn.peer().expect("online").max_payload as usize;
                    let len = packet.payload.len();
                    assert!(len > 0 && len <= max, "WRTE of {len} bytes (max {max})");
                    let (written, sent) = self
                        .written
                        .get_mut(&packet.arg0)
                        .expect("WRTE on a stream the host wrote nothing to");
                    assert!(*sent + len <= written.len(), "WRTE beyond what was written");
                    assert_eq!(packet.payload[..], written[*sent..*sent + len]);
                    *sent += len;
                }
                Command::Cnxn | Command::Auth | Command::Stls => {
                    panic!("the host sent {:?} once online", packet.command)
                }
                _ => others.push(packet),
            }
        }
        others
    }

    /// The host holds exactly what the device sent and the host did not read
    /// yet, and no more than the stream's credit allows.
    fn check_streams(&mut self) {
        let alive: HashSet<u32> = self.conn.stream_ids().map(|id| id.0).collect();
        // A stream the host closed takes its unread data with it.
        self.unread.retain(|id, _| alive.contains(id));
        for &id in &alive {
            let bound = *self.bound.get(&id).expect("a stream the host was given");
            let held = self.conn.readable_bytes(StreamId(id));
            assert_eq!(held, self.unread.get(&id).map_or(0, VecDeque::len));
            assert!(
                held <= bound,
                "stream {id} holds {held} bytes (bound {bound})"
            );
        }
    }
}
