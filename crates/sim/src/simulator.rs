//! The discrete-event loop: two engines, two wires, a consumer, virtual time.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use oxadb_engine::{
    BudgetLimits, Config, Connection, CreditMode, Event, MemoryBudget, Read, Role, StreamId,
    StreamStats,
};
use oxadb_wire::{Banner, Command, Header, Packet, HEADER_LEN};

use crate::link::Wire;
use crate::scenario::{Consumer, Outcome, Scenario, StreamOutcome, SLOW_TICK_NS};

/// Every WRTE's payload: the contents do not matter, so GiBs cost no copies.
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

const NS_PER_SEC: u64 = 1_000_000_000;

/// Runs `scenario` to completion or to its time limit. The same scenario
/// always gives the same outcome: nothing depends on the wall clock.
pub fn run(scenario: &Scenario) -> Outcome {
    let mut simulation = Simulation::new(scenario);
    simulation.settle();
    while !simulation.finished() {
        let Some(at) = simulation.queue.peek().map(|next| next.at) else {
            // Nothing left that could make progress: a deadlock.
            break;
        };
        if at > scenario.time_limit_ns {
            simulation.now = scenario.time_limit_ns;
            break;
        }
        simulation.advance(at);
        while simulation.queue.peek().is_some_and(|next| next.at == at) {
            let next = simulation.queue.pop().expect("peeked");
            simulation.apply(next.action);
        }
        // Everything arriving at one instant (a batch) is handled before
        // either application runs.
        simulation.settle();
    }
    simulation.outcome()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Host,
    Device,
}

#[derive(Debug)]
enum Action {
    Arrive {
        to: Side,
        header: [u8; HEADER_LEN],
        payload: Bytes,
    },
    /// A slow consumer's tick, or the end of a stall.
    WakeConsumer,
    /// The delayed-ack timer fired: held window updates go out.
    ReleaseUpdates,
    /// A packet left the sender towards `to`: its driver may take more.
    QueueDrained { to: Side },
}

#[derive(Debug)]
struct Scheduled {
    at: u64,
    /// Breaks ties in scheduling order, so that same-time events (a batch)
    /// are handled in the order they were sent.
    seq: u64,
    action: Action,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Scheduled) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Scheduled {}

impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Scheduled) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Scheduled {
    /// Reversed: `BinaryHeap` is a max-heap and the earliest event goes first.
    fn cmp(&self, other: &Scheduled) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

struct SenderStream {
    id: StreamId,
    remaining: u64,
    open: bool,
    close_requested: bool,
}

struct ReceiverStream {
    id: StreamId,
    consumed: u64,
    finished_ns: Option<u64>,
    /// The OKAY accepting the stream went out; later OKAYs are window updates.
    accepted: bool,
    /// Bytes a slow consumer may still read in this tick.
    allowance: u64,
    /// When the consumer is done with what it read (a slow consumer reads a
    /// tick's worth at once but takes the tick to process it).
    busy_until: u64,
    peak_buffered: u64,
    peak_window: Option<u64>,
    peak_over_grant: i64,
    engine_stats: Option<StreamStats>,
}

struct Simulation<'a> {
    scenario: &'a Scenario,
    now: u64,
    next_seq: u64,
    queue: BinaryHeap<Scheduled>,
    host: Connection,
    device: Connection,
    to_device: Wire,
    to_host: Wire,
    senders: Vec<SenderStream>,
    receivers: Vec<ReceiverStream>,
    /// Window updates waiting for the delayed-ack timer.
    held_updates: Vec<Packet>,
    /// A wake-up for a stalled consumer is already scheduled.
    stall_wake_pending: bool,
    /// A wake-up for a driver waiting on a full queue is scheduled, per
    /// direction: (towards the device, towards the host).
    drain_wake_pending: (bool, bool),
    started_ns: Option<u64>,
    last_consumed_ns: u64,
    okays_sent: u64,
    wrtes_sent: u64,
    /// WRTE payload the host put on the link, all streams.
    payload_sent: u64,
    peak_buffered: u64,
    peak_in_flight: u64,
    series: Vec<(u64, u64)>,
    /// The series interval being filled: (start ns, most buffered).
    series_bucket: Option<(u64, u64)>,
    device_budget: Option<Arc<MemoryBudget>>,
}

fn config(role: Role, scenario: &Scenario, budget: Option<Arc<MemoryBudget>>) -> Config {
    let banner = Banner::new(if role == Role::Host { "host" } else { "device" });
    let mut config = Config::new(role, banner);
    config.set_credit_mode(scenario.policy);
    config.max_payload = scenario.max_payload;
    config.memory_budget = budget;
    config.ack_headroom = scenario.ack_headroom;
    config.slow_start = scenario.slow_start;
    config
}

impl<'a> Simulation<'a> {
    fn new(scenario: &'a Scenario) -> Simulation<'a> {
        assert!(scenario.streams > 0, "a scenario needs at least one stream");
        if let Consumer::Stalling {
            period_ns,
            stall_ns,
        } = scenario.consumer
        {
            assert!(
                stall_ns < period_ns,
                "a stalling consumer must read sometimes"
            );
        }
        // Host and device are separate processes, each with its own budget.
        let budget = || {
            scenario
                .budget_limit
                .map(|limit| Arc::new(MemoryBudget::new(BudgetLimits::from_limit(limit))))
        };
        let device_budget = budget();
        let mut simulation = Simulation {
            scenario,
            now: 0,
            next_seq: 0,
            queue: BinaryHeap::new(),
            host: Connection::new(config(Role::Host, scenario, budget())),
            device: Connection::new(config(Role::Device, scenario, device_budget.clone())),
            to_device: Wire::new(scenario.link),
            to_host: Wire::new(scenario.link),
            senders: Vec::new(),
            receivers: Vec::new(),
            held_updates: Vec::new(),
            stall_wake_pending: false,
            drain_wake_pending: (false, false),
            started_ns: None,
            last_consumed_ns: 0,
            okays_sent: 0,
            wrtes_sent: 0,
            payload_sent: 0,
            peak_buffered: 0,
            peak_in_flight: 0,
            series: Vec::new(),
            series_bucket: None,
            device_budget,
        };
        if let Consumer::Slow { .. } = scenario.consumer {
            simulation.schedule(0, Action::WakeConsumer);
        }
        simulation
    }

    fn schedule(&mut self, at: u64, action: Action) {
        self.queue.push(Scheduled {
            at,
            seq: self.next_seq,
            action,
        });
        self.next_seq += 1;
    }

    fn advance(&mut self, now: u64) {
        self.now = now;
        let time = Duration::from_nanos(now);
        self.host.set_time(time);
        self.device.set_time(time);
    }

    fn finished(&self) -> bool {
        self.receivers.len() == self.scenario.streams as usize
            && self.receivers.iter().all(|r| r.finished_ns.is_some())
    }

    fn apply(&mut self, action: Action) {
        match action {
            Action::Arrive {
                to,
                header,
                payload,
            } => {
                let connection = match to {
                    Side::Host => &mut self.host,
                    Side::Device => &mut self.device,
                };
                let header = Header::decode(&header, connection.max_incoming_payload())
                    .unwrap_or_else(|e| panic!("undecodable header to {to:?}: {e}"));
                if let Err(e) = connection.handle_packet(&header, payload) {
                    panic!("protocol error at {to:?}, {} ns: {e}", self.now);
                }
            }
            Action::WakeConsumer => match self.scenario.consumer {
                Consumer::Slow { .. } => {
                    // Unused allowance is not carried over: the consumer
                    // reads at most its rate, whatever it missed.
                    let per_tick = self.allowance_per_tick();
                    for receiver in &mut self.receivers {
                        receiver.allowance = per_tick;
                    }
                    self.schedule(self.now + SLOW_TICK_NS, Action::WakeConsumer);
                }
                Consumer::Stalling { .. } => self.stall_wake_pending = false,
                Consumer::Fast => {}
            },
            Action::QueueDrained { to } => *self.drain_wake_pending(to) = false,
            Action::ReleaseUpdates => {
                for packet in std::mem::take(&mut self.held_updates) {
                    self.okays_sent += 1;
                    self.put(Side::Host, packet);
                }
            }
        }
    }

    /// What a slow consumer may read from one stream per tick (others: 0).
    fn allowance_per_tick(&self) -> u64 {
        match self.scenario.consumer {
            Consumer::Slow { bytes_per_sec } => {
                let bytes = bytes_per_sec as u128 * SLOW_TICK_NS as u128 / NS_PER_SEC as u128;
                (bytes as u64).max(1)
            }
            Consumer::Fast | Consumer::Stalling { .. } => 0,
        }
    }

    /// How long the consumer takes to process `bytes` it has read.
    fn processing_ns(&self, bytes: u64) -> u64 {
        match self.scenario.consumer {
            Consumer::Slow { bytes_per_sec } => {
                (bytes as u128 * NS_PER_SEC as u128 / bytes_per_sec.max(1) as u128) as u64
            }
            Consumer::Fast | Consumer::Stalling { .. } => 0,
        }
    }

    /// Lets both applications and both engines act at `now` until nothing changes.
    fn settle(&mut self) {
        self.sample();
        loop {
            let mut progress = self.host_events();
            progress |= self.device_events();
            progress |= self.write();
            progress |= self.consume();
            progress |= self.transmit();
            if !progress {
                break;
            }
        }
    }

    fn host_events(&mut self) -> bool {
        let mut progress = false;
        while let Some(event) = self.host.poll_event() {
            progress = true;
            match event {
                Event::Connected => self.open_streams(),
                Event::Opened(id) => {
                    self.started_ns.get_or_insert(self.now);
                    if let Some(sender) = self.senders.iter_mut().find(|s| s.id == id) {
                        sender.open = true;
                    }
                }
                Event::Refused(id) => panic!("the device refused {id}"),
                _ => {}
            }
        }
        progress
    }

    fn open_streams(&mut self) {
        let streams = u64::from(self.scenario.streams);
        let share = self.scenario.bytes / streams;
        for index in 0..streams {
            let id = self.host.open("sink:").expect("the host is online");
            // The first stream also carries what does not divide evenly.
            let extra = if index == 0 {
                self.scenario.bytes % streams
            } else {
                0
            };
            self.senders.push(SenderStream {
                id,
                remaining: share + extra,
                open: false,
                close_requested: false,
            });
        }
    }

    fn device_events(&mut self) -> bool {
        let mut progress = false;
        while let Some(event) = self.device.poll_event() {
            progress = true;
            if let Event::OpenRequest { id, .. } = event {
                self.device.accept(id).expect("a fresh open request");
                let mut receiver = ReceiverStream {
                    id,
                    consumed: 0,
                    finished_ns: None,
                    accepted: false,
                    // What is left of the current tick: the consumer is
                    // ready the moment the stream is accepted.
                    allowance: self.allowance_per_tick() * (SLOW_TICK_NS - self.now % SLOW_TICK_NS)
                        / SLOW_TICK_NS,
                    busy_until: 0,
                    peak_buffered: 0,
                    peak_window: None,
                    peak_over_grant: i64::MIN,
                    engine_stats: None,
                };
                self.sample_stream(&mut receiver);
                self.receivers.push(receiver);
            }
        }
        progress
    }

    /// The host application: keeps every open stream's send buffer full,
    /// then closes the stream.
    fn write(&mut self) -> bool {
        let mut progress = false;
        for sender in self.senders.iter_mut().filter(|s| s.open) {
            while sender.remaining > 0 && self.host.is_writable(sender.id) {
                let len = sender.remaining.min(ZEROS.len() as u64) as usize;
                self.host
                    .write_bytes(sender.id, Bytes::from_static(&ZEROS[..len]))
                    .expect("the stream is open");
                sender.remaining -= len as u64;
                progress = true;
            }
            if sender.remaining == 0 && !sender.close_requested {
                self.host.close(sender.id);
                sender.close_requested = true;
                progress = true;
            }
        }
        progress
    }

    /// How much the consumer may read from one stream right now.
    fn read_limit(&mut self, receiver: &ReceiverStream) -> usize {
        match self.scenario.consumer {
            Consumer::Fast => usize::MAX,
            Consumer::Slow { .. } => receiver.allowance as usize,
            Consumer::Stalling {
                period_ns,
                stall_ns,
            } => {
                if self.now % period_ns < period_ns - stall_ns {
                    return usize::MAX;
                }
                if !self.stall_wake_pending {
                    self.stall_wake_pending = true;
                    let stall_ends = (self.now / period_ns + 1) * period_ns;
                    self.schedule(stall_ends, Action::WakeConsumer);
                }
                0
            }
        }
    }

    /// The device application: reads what its consumer allows and closes
    /// each stream at end of file.
    fn consume(&mut self) -> bool {
        let mut progress = false;
        let mut receivers = std::mem::take(&mut self.receivers);
        for receiver in receivers.iter_mut().filter(|r| r.finished_ns.is_none()) {
            loop {
                if self.device.readable_bytes(receiver.id) == 0 {
                    if self.device.read(receiver.id, usize::MAX) == Ok(Read::Eof) {
                        receiver.engine_stats = self.device.stream_stats(receiver.id);
                        self.device.close(receiver.id);
                        receiver.finished_ns = Some(self.now.max(receiver.busy_until));
                        progress = true;
                    }
                    break;
                }
                let limit = self.read_limit(receiver);
                if limit == 0 {
                    break;
                }
                let Ok(Read::Data(chunk)) = self.device.read(receiver.id, limit) else {
                    break;
                };
                let len = chunk.len() as u64;
                receiver.consumed += len;
                receiver.allowance = receiver.allowance.saturating_sub(len);
                receiver.busy_until = self.now.max(receiver.busy_until) + self.processing_ns(len);
                self.last_consumed_ns = self.last_consumed_ns.max(receiver.busy_until);
                progress = true;
            }
        }
        self.receivers = receivers;
        progress
    }

    /// Both engines put out everything they have; the device's window
    /// updates may be held for the delayed-ack timer.
    fn transmit(&mut self) -> bool {
        let mut progress = false;
        while self.driver_takes_more(Side::Device) {
            let Some(packet) = self.host.poll_transmit() else {
                break;
            };
            progress = true;
            if packet.command == Command::Wrte {
                self.wrtes_sent += 1;
                self.payload_sent += packet.payload.len() as u64;
            }
            self.put(Side::Device, packet);
        }
        while self.driver_takes_more(Side::Host) {
            let Some(packet) = self.device.poll_transmit() else {
                break;
            };
            progress = true;
            if packet.command == Command::Okay {
                if let Some(tick) = self.scenario.delayed_updates {
                    if self.is_window_update(&packet) {
                        if self.held_updates.is_empty() {
                            self.schedule((self.now / tick + 1) * tick, Action::ReleaseUpdates);
                        }
                        self.held_updates.push(packet);
                        continue;
                    }
                }
                self.okays_sent += 1;
            }
            self.put(Side::Host, packet);
        }
        progress
    }

    /// Whether the driver sending towards `to` takes another packet from its
    /// engine now; when its queue is full it looks again once a packet has left.
    fn driver_takes_more(&mut self, to: Side) -> bool {
        let Some(limit) = self.scenario.sender_queue_limit else {
            return true;
        };
        let now = self.now;
        let wire = match to {
            Side::Device => &mut self.to_device,
            Side::Host => &mut self.to_host,
        };
        if wire.queued_bytes(now) < limit {
            return true;
        }
        let drained_at = wire.next_departure().expect("a full queue holds a packet");
        if !std::mem::replace(self.drain_wake_pending(to), true) {
            self.schedule(drained_at, Action::QueueDrained { to });
        }
        false
    }

    fn drain_wake_pending(&mut self, to: Side) -> &mut bool {
        match to {
            Side::Device => &mut self.drain_wake_pending.0,
            Side::Host => &mut self.drain_wake_pending.1,
        }
    }

    /// Whether a device OKAY is a window update rather than the one accepting
    /// its stream (which answers OPEN and is never delayed, like a SYN-ACK).
    fn is_window_update(&mut self, okay: &Packet) -> bool {
        let Some(receiver) = self.receivers.iter_mut().find(|r| r.id.0 == okay.arg0) else {
            return false;
        };
        std::mem::replace(&mut receiver.accepted, true)
    }

    /// Puts a packet on the wire towards `to`, encoding its header the way
    /// the sender would.
    fn put(&mut self, to: Side, packet: Packet) {
        let (from, wire) = match to {
            Side::Device => (&self.host, &mut self.to_device),
            Side::Host => (&self.device, &mut self.to_host),
        };
        let header = from.header_for(&packet).encode();
        let at = wire.send(self.now, packet.payload.len());
        self.schedule(
            at,
            Action::Arrive {
                to,
                header,
                payload: packet.payload,
            },
        );
    }

    /// Records what the device holds, after arrivals and before its consumer reads.
    fn sample(&mut self) {
        let mut receivers = std::mem::take(&mut self.receivers);
        let mut total = 0;
        for receiver in receivers.iter_mut().filter(|r| r.finished_ns.is_none()) {
            total += self.sample_stream(receiver);
        }
        let consumed: u64 = receivers.iter().map(|r| r.consumed).sum();
        self.receivers = receivers;
        self.peak_buffered = self.peak_buffered.max(total);
        self.peak_in_flight = self
            .peak_in_flight
            .max(self.payload_sent.saturating_sub(consumed));
        let interval = self.scenario.series_interval_ns.max(1);
        let start = self.now / interval * interval;
        match &mut self.series_bucket {
            Some((bucket_start, most)) if *bucket_start == start => *most = (*most).max(total),
            bucket => {
                self.series.extend(bucket.take());
                *bucket = Some((start, total));
            }
        }
    }

    /// Updates one stream's peaks; returns its buffered bytes.
    fn sample_stream(&self, receiver: &mut ReceiverStream) -> u64 {
        let buffered = self.device.readable_bytes(receiver.id) as u64;
        receiver.peak_buffered = receiver.peak_buffered.max(buffered);
        let window = self
            .device
            .stream_stats(receiver.id)
            .and_then(|stats| stats.window);
        if let Some(window) = window {
            receiver.peak_window = Some(receiver.peak_window.map_or(window, |w| w.max(window)));
        }
        let config = self.device.config();
        let grant = match self.scenario.policy {
            CreditMode::Classic => config.local_buffer as u64,
            CreditMode::Aosp => u64::from(config.initial_credit) + config.local_buffer as u64,
            CreditMode::Adaptive => receiver.peak_window.unwrap_or(0),
        };
        receiver.peak_over_grant = receiver.peak_over_grant.max(buffered as i64 - grant as i64);
        buffered
    }

    fn outcome(mut self) -> Outcome {
        let completed = self.finished();
        self.series.extend(self.series_bucket.take());
        let end = if completed {
            self.last_consumed_ns
        } else {
            self.now
        };
        let started_ns = self.started_ns.unwrap_or(end);
        let elapsed_ns = end.saturating_sub(started_ns);
        let bytes_delivered = self.receivers.iter().map(|r| r.consumed).sum();
        let throughput = if elapsed_ns == 0 {
            0.0
        } else {
            bytes_delivered as f64 * NS_PER_SEC as f64 / elapsed_ns as f64
        };
        let link_rate = self
            .scenario
            .link
            .payload_rate(self.scenario.max_payload as usize);
        let streams = self
            .receivers
            .iter()
            .map(|r| StreamOutcome {
                bytes_consumed: r.consumed,
                finished_ns: r.finished_ns,
                peak_buffered: r.peak_buffered,
                peak_window: r.peak_window,
                peak_over_grant: r.peak_over_grant,
                engine_stats: r.engine_stats.or_else(|| self.device.stream_stats(r.id)),
            })
            .collect();
        Outcome {
            completed,
            started_ns,
            elapsed_ns,
            bytes_delivered,
            throughput,
            link_utilisation: throughput / link_rate,
            peak_buffered: self.peak_buffered,
            peak_in_flight: self.peak_in_flight,
            okays_sent: self.okays_sent,
            wrtes_sent: self.wrtes_sent,
            budget_peak: self.device_budget.as_ref().map(|b| b.peak()),
            streams,
            series: self.series,
        }
    }
}
