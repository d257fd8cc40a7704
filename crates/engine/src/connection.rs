//! One ADB connection as a sans-I/O state machine, the same code for both roles.
//!
//! The driver feeds received packets to [`Connection::handle_packet`], moves
//! stream data with [`Connection::write`] / [`Connection::read`], sends what
//! [`Connection::poll_transmit`] returns and reacts to [`Connection::poll_event`];
//! it calls [`Connection::handle_timeout`] at the time
//! [`Connection::poll_timeout`] names (`timers.rs`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use oxadb_wire::packet::{VERSION_CHECKSUMMED, VERSION_SKIP_CHECKSUM};
use oxadb_wire::{
    feature, Banner, BannerError, Command, Header, Packet, Part, Payload, MAX_PAYLOAD,
};
use thiserror::Error;

use crate::budget::MemoryBudget;
use crate::credit::{
    AdaptiveParams, CreditMode, CreditPolicy, RecvCredit, SendCredit, AOSP_INITIAL_CREDIT,
    MAX_ADAPTIVE_WINDOW,
};
use crate::send_queue::SendQueue;

mod pacing;
mod reverse_forwards;
mod timers;

use pacing::MisbehaviourPace;
pub use pacing::{MISBEHAVIOUR_BURST, MISBEHAVIOUR_PER_SECOND};
use reverse_forwards::ReverseForwards;

/// Logs a peer's misbehaviour that does not end the connection: at WARN the
/// first 8 times on a connection (each refused spec of a device probing the
/// host is named) and then the 16th, 32nd, 64th..., at DEBUG otherwise, so
/// that a peer repeating it cannot flood the log (4.5 million refused OPENs
/// wrote 1.5 GB in 20 s before this).
macro_rules! peer_warn {
    ($connection:expr, $($arg:tt)+) => {{
        $connection.complaints += 1;
        $connection.pace.note($connection.now_ns);
        if worth_a_warning($connection.complaints) {
            tracing::warn!(complaints = $connection.complaints, $($arg)+);
        } else {
            tracing::debug!($($arg)+);
        }
    }};
}

/// Whether the `count`th time a peer repeats a misbehaviour that does not
/// end its connection is logged at WARN (the first 8, then the 16th, 32nd,
/// 64th...) rather than DEBUG: every role and service that logs such
/// repetitions counts them so.
pub fn worth_a_warning(count: u64) -> bool {
    count <= 8 || count.is_power_of_two()
}

/// Which end of the connection we are. A value, never a compile-time switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Sends CNXN first and opens most streams (adb, oxadb).
    Host,
    /// Answers CNXN and serves streams (adbd, oxadbd).
    Device,
}

/// A stream as named by this side (our local id on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u32);

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stream {}", self.0)
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub role: Role,
    /// Our identity; its features are what we advertise (include `delayed_ack`
    /// to offer burst mode).
    pub banner: Banner,
    pub version: u32,
    pub max_payload: u32,
    /// How this side grants credit to its peer in delayed-ack mode.
    pub credit_policy: CreditPolicy,
    /// Credit granted per stream by the `Aosp` policy (OPEN.arg1 and first OKAY).
    pub initial_credit: u32,
    /// Received bytes a stream may hold before its consumer reads them and
    /// still count as flushed (plays the role of AOSP's local socket buffer).
    pub local_buffer: usize,
    /// Bytes a stream's writer may queue before `write` accepts no more.
    pub send_buffer: usize,
    /// The process-wide budget the adaptive windows draw from (`None`: no
    /// limit beyond each stream's `max_window`). Share one `Arc` between
    /// every connection of a process.
    pub memory_budget: Option<Arc<MemoryBudget>>,
    /// Adaptive policy: add headroom for data and acknowledgements that
    /// arrive in clumps (docs/flow-control.md, "Headroom for clumps"); off only for ablation runs.
    pub ack_headroom: bool,
    /// Adaptive policy: ramp the window like TCP's slow start while the rate
    /// grows (`credit/slow_start.rs`); off only for ablation runs.
    pub slow_start: bool,
    /// Device role: a host's CNXN is answered only once the driver calls
    /// [`Connection::authorize`] (after checking a signature); until then
    /// nothing but CNXN and AUTH is accepted.
    pub require_auth: bool,
    /// Streams the peer may have open on this connection at once; OPENs
    /// beyond it are refused (CLSE), the connection goes on.
    pub max_streams: usize,
    /// Streams whose data waits this long for the peer's credit are closed
    /// (a deadline of [`Connection::poll_timeout`]); `None`: never.
    pub stalled_stream_timeout: Option<std::time::Duration>,
    /// The peer must send CNXN within this of the connection's start (time
    /// zero on the clock [`Connection::set_time`] reads: drivers start it at
    /// accept), and finish STLS and the TLS handshake when it gets STLS;
    /// `None`: no deadline (USB, where the host's adb server may start any
    /// time after the cable is in). Applies until the peer is first online.
    pub handshake_timeout: Option<std::time::Duration>,
    /// Device role with [`Config::require_auth`]: a host that sent CNXN must
    /// authenticate within this, counted from the connection's start when
    /// [`Config::handshake_timeout`] bounds the handshake (docs/security.md,
    /// "Limits": "from accept"), else from the host's first CNXN. Applies
    /// until the host is first online; `None`: no deadline.
    pub auth_timeout: Option<std::time::Duration>,
    /// Whether this connection moves to TLS with STLS (TCP only: adbd never
    /// sends STLS over USB). Device role: whether to send it after a host's
    /// CNXN; host role: whether to answer a device's STLS.
    pub tls: Tls,
}

/// When a connection switches to TLS 1.3 (docs/protocol.md, "STLS").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tls {
    /// Never: a device answers CNXN with AUTH or CNXN; a host treats STLS
    /// as a protocol error.
    #[default]
    Off,
    /// Device: STLS to hosts that can do TLS ([`host_supports_tls`]),
    /// plaintext to the others. Host: answer STLS.
    On,
    /// Device: STLS to every host; a host that cannot do TLS is refused
    /// (the connection ends with [`ProtocolError::TlsRequired`]). Host:
    /// answer STLS.
    Required,
}

/// Version sent in STLS's arg0 (AOSP adb.h `A_STLS_VERSION`; the only one).
pub const STLS_VERSION: u32 = 0x0100_0000;

/// Whether a host's CNXN banner says it can answer STLS. adb sends no flag
/// for it: STLS came with Android 11's adb, and so did `sendrecv_v2`, the
/// feature that tells its banner from older ones (Debian's adb 29 lacks
/// both).
pub fn host_supports_tls(banner: &Banner) -> bool {
    banner.has_feature(feature::SENDRECV_V2)
}

impl Config {
    pub fn new(role: Role, banner: Banner) -> Config {
        Config {
            role,
            banner,
            version: VERSION_SKIP_CHECKSUM,
            max_payload: MAX_PAYLOAD,
            credit_policy: CreditPolicy::Adaptive {
                max_window: MAX_ADAPTIVE_WINDOW,
            },
            initial_credit: AOSP_INITIAL_CREDIT,
            local_buffer: 2 * MAX_PAYLOAD as usize,
            send_buffer: MAX_PAYLOAD as usize,
            memory_budget: None,
            ack_headroom: true,
            slow_start: true,
            require_auth: false,
            max_streams: DEFAULT_MAX_STREAMS,
            stalled_stream_timeout: None,
            handshake_timeout: None,
            auth_timeout: None,
            tls: Tls::Off,
        }
    }

    /// Applies the flow control `mode` (`--credit`): the banner offers
    /// `delayed_ack` (last among its features) exactly when the mode is not
    /// classic, and grants follow the mode's policy. Every role and tool
    /// chooses its credit mode through here.
    pub fn set_credit_mode(&mut self, mode: CreditMode) {
        self.banner.features.retain(|f| f != feature::DELAYED_ACK);
        if mode.delayed_ack() {
            self.banner.features.push(feature::DELAYED_ACK.to_string());
        }
        self.credit_policy = mode.policy();
    }
}

/// Default for [`Config::max_streams`]: far more than adb opens (a push or a
/// shell is one stream; port forwards one per connection), and a bound on
/// what a peer can make us hold.
pub const DEFAULT_MAX_STREAMS: usize = 1024;

/// A protocol violation by the peer: the connection must be closed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    #[error("{0} before CNXN")]
    BeforeHandshake(Command),
    #[error("bad CNXN banner: {0}")]
    Banner(#[from] BannerError),
    #[error("CNXN with max payload {0}")]
    BadMaxPayload(u32),
    #[error("CNXN with unsupported version {0:#010x}")]
    BadVersion(u32),
    #[error(
        "payload checksum mismatch on {command}: header {expected:#x}, payload sums to {actual:#x}"
    )]
    Checksum {
        command: Command,
        expected: u32,
        actual: u32,
    },
    #[error("{command} to unknown stream {id}")]
    UnknownStream { command: Command, id: u32 },
    #[error("{0} is not supported by this implementation")]
    Unsupported(Command),
    #[error("AUTH of unexpected type {0}")]
    BadAuth(u32),
    #[error("{0} before authentication")]
    BeforeAuth(Command),
    #[error("AUTH after authentication")]
    AuthWhenOnline,
    #[error(
        "TLS is required (--tls required) and the host cannot do it: its CNXN banner lacks \
         `sendrecv_v2`, which every adb that answers STLS (Android 11 and later) lists"
    )]
    TlsRequired,
    #[error("STLS with unsupported version {0:#010x}")]
    BadStlsVersion(u32),
    #[error("STLS where none was expected ({0})")]
    UnexpectedStls(&'static str),
    #[error("WRTE on stream {id} beyond its credit: {detail}")]
    BeyondCredit { id: u32, detail: String },
}

/// AUTH packet types (arg0).
pub const AUTH_TOKEN: u32 = 1;
pub const AUTH_SIGNATURE: u32 = 2;
pub const AUTH_RSAPUBLICKEY: u32 = 3;

/// A host's answer to an AUTH token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthReply {
    /// RSA signature of the token with one of our keys.
    Signature(Bytes),
    /// Our public key in Android format, base64, ` user@host` and a NUL, for the
    /// device to offer its user (sent once every key's signature was refused).
    PublicKey(Bytes),
}

/// Misuse of a stream by the local application.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum StreamError {
    #[error("{0} does not exist")]
    Unknown(StreamId),
    #[error("{0} is closed")]
    Closed(StreamId),
    #[error("connection is not online")]
    Offline,
}

/// Something the driver should react to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The handshake completed.
    Connected,
    /// The peer wants a service; answer with [`Connection::accept`] or [`Connection::refuse`].
    OpenRequest { id: StreamId, service: String },
    /// The device asks us (the host) to sign `token`; answer with
    /// [`Connection::send_auth`]. `attempt` counts challenges on this connection.
    AuthChallenge { token: Bytes, attempt: u32 },
    /// Device role with [`Config::require_auth`]: a host sent CNXN and must
    /// prove who it is, or the delay after a refused signature
    /// ([`Connection::refuse_signature`]) is over; send it a fresh random
    /// token with [`Connection::send_auth_token`].
    TokenNeeded,
    /// The host signed `token` (the one outstanding when the signature
    /// arrived; it is used up). Verify, then [`Connection::authorize`] or
    /// [`Connection::refuse_signature`].
    AuthSignature { token: Bytes, signature: Bytes },
    /// The host offers its public key (after its signatures were refused):
    /// [`Connection::authorize`] to trust it without proof, or ignore it
    /// and the host stays unauthorized.
    AuthPublicKey { key: Bytes },
    /// Our OPEN was accepted.
    Opened(StreamId),
    /// Our OPEN was refused (the stream is gone).
    Refused(StreamId),
    /// A deadline of the handshake ([`Config::handshake_timeout`],
    /// [`Config::auth_timeout`]) passed with `stage` unfinished: the engine
    /// takes no more packets and sends nothing; the driver closes the
    /// connection. `limit` is the deadline's setting, for the log.
    HandshakeTimedOut {
        stage: HandshakeStage,
        limit: std::time::Duration,
    },
    /// Data arrived on the stream.
    Readable(StreamId),
    /// The stream can take more data from its writer.
    Writable(StreamId),
    /// The peer closed the stream; buffered data may still be read.
    Closed(StreamId),
}

/// The part of the handshake a peer did not finish in time
/// ([`Event::HandshakeTimedOut`]). Displayed as the daemon's log has always
/// worded it, after "closing connection: ".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeStage {
    /// No CNXN from the peer.
    Cnxn,
    /// STLS was sent after the host's CNXN; the host's STLS or the TLS
    /// handshake is missing.
    Tls,
    /// The host sent CNXN and has not authenticated.
    Auth,
}

impl std::fmt::Display for HandshakeStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HandshakeStage::Cnxn => "no CNXN in time",
            HandshakeStage::Tls => "no STLS answer and TLS handshake in time",
            HandshakeStage::Auth => "the host did not authenticate in time",
        })
    }
}

/// The result of [`Connection::read`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    Data(Bytes),
    WouldBlock,
    Eof,
}

/// What the peer told us in its CNXN, and what was negotiated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub banner: Banner,
    pub version: u32,
    pub max_payload: u32,
    pub delayed_ack: bool,
}

/// Per-stream counters, for statistics and logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Whether the stream ran with delayed-ack credit (burst mode).
    pub delayed_ack: bool,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub packets_sent: u64,
    pub packets_received: u64,
    pub okays_sent: u64,
    pub okays_received: u64,
    /// Adaptive policy: the window grants aim for now (measured window plus
    /// headroom, capped and shrunk by budget pressure), bytes.
    pub window: Option<u64>,
    /// Adaptive policy: the headroom for clumped deliveries in that window.
    pub headroom: Option<u64>,
    /// Delayed-ack credit we granted and the consumer has not taken yet:
    /// what the peer may have in flight or we may hold, bytes.
    pub credit_outstanding: Option<u64>,
    /// Time our data waited for the peer's credit (OKAYs), nanoseconds.
    pub credit_blocked_ns: u64,
    /// Time the peer had no credit because our consumer had not read what
    /// arrived, nanoseconds.
    pub consumer_blocked_ns: u64,
    /// Adaptive policy: the smallest round trip measured, nanoseconds.
    pub min_rtt_ns: Option<u64>,
    /// Adaptive policy: the last measured consumption rate, bytes per second.
    pub consume_rate: Option<u64>,
}

/// Where a connection is in its handshake. Each state holds what exists in
/// it, so an impossible mix (a peer both online and awaiting auth, a token
/// with no host to sign it) cannot be written down.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Handshake {
    /// No CNXN from the peer yet (the host's own CNXN is already queued).
    AwaitingCnxn,
    /// Device role with [`Config::require_auth`]: the host's CNXN, answered
    /// only once the host proves it holds a trusted key.
    AwaitingAuth {
        peer: Peer,
        /// The token a signature must sign; one signature each.
        token: Option<Bytes>,
        /// A refused signature's next token is owed from then on (ns;
        /// [`Connection::refuse_signature`]).
        next_token_at: Option<u64>,
        /// When the host's first CNXN of this wait arrived (ns): where
        /// [`Config::auth_timeout`] counts from without a handshake timeout.
        since: u64,
    },
    /// Device role: the host's CNXN was answered with STLS; its STLS comes next.
    AwaitingStls { peer: Peer },
    /// STLS exchanged: the driver runs the TLS handshake, then calls
    /// [`Connection::tls_established`]. The device keeps the host's CNXN to
    /// answer once TLS is up; the host waits for the device's CNXN.
    StartingTls { peer: Option<Peer> },
    /// CNXN exchanged: streams may open.
    Online(Peer),
    /// A handshake deadline passed (`timers.rs`): nothing more is taken or
    /// sent; the driver closes the connection.
    TimedOut(HandshakeStage),
}

/// The lifecycle of one stream.
///
/// The peer's CLSE or a second CNXN (the peer restarted its side) ends a
/// stream from the peer's side. A stream it catches before its OPEN was
/// answered, or while we were closing it, still takes a late answer (OKAY,
/// accept, CLSE) as it would have before: those are the `*PeerGone` states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamState {
    /// We sent OPEN and wait for OKAY or CLSE.
    Opening,
    /// The peer sent OPEN; the application has not answered yet.
    AwaitingAccept,
    /// Both ways open.
    Open,
    /// The application closed: queued data goes out, then CLSE.
    Closing,
    /// The peer closed (its CLSE, or a second CNXN): what arrived may still
    /// be read, nothing more is sent.
    PeerClosed,
    /// `Opening` when a second CNXN arrived.
    OpeningPeerGone,
    /// `AwaitingAccept` when the peer closed it or a second CNXN arrived.
    AwaitingAcceptPeerGone,
    /// `Closing` when a second CNXN arrived: a CLSE then ends it silently.
    ClosingPeerGone,
}

impl StreamState {
    /// Whether the OPEN was answered (the peer's OKAY, or our accept).
    fn answered(self) -> bool {
        matches!(
            self,
            StreamState::Open
                | StreamState::Closing
                | StreamState::PeerClosed
                | StreamState::ClosingPeerGone
        )
    }

    /// Whether the peer closed the stream or restarted.
    fn peer_closed(self) -> bool {
        matches!(
            self,
            StreamState::PeerClosed
                | StreamState::OpeningPeerGone
                | StreamState::AwaitingAcceptPeerGone
                | StreamState::ClosingPeerGone
        )
    }

    /// Whether the application closed the stream.
    fn closing(self) -> bool {
        matches!(self, StreamState::Closing | StreamState::ClosingPeerGone)
    }

    /// The state once the peer closed the stream or restarted.
    fn peer_gone(self) -> StreamState {
        match self {
            StreamState::Opening => StreamState::OpeningPeerGone,
            StreamState::AwaitingAccept => StreamState::AwaitingAcceptPeerGone,
            StreamState::Closing => StreamState::ClosingPeerGone,
            StreamState::Open => StreamState::PeerClosed,
            already => already,
        }
    }
}

#[derive(Debug)]
struct Stream {
    remote_id: u32,
    state: StreamState,
    send: SendCredit,
    recv: RecvCredit,
    /// Written by the application, not yet sent as WRTE.
    outgoing: SendQueue,
    /// Received, not yet read by the application.
    incoming: VecDeque<Bytes>,
    /// Bytes read from the front of `incoming`'s first packet, which its
    /// allocation holds until the rest is read.
    front_read: u64,
    /// `write` refused data for a full send buffer: [`Event::Writable`] is
    /// owed once it drains (scheduling, not lifecycle).
    writer_blocked: bool,
    /// Whether the stream is in `Connection::sendable` now: a stream appears
    /// there at most once, or streams that receive more OKAYs get more turns
    /// (measured in the simulator: 3 streams finishing 35% apart).
    in_sendable: bool,
    /// Since when data waits for credit from the peer (ns).
    credit_blocked_since: Option<u64>,
    /// Since when the peer waits for our consumer to free credit (ns).
    consumer_blocked_since: Option<u64>,
    stats: StreamStats,
}

impl Stream {
    /// Queues the stream for a turn in `poll_transmit` unless it has one.
    fn queue_for_send(&mut self, sendable: &mut VecDeque<u32>, local_id: u32) {
        if !self.in_sendable {
            self.in_sendable = true;
            sendable.push_back(local_id);
        }
    }

    /// After the application queued data: an open stream may now wait for
    /// credit, and one that had nothing to send needs a turn.
    fn on_queued(
        &mut self,
        was_empty: bool,
        sendable: &mut VecDeque<u32>,
        local_id: u32,
        now_ns: u64,
    ) {
        if !self.state.answered() {
            return;
        }
        self.note_credit(now_ns);
        if was_empty {
            self.queue_for_send(sendable, local_id);
        }
    }

    /// Starts or ends the "waiting for credit" interval after a change.
    fn note_credit(&mut self, now_ns: u64) {
        let waiting = !self.outgoing.is_empty() && !self.send.can_send();
        match (waiting, self.credit_blocked_since) {
            (true, None) => {
                tracing::trace!(now_ns, "stream out of credit");
                self.credit_blocked_since = Some(now_ns);
            }
            (false, Some(since)) => {
                tracing::trace!(
                    now_ns,
                    waited_ns = now_ns - since,
                    "stream has credit again"
                );
                self.stats.credit_blocked_ns += now_ns.saturating_sub(since);
                self.credit_blocked_since = None;
            }
            _ => {}
        }
    }

    /// Starts or ends the "waiting for our consumer" interval after a change.
    fn note_consumer(&mut self, now_ns: u64) {
        match (self.recv.withholding(), self.consumer_blocked_since) {
            (true, None) => self.consumer_blocked_since = Some(now_ns),
            (false, Some(since)) => {
                self.stats.consumer_blocked_ns += now_ns.saturating_sub(since);
                self.consumer_blocked_since = None;
            }
            _ => {}
        }
    }
}

/// One connection.
#[derive(Debug)]
pub struct Connection {
    config: Config,
    handshake: Handshake,
    streams: HashMap<u32, Stream>,
    next_id: u32,
    control: VecDeque<Packet>,
    /// Streams that may have data to send, in round-robin order.
    sendable: VecDeque<u32>,
    events: VecDeque<Event>,
    okay_scratch: Vec<Option<i32>>,
    /// Streams we closed while our OPEN was unanswered.
    abandoned_opens: HashSet<u32>,
    /// Host role: AUTH tokens received on this connection, counting from 1
    /// (the responder picks a key by it); never reset.
    auth_challenges: u32,
    /// Misbehaviour of the peer logged so far (see `peer_warn!`).
    complaints: u64,
    /// How fast more of it is read (`pacing.rs`).
    pace: MisbehaviourPace,
    /// The driver's clock (ns since an arbitrary start), for round trips and
    /// rates; set with [`Connection::set_time`]. A simulator passes virtual time.
    now_ns: u64,
    /// Device role: the host began TLS before its STLS reached us, which
    /// then comes inside TLS and is ignored once.
    late_stls: bool,
    /// The peer has been online: the handshake's deadlines are over, even
    /// when a second CNXN asks the host to authenticate again.
    handshake_completed: bool,
    /// Host role: the reverse forwards asked for, which are all the device
    /// may open here (`reverse_forwards.rs`).
    reverse_forwards: ReverseForwards,
}

impl Connection {
    pub fn new(config: Config) -> Connection {
        let mut connection = Connection {
            config,
            handshake: Handshake::AwaitingCnxn,
            streams: HashMap::new(),
            next_id: 1,
            control: VecDeque::new(),
            sendable: VecDeque::new(),
            events: VecDeque::new(),
            okay_scratch: Vec::new(),
            abandoned_opens: HashSet::new(),
            auth_challenges: 0,
            complaints: 0,
            pace: MisbehaviourPace::default(),
            now_ns: 0,
            late_stls: false,
            handshake_completed: false,
            reverse_forwards: ReverseForwards::default(),
        };
        if connection.config.role == Role::Host {
            // The host speaks first on every transport.
            let banner = connection.config.banner.encode();
            connection.control.push_back(Packet::new(
                Command::Cnxn,
                connection.config.version,
                connection.config.max_payload,
                banner.into_bytes(),
            ));
        }
        connection
    }

    /// Tells the engine the time (monotonic, since any fixed start). Drivers
    /// call it before feeding packets or moving stream data.
    pub fn set_time(&mut self, now: std::time::Duration) {
        self.now_ns = self.now_ns.max(now.as_nanos() as u64);
    }

    pub fn role(&self) -> Role {
        self.config.role
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn peer(&self) -> Option<&Peer> {
        match &self.handshake {
            Handshake::Online(peer) => Some(peer),
            _ => None,
        }
    }

    /// When the driver may read this connection again, on the clock
    /// [`Connection::set_time`] reads, if the peer misbehaved past its
    /// burst and must wait (`pacing.rs`); `None`: read on.
    pub fn reading_paused_until(&self) -> Option<std::time::Duration> {
        self.pace.paused_until(self.now_ns)
    }

    pub fn is_online(&self) -> bool {
        self.peer().is_some()
    }

    fn delayed_ack(&self) -> bool {
        self.peer().is_some_and(|p| p.delayed_ack)
    }

    /// Largest payload we accept in the next packet: ours until CNXN, the
    /// negotiated minimum after.
    pub fn max_incoming_payload(&self) -> u32 {
        self.peer()
            .map_or(self.config.max_payload, |p| p.max_payload)
    }

    fn max_outgoing_payload(&self) -> usize {
        self.peer()
            .map_or(self.config.max_payload, |p| p.max_payload) as usize
    }

    /// Whether payload checksums are in use: only with a protocol-v1.0 peer, and
    /// before the handshake, when the peer's version is still unknown.
    pub fn checksums(&self) -> bool {
        self.peer()
            .is_none_or(|p| p.version < VERSION_SKIP_CHECKSUM)
    }

    /// The header to put on the wire for `outgoing`, whose payload must be in
    /// memory when [`Connection::checksums`] are on (the sum covers its
    /// bytes; the driver reads file ranges first).
    pub fn header_for_outgoing(&self, outgoing: &Outgoing) -> Header {
        let data_crc32 = if self.checksums() {
            assert!(
                !outgoing.payload.has_file_ranges(),
                "a checksummed payload must be read first"
            );
            // A plain byte sum: the pieces' sums add up to the whole's.
            outgoing.payload.parts().fold(0u32, |sum, part| match part {
                Part::Bytes(bytes) => sum.wrapping_add(oxadb_wire::packet::payload_checksum(bytes)),
                Part::File(_) => sum,
            })
        } else {
            0
        };
        Header {
            command: outgoing.command,
            arg0: outgoing.arg0,
            arg1: outgoing.arg1,
            data_length: outgoing.payload.len() as u32,
            data_crc32,
        }
    }

    /// The header to put on the wire for `packet`.
    pub fn header_for(&self, packet: &Packet) -> Header {
        packet.header(self.checksums())
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    pub fn stream_stats(&self, id: StreamId) -> Option<StreamStats> {
        let open_interval = |since: Option<u64>| since.map_or(0, |t| self.now_ns.saturating_sub(t));
        self.streams.get(&id.0).map(|s| StreamStats {
            credit_blocked_ns: s.stats.credit_blocked_ns + open_interval(s.credit_blocked_since),
            consumer_blocked_ns: s.stats.consumer_blocked_ns
                + open_interval(s.consumer_blocked_since),
            window: s.recv.window(),
            headroom: s.recv.headroom(),
            credit_outstanding: s.recv.credit_outstanding(),
            min_rtt_ns: s.recv.min_rtt_ns(),
            consume_rate: s.recv.rate(),
            ..s.stats
        })
    }

    /// Ids of the streams that currently exist.
    pub fn stream_ids(&self) -> impl Iterator<Item = StreamId> + '_ {
        self.streams.keys().map(|&id| StreamId(id))
    }

    fn allocate_id(&mut self) -> u32 {
        let id = self.next_id;
        // Ids are never reused within a connection, so a late packet for a
        // closed stream can be told from one for a stream that never existed.
        self.next_id = self.next_id.checked_add(1).unwrap_or(1);
        id
    }

    fn was_allocated(&self, id: u32) -> bool {
        id != 0 && id < self.next_id
    }

    fn new_recv_credit(&self) -> RecvCredit {
        let local_buffer = self.config.local_buffer;
        if !self.delayed_ack() {
            return RecvCredit::classic(local_buffer);
        }
        match self.config.credit_policy {
            CreditPolicy::Aosp => {
                RecvCredit::aosp(local_buffer, u64::from(self.config.initial_credit))
            }
            CreditPolicy::Adaptive { max_window } => {
                let packet = u64::from(self.max_incoming_payload());
                let params = AdaptiveParams {
                    // Two packets: one being consumed while the next arrives.
                    initial: 2 * packet,
                    max_window: u64::from(max_window),
                    floor: packet,
                    budget: self.config.memory_budget.clone(),
                    ack_headroom: self.config.ack_headroom,
                    slow_start: self.config.slow_start,
                };
                RecvCredit::adaptive(params, self.now_ns)
            }
        }
    }

    /// The credit announced when a stream opens (delayed-ack mode).
    fn opening_grant(&self, recv: &RecvCredit) -> u32 {
        recv.initial_grant()
            .map_or(self.config.initial_credit, |grant| {
                grant.min(i32::MAX as u64) as u32
            })
    }

    fn new_stream(&self, remote_id: u32, state: StreamState, send: SendCredit) -> Stream {
        Stream {
            remote_id,
            state,
            send,
            recv: self.new_recv_credit(),
            outgoing: SendQueue::default(),
            incoming: VecDeque::new(),
            front_read: 0,
            writer_blocked: false,
            in_sendable: false,
            credit_blocked_since: None,
            consumer_blocked_since: None,
            stats: StreamStats {
                delayed_ack: self.delayed_ack(),
                ..StreamStats::default()
            },
        }
    }

    /// Handles one packet from the peer. An error means the connection must be
    /// closed (the caller logs the reason).
    pub fn handle_packet(&mut self, header: &Header, payload: Bytes) -> Result<(), ProtocolError> {
        if matches!(self.handshake, Handshake::TimedOut(_)) {
            // Read before the driver closed the connection: too late.
            return Ok(());
        }
        if self.is_online() && self.checksums() {
            let actual = oxadb_wire::packet::payload_checksum(&payload);
            if actual != header.data_crc32 {
                return Err(ProtocolError::Checksum {
                    command: header.command,
                    expected: header.data_crc32,
                    actual,
                });
            }
        }
        match header.command {
            Command::Cnxn => self.on_cnxn(header, &payload),
            // A device challenges a host before CNXN; answering is the host's job.
            Command::Auth if self.config.role == Role::Host => {
                self.on_auth_as_host(header, payload)
            }
            Command::Auth => self.on_auth_as_device(header, payload),
            Command::Stls => self.on_stls(header),
            command if self.awaiting_auth() => Err(ProtocolError::BeforeAuth(command)),
            command if !self.is_online() => Err(ProtocolError::BeforeHandshake(command)),
            Command::Open => {
                self.on_open(header, payload);
                Ok(())
            }
            Command::Okay => self.on_okay(header, &payload),
            Command::Wrte => self.on_wrte(header, payload),
            Command::Clse => {
                self.on_clse(header);
                Ok(())
            }
        }
    }

    fn on_cnxn(&mut self, header: &Header, payload: &[u8]) -> Result<(), ProtocolError> {
        let banner = Banner::parse(payload)?;
        if header.arg0 < VERSION_CHECKSUMMED {
            return Err(ProtocolError::BadVersion(header.arg0));
        }
        if header.arg1 == 0 {
            return Err(ProtocolError::BadMaxPayload(header.arg1));
        }
        if self.is_online() {
            // A second CNXN means the peer restarted its side: drop every stream.
            self.reset_streams();
        }
        let peer = Peer {
            delayed_ack: self.config.banner.has_feature(feature::DELAYED_ACK)
                && banner.has_feature(feature::DELAYED_ACK),
            version: header.arg0.min(self.config.version),
            max_payload: header.arg1.min(self.config.max_payload),
            banner,
        };
        tracing::debug!(
            version = format_args!("{:#010x}", peer.version),
            max_payload = peer.max_payload,
            delayed_ack = peer.delayed_ack,
            banner = %peer.banner.encode(),
            "CNXN negotiated"
        );
        if self.config.role == Role::Device {
            match self.config.tls {
                Tls::Off => {}
                Tls::Required if !host_supports_tls(&peer.banner) => {
                    return Err(ProtocolError::TlsRequired);
                }
                Tls::On if !host_supports_tls(&peer.banner) => {
                    tracing::info!(
                        banner = %peer.banner.encode(),
                        "host gets plaintext (--tls on): its CNXN banner lacks `sendrecv_v2`, \
                         so it is an adb older than Android 11 that cannot answer STLS"
                    );
                }
                Tls::On | Tls::Required => {
                    // AOSP adb.cpp handle_new_connection: STLS is the first
                    // answer to CNXN; AUTH is skipped (the client certificate
                    // authenticates) and CNXN follows the TLS handshake.
                    self.handshake = Handshake::AwaitingStls { peer };
                    self.control.push_back(Packet::new(
                        Command::Stls,
                        STLS_VERSION,
                        0,
                        Bytes::new(),
                    ));
                    return Ok(());
                }
            }
        }
        if self.config.role == Role::Device && self.config.require_auth {
            // A CNXN (even a repeated one: the host restarted) is answered
            // only after the host proves it holds a trusted key. A delayed
            // token still owed is sent when due, as before the CNXN, and the
            // time to authenticate still counts from the first one.
            let (next_token_at, since) = match self.handshake {
                Handshake::AwaitingAuth {
                    next_token_at,
                    since,
                    ..
                } => (next_token_at, since),
                _ => (None, self.now_ns),
            };
            self.handshake = Handshake::AwaitingAuth {
                peer,
                token: None,
                next_token_at,
                since,
            };
            self.events.push_back(Event::TokenNeeded);
            return Ok(());
        }
        self.go_online(peer);
        Ok(())
    }

    fn on_stls(&mut self, header: &Header) -> Result<(), ProtocolError> {
        if header.arg0 != STLS_VERSION {
            return Err(ProtocolError::BadStlsVersion(header.arg0));
        }
        match (&self.handshake, self.config.role) {
            (Handshake::AwaitingStls { peer }, Role::Device) => {
                let peer = Some(peer.clone());
                self.handshake = Handshake::StartingTls { peer };
                Ok(())
            }
            (Handshake::AwaitingCnxn, Role::Host) if self.config.tls != Tls::Off => {
                // AOSP adb.cpp handle_packet: the host answers with its own
                // STLS, then starts the TLS handshake as the client.
                self.control
                    .push_back(Packet::new(Command::Stls, STLS_VERSION, 0, Bytes::new()));
                self.handshake = Handshake::StartingTls { peer: None };
                Ok(())
            }
            (Handshake::AwaitingCnxn, Role::Host) => {
                Err(ProtocolError::UnexpectedStls("TLS is off on this host"))
            }
            (Handshake::Online(_), Role::Device) if self.late_stls => {
                self.late_stls = false;
                Ok(())
            }
            (Handshake::Online(_), _) => Err(ProtocolError::UnexpectedStls("already connected")),
            (Handshake::StartingTls { .. }, _) => {
                Err(ProtocolError::UnexpectedStls("TLS is already starting"))
            }
            _ => Err(ProtocolError::UnexpectedStls("the device never sent STLS")),
        }
    }

    /// STLS was exchanged: the driver must now run the TLS handshake on the
    /// same socket (no packet may be read or written in plaintext) and call
    /// [`Connection::tls_established`] once it succeeds.
    pub fn starting_tls(&self) -> bool {
        matches!(self.handshake, Handshake::StartingTls { .. })
    }

    /// Device role: after our STLS, the host's TLS ClientHello arrived
    /// before its STLS. adb queues its STLS for its writer thread and starts
    /// the handshake on another thread that holds the connection's lock
    /// (AOSP transport.cpp `BlockingConnectionAdapter::DoTlsHandshake`), so
    /// its STLS may follow the handshake, inside TLS; it is ignored then.
    pub fn tls_began_early(&mut self) {
        if let Handshake::AwaitingStls { peer } = &self.handshake {
            let peer = Some(peer.clone());
            self.handshake = Handshake::StartingTls { peer };
            self.late_stls = true;
        }
    }

    /// A handshake deadline passed ([`Event::HandshakeTimedOut`]): the
    /// connection is given up.
    pub fn handshake_timed_out(&self) -> bool {
        matches!(self.handshake, Handshake::TimedOut(_))
    }

    /// Device role: STLS was sent and TLS is not up yet (the host's STLS or
    /// the TLS handshake is outstanding).
    pub fn tls_pending(&self) -> bool {
        matches!(
            self.handshake,
            Handshake::AwaitingStls { .. } | Handshake::StartingTls { .. }
        )
    }

    /// The TLS handshake succeeded (the device checked the host's
    /// certificate, which stands in for AUTH): a device answers the host's
    /// CNXN now; a host waits for it.
    pub fn tls_established(&mut self) {
        match &self.handshake {
            Handshake::StartingTls { peer: Some(peer) } => {
                let peer = peer.clone();
                self.go_online(peer);
            }
            Handshake::StartingTls { peer: None } => self.handshake = Handshake::AwaitingCnxn,
            _ => {}
        }
    }

    fn go_online(&mut self, peer: Peer) {
        let mut banner = self.config.banner.clone();
        banner.features.retain(|f| {
            !feature::ONLY_IF_ASKED.contains(&f.as_str()) || peer.banner.has_feature(f)
        });
        let reply = Packet::new(
            Command::Cnxn,
            peer.version,
            peer.max_payload,
            banner.encode().into_bytes(),
        );
        self.handshake = Handshake::Online(peer);
        self.handshake_completed = true;
        if self.config.role == Role::Device {
            self.control.push_back(reply);
        }
        self.events.push_back(Event::Connected);
    }

    fn on_auth_as_device(&mut self, header: &Header, payload: Bytes) -> Result<(), ProtocolError> {
        let token = match &mut self.handshake {
            Handshake::Online(_) => return Err(ProtocolError::AuthWhenOnline),
            Handshake::AwaitingCnxn => return Err(ProtocolError::BeforeHandshake(Command::Auth)),
            // All AUTH is ignored once TLS is in use (AOSP adb.cpp handle_packet).
            Handshake::AwaitingStls { .. } | Handshake::StartingTls { .. } => return Ok(()),
            Handshake::AwaitingAuth { token, .. } => token,
            Handshake::TimedOut(_) => return Ok(()),
        };
        match header.arg0 {
            AUTH_SIGNATURE => match token.take() {
                Some(token) => self.events.push_back(Event::AuthSignature {
                    token,
                    signature: payload,
                }),
                // Each token takes one signature: a second one (a replay, or a
                // host trying keys faster than we hand out tokens) proves nothing.
                None => peer_warn!(self, "ignoring an AUTH signature with no token outstanding"),
            },
            AUTH_RSAPUBLICKEY => self.events.push_back(Event::AuthPublicKey { key: payload }),
            other => return Err(ProtocolError::BadAuth(other)),
        }
        Ok(())
    }

    /// Device role: challenges the host with `token` (fresh random bytes,
    /// [`oxadb_wire`]'s 20-byte AUTH token), replacing any outstanding one.
    pub fn send_auth_token(&mut self, token: Bytes) {
        let Handshake::AwaitingAuth {
            token: outstanding, ..
        } = &mut self.handshake
        else {
            return;
        };
        *outstanding = Some(token.clone());
        self.control
            .push_back(Packet::new(Command::Auth, AUTH_TOKEN, 0, token));
    }

    /// Device role: the host's signature was refused. A fresh token is
    /// owed to it ([`Event::TokenNeeded`]) once `retry_after` has passed
    /// (the authenticator's rate limit, docs/security.md), at once when
    /// that is zero; [`Connection::handle_timeout`] asks for it when due.
    pub fn refuse_signature(&mut self, retry_after: std::time::Duration) {
        let now = self.now_ns;
        let Handshake::AwaitingAuth { next_token_at, .. } = &mut self.handshake else {
            return;
        };
        if retry_after.is_zero() {
            self.events.push_back(Event::TokenNeeded);
        } else {
            *next_token_at = Some(now.saturating_add(retry_after.as_nanos() as u64));
        }
    }

    /// Device role: the host is authenticated; answer its CNXN.
    pub fn authorize(&mut self) {
        if let Handshake::AwaitingAuth { peer, .. } = &self.handshake {
            let peer = peer.clone();
            self.go_online(peer);
        }
    }

    /// Control packets (OKAY, CLSE, handshake) waiting to be sent. A peer
    /// that sends but never reads makes this grow; drivers stop reading
    /// while it is long.
    pub fn control_backlog(&self) -> usize {
        self.control.len()
    }

    /// Device role: a host has sent CNXN and not yet authenticated.
    pub fn awaiting_auth(&self) -> bool {
        matches!(self.handshake, Handshake::AwaitingAuth { .. })
    }

    fn on_auth_as_host(&mut self, header: &Header, payload: Bytes) -> Result<(), ProtocolError> {
        if self.starting_tls() {
            // AUTH is ignored once TLS is in use (AOSP adb.cpp handle_packet).
            return Ok(());
        }
        if header.arg0 != AUTH_TOKEN {
            return Err(ProtocolError::BadAuth(header.arg0));
        }
        self.auth_challenges += 1;
        self.events.push_back(Event::AuthChallenge {
            token: payload,
            attempt: self.auth_challenges,
        });
        Ok(())
    }

    /// Answers the latest [`Event::AuthChallenge`] (host role).
    pub fn send_auth(&mut self, reply: AuthReply) {
        let (kind, payload) = match reply {
            AuthReply::Signature(signature) => (AUTH_SIGNATURE, signature),
            AuthReply::PublicKey(key) => (AUTH_RSAPUBLICKEY, key),
        };
        self.control
            .push_back(Packet::new(Command::Auth, kind, 0, payload));
    }

    fn reset_streams(&mut self) {
        let mut ids: Vec<u32> = self.streams.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let stream = self.streams.get_mut(&id).expect("listed");
            stream.state = stream.state.peer_gone();
            stream.outgoing.clear();
            // Nothing waits for credit now: the stall timer must not fire.
            stream.note_credit(self.now_ns);
            self.events.push_back(Event::Closed(StreamId(id)));
        }
        self.control.clear();
    }

    fn on_open(&mut self, header: &Header, payload: Bytes) {
        let remote_id = header.arg0;
        if remote_id == 0 {
            peer_warn!(self, "ignoring OPEN with remote id 0");
            return;
        }
        // OPEN.arg1 is the opener's initial credit for us, non-zero exactly when
        // delayed_ack was negotiated; AOSP refuses a mismatch with CLSE.
        if self.delayed_ack() != (header.arg1 != 0) {
            peer_warn!(
                self,
                remote_id,
                arg1 = header.arg1,
                delayed_ack = self.delayed_ack(),
                "refusing OPEN: arg1 does not match the negotiated delayed_ack"
            );
            self.control
                .push_back(Packet::new(Command::Clse, 0, remote_id, Bytes::new()));
            return;
        }
        let end = payload.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        let Ok(service) = std::str::from_utf8(&payload[..end]) else {
            peer_warn!(self, remote_id, "refusing OPEN: service name is not UTF-8");
            self.control
                .push_back(Packet::new(Command::Clse, 0, remote_id, Bytes::new()));
            return;
        };
        if self.config.role == Role::Host && !self.reverse_forwards.permits(service) {
            peer_warn!(
                self,
                remote_id,
                %service,
                "refusing the device's OPEN: no reverse forward of this connection goes to it"
            );
            self.control
                .push_back(Packet::new(Command::Clse, 0, remote_id, Bytes::new()));
            return;
        }
        let service = service.to_string();
        if self.streams.len() >= self.config.max_streams {
            peer_warn!(self,
                remote_id,
                %service,
                open_streams = self.streams.len(),
                "refusing OPEN: the connection already has its maximum of streams"
            );
            self.control
                .push_back(Packet::new(Command::Clse, 0, remote_id, Bytes::new()));
            return;
        }
        let send = if self.delayed_ack() {
            SendCredit::Delayed {
                available: i64::from(header.arg1),
            }
        } else {
            SendCredit::Classic { in_flight: false }
        };
        let id = self.allocate_id();
        let stream = self.new_stream(remote_id, StreamState::AwaitingAccept, send);
        self.streams.insert(id, stream);
        self.events.push_back(Event::OpenRequest {
            id: StreamId(id),
            service,
        });
    }

    fn on_okay(&mut self, header: &Header, payload: &[u8]) -> Result<(), ProtocolError> {
        let (remote_id, local_id) = (header.arg0, header.arg1);
        if remote_id == 0 || local_id == 0 {
            peer_warn!(self, remote_id, local_id, "ignoring OKAY with a zero id");
            return Ok(());
        }
        let acked = match payload.len() {
            0 => None,
            4 => Some(i32::from_le_bytes(payload.try_into().expect("4 bytes"))),
            len => {
                peer_warn!(
                    self,
                    local_id,
                    len,
                    "ignoring OKAY with a payload that is not an i32"
                );
                return Ok(());
            }
        };
        let delayed = self.delayed_ack();
        let Some(stream) = self.streams.get_mut(&local_id) else {
            if !self.was_allocated(local_id) {
                return Err(ProtocolError::UnknownStream {
                    command: Command::Okay,
                    id: local_id,
                });
            }
            // We gave up on this OPEN before the peer accepted it: close the
            // peer's end too, as AOSP does. Other late OKAYs need no answer.
            if self.abandoned_opens.remove(&local_id) {
                self.control.push_back(Packet::new(
                    Command::Clse,
                    local_id,
                    remote_id,
                    Bytes::new(),
                ));
            }
            return Ok(());
        };
        if acked.is_some() != delayed {
            peer_warn!(
                self,
                local_id,
                ?acked,
                delayed,
                "OKAY payload does not match delayed_ack mode"
            );
        }
        match stream.state {
            StreamState::Opening | StreamState::OpeningPeerGone => {
                stream.remote_id = remote_id;
                stream.state = match stream.state {
                    StreamState::Opening => StreamState::Open,
                    _ => StreamState::PeerClosed,
                };
                stream.recv.end_rtt_probe(self.now_ns);
                stream.send.on_okay(acked);
                self.events.push_back(Event::Opened(StreamId(local_id)));
            }
            state if state.answered() && stream.remote_id == remote_id => {
                stream.stats.okays_received += 1;
                stream.send.on_okay(acked);
            }
            _ => {
                peer_warn!(
                    self,
                    local_id,
                    remote_id,
                    "ignoring OKAY with a mismatched remote id"
                );
                return Ok(());
            }
        }
        stream.note_credit(self.now_ns);
        // Writers are only ever blocked by a full send buffer, which drains in
        // `poll_transmit`; credit just decides whether queued data may go out.
        if stream.send.can_send() && !stream.outgoing.is_empty() {
            stream.queue_for_send(&mut self.sendable, local_id);
        }
        Ok(())
    }

    fn on_wrte(&mut self, header: &Header, payload: Bytes) -> Result<(), ProtocolError> {
        let (remote_id, local_id) = (header.arg0, header.arg1);
        let Some(stream) = self.streams.get_mut(&local_id) else {
            if self.was_allocated(local_id) {
                // Data in flight when we closed the stream; nothing to deliver it to.
                return Ok(());
            }
            return Err(ProtocolError::UnknownStream {
                command: Command::Wrte,
                id: local_id,
            });
        };
        if !matches!(stream.state, StreamState::Open | StreamState::Closing)
            || stream.remote_id != remote_id
        {
            peer_warn!(
                self,
                local_id,
                remote_id,
                "ignoring WRTE for a stream not open with that peer id"
            );
            return Ok(());
        }
        let len = payload.len();
        // A peer that ignores credit would make us buffer without limit.
        let max_packet = match &self.handshake {
            Handshake::Online(peer) => peer.max_payload,
            _ => self.config.max_payload,
        } as usize;
        if let Err(detail) = stream.recv.admit(len, max_packet) {
            return Err(ProtocolError::BeyondCredit {
                id: local_id,
                detail,
            });
        }
        stream.stats.bytes_received += len as u64;
        stream.stats.packets_received += 1;
        stream.recv.on_received(len, self.now_ns);
        if len > 0 {
            stream.incoming.push_back(payload);
        }
        self.queue_okays(local_id);
        if let Some(stream) = self.streams.get_mut(&local_id) {
            stream.note_consumer(self.now_ns);
        }
        self.events.push_back(Event::Readable(StreamId(local_id)));
        Ok(())
    }

    fn on_clse(&mut self, header: &Header) {
        let (remote_id, local_id) = (header.arg0, header.arg1);
        let Some(stream) = self.streams.get_mut(&local_id) else {
            // A stream that is gone may see a late CLSE (both sides closing
            // at once); one that never existed is the peer's invention.
            if !self.was_allocated(local_id) {
                peer_warn!(
                    self,
                    local_id,
                    remote_id,
                    "ignoring CLSE for a stream never opened"
                );
            }
            return;
        };
        // CLSE(0, id) refuses our OPEN; otherwise the remote id must match.
        match stream.state {
            StreamState::Opening | StreamState::OpeningPeerGone => {
                self.streams.remove(&local_id);
                self.events.push_back(Event::Refused(StreamId(local_id)));
            }
            _ if remote_id != 0 && remote_id != stream.remote_id => {
                peer_warn!(
                    self,
                    local_id,
                    remote_id,
                    "ignoring CLSE with a mismatched remote id"
                );
            }
            // Its CLSE came already and was answered; adbd removes the
            // socket at the first (AOSP `sockets.cpp`), so another is noise.
            _ if stream.state.peer_closed() => {
                peer_warn!(self, local_id, "ignoring a second CLSE");
            }
            _ => {
                stream.outgoing.clear();
                // Nothing waits for credit now: the stall timer must not
                // close the stream again (a second CLSE, its unread data lost).
                stream.note_credit(self.now_ns);
                let closing = stream.state.closing();
                stream.state = stream.state.peer_gone();
                let reply = (!closing).then(|| {
                    // AOSP answers a CLSE with its own when the local side closes.
                    Packet::new(Command::Clse, local_id, stream.remote_id, Bytes::new())
                });
                if closing {
                    self.streams.remove(&local_id);
                } else {
                    self.events.push_back(Event::Closed(StreamId(local_id)));
                }
                self.control.extend(reply);
            }
        }
    }

    fn queue_okays(&mut self, local_id: u32) {
        let Some(stream) = self.streams.get_mut(&local_id) else {
            return;
        };
        if stream.state.peer_closed() || stream.state.closing() {
            return;
        }
        self.okay_scratch.clear();
        stream.recv.take_okays(&mut self.okay_scratch, self.now_ns);
        for acked in self.okay_scratch.drain(..) {
            stream.stats.okays_sent += 1;
            let payload = acked.map_or(Bytes::new(), |n| Bytes::copy_from_slice(&n.to_le_bytes()));
            self.control.push_back(Packet::new(
                Command::Okay,
                local_id,
                stream.remote_id,
                payload,
            ));
        }
    }

    /// Opens a stream to `service` (e.g. `shell,v2,raw:ls`). The result arrives
    /// as [`Event::Opened`] or [`Event::Refused`].
    pub fn open(&mut self, service: &str) -> Result<StreamId, StreamError> {
        if !self.is_online() {
            return Err(StreamError::Offline);
        }
        if self.config.role == Role::Host {
            self.reverse_forwards.note_opened(service);
        }
        let delayed = self.delayed_ack();
        let id = self.allocate_id();
        // The credit the peer may use on this stream travels in OPEN.arg1 only
        // with delayed_ack; the peer's grant for us arrives in its OKAY.
        let send = if delayed {
            SendCredit::Delayed { available: 0 }
        } else {
            SendCredit::Classic { in_flight: false }
        };
        let mut stream = self.new_stream(0, StreamState::Opening, send);
        let arg1 = if delayed {
            self.opening_grant(&stream.recv)
        } else {
            0
        };
        // OPEN to OKAY is the stream's first round trip.
        stream.recv.start_rtt_probe(self.now_ns);
        self.streams.insert(id, stream);
        let mut name = service.as_bytes().to_vec();
        name.push(0);
        self.control
            .push_back(Packet::new(Command::Open, id, arg1, name));
        Ok(StreamId(id))
    }

    /// Accepts a stream the peer opened.
    pub fn accept(&mut self, id: StreamId) -> Result<(), StreamError> {
        let delayed = self.delayed_ack();
        let now_ns = self.now_ns;
        let initial_credit = match self.streams.get(&id.0) {
            Some(stream)
                if matches!(
                    stream.state,
                    StreamState::AwaitingAccept | StreamState::AwaitingAcceptPeerGone
                ) =>
            {
                self.opening_grant(&stream.recv)
            }
            _ => return Err(StreamError::Unknown(id)),
        };
        let stream = self
            .streams
            .get_mut(&id.0)
            .ok_or(StreamError::Unknown(id))?;
        // Our OKAY to the opener's first WRTE: the stream's first round trip
        // (an upper bound when the opener has nothing to send yet).
        stream.recv.start_rtt_probe(now_ns);
        stream.state = match stream.state {
            StreamState::AwaitingAccept => StreamState::Open,
            _ => StreamState::PeerClosed,
        };
        if !stream.outgoing.is_empty() {
            stream.queue_for_send(&mut self.sendable, id.0);
        }
        let payload = if delayed {
            Bytes::copy_from_slice(&(initial_credit as i32).to_le_bytes())
        } else {
            Bytes::new()
        };
        self.control
            .push_back(Packet::new(Command::Okay, id.0, stream.remote_id, payload));
        Ok(())
    }

    /// Refuses a stream the peer opened.
    pub fn refuse(&mut self, id: StreamId) -> Result<(), StreamError> {
        match self.streams.get(&id.0) {
            Some(stream)
                if matches!(
                    stream.state,
                    StreamState::AwaitingAccept | StreamState::AwaitingAcceptPeerGone
                ) =>
            {
                let remote_id = stream.remote_id;
                self.streams.remove(&id.0);
                self.control
                    .push_back(Packet::new(Command::Clse, 0, remote_id, Bytes::new()));
                Ok(())
            }
            _ => Err(StreamError::Unknown(id)),
        }
    }

    /// Queues data for the stream; returns how much was taken (0: wait for
    /// [`Event::Writable`]).
    pub fn write(&mut self, id: StreamId, data: &[u8]) -> Result<usize, StreamError> {
        self.append_within_limit(id, data.len(), |outgoing, taken| {
            outgoing.extend_from_slice(&data[..taken])
        })
    }

    /// Appends up to `len` bytes to the stream's send queue, as many as its
    /// limit has room for (`append` queues the first `taken` of them), and
    /// marks the writer blocked when that is not all.
    fn append_within_limit(
        &mut self,
        id: StreamId,
        len: usize,
        append: impl FnOnce(&mut SendQueue, usize),
    ) -> Result<usize, StreamError> {
        let limit = self.config.send_buffer;
        let stream = self
            .streams
            .get_mut(&id.0)
            .ok_or(StreamError::Unknown(id))?;
        if stream.state.peer_closed() || stream.state.closing() {
            return Err(StreamError::Closed(id));
        }
        let room = limit.saturating_sub(stream.outgoing.len());
        let taken = room.min(len);
        if taken < len {
            stream.writer_blocked = true;
        }
        if taken > 0 {
            let was_empty = stream.outgoing.is_empty();
            append(&mut stream.outgoing, taken);
            stream.on_queued(was_empty, &mut self.sendable, id.0, self.now_ns);
        }
        Ok(taken)
    }

    /// Queues a whole chunk without copying it. Unlike [`Connection::write`]
    /// it takes all of `data` (the caller waits for [`Connection::is_writable`]
    /// first, so the queue overshoots its limit by at most one chunk).
    pub fn write_bytes(&mut self, id: StreamId, data: Bytes) -> Result<(), StreamError> {
        self.write_payload(id, Payload::from(data))
    }

    /// Queues a whole chunk that may hold file ranges, as
    /// [`Connection::write_bytes`] does: it leaves as its own WRTEs, never
    /// merged with its neighbours. Credit and lengths count its file bytes
    /// like any other; the driver sends or reads them.
    pub fn write_payload(&mut self, id: StreamId, data: Payload) -> Result<(), StreamError> {
        self.queue_payload(id, data)
    }

    /// Appends the front of a payload that may hold file ranges to the
    /// stream's copied writes, exactly as [`Connection::write`] takes bytes:
    /// as much as the send buffer has room for (0: wait for
    /// [`Event::Writable`]), split off `data`. The queue then fills and
    /// drains as with copied writes, so WRTEs are cut at the same places.
    pub fn append_payload(
        &mut self,
        id: StreamId,
        data: &mut Payload,
    ) -> Result<usize, StreamError> {
        self.append_within_limit(id, data.len(), |outgoing, taken| {
            outgoing.append_payload(data.split_to(taken))
        })
    }

    fn queue_payload(&mut self, id: StreamId, data: Payload) -> Result<(), StreamError> {
        let stream = self
            .streams
            .get_mut(&id.0)
            .ok_or(StreamError::Unknown(id))?;
        if stream.state.peer_closed() || stream.state.closing() {
            return Err(StreamError::Closed(id));
        }
        if data.is_empty() {
            return Ok(());
        }
        let was_empty = stream.outgoing.is_empty();
        stream.outgoing.push_payload(data);
        if stream.outgoing.len() >= self.config.send_buffer {
            stream.writer_blocked = true;
        }
        stream.on_queued(was_empty, &mut self.sendable, id.0, self.now_ns);
        Ok(())
    }

    /// Takes received data for the application, up to `max` bytes.
    pub fn read(&mut self, id: StreamId, max: usize) -> Result<Read, StreamError> {
        let stream = self
            .streams
            .get_mut(&id.0)
            .ok_or(StreamError::Unknown(id))?;
        let Some(front) = stream.incoming.front_mut() else {
            return Ok(if stream.state.peer_closed() {
                Read::Eof
            } else {
                Read::WouldBlock
            });
        };
        let chunk = if front.len() <= max {
            stream.front_read = 0;
            stream.incoming.pop_front().expect("front exists")
        } else {
            stream.front_read += max as u64;
            front.split_to(max)
        };
        stream
            .recv
            .on_read(chunk.len(), stream.front_read, self.now_ns);
        self.queue_okays(id.0);
        if let Some(stream) = self.streams.get_mut(&id.0) {
            stream.note_consumer(self.now_ns);
        }
        Ok(Read::Data(chunk))
    }

    /// Bytes received on the stream and not yet read.
    pub fn readable_bytes(&self, id: StreamId) -> usize {
        self.streams.get(&id.0).map_or(0, |s| s.recv.buffered())
    }

    /// Whether the stream can take more data right now.
    pub fn is_writable(&self, id: StreamId) -> bool {
        self.streams
            .get(&id.0)
            .is_some_and(|s| s.outgoing.len() < self.config.send_buffer)
    }

    /// Whether the peer has closed the stream (or it no longer exists).
    pub fn is_closed(&self, id: StreamId) -> bool {
        self.streams
            .get(&id.0)
            .is_none_or(|s| s.state.peer_closed())
    }

    /// Closes the stream from our side: queued data is sent first, then CLSE.
    pub fn close(&mut self, id: StreamId) {
        let Some(stream) = self.streams.get_mut(&id.0) else {
            return;
        };
        match stream.state {
            state if state.peer_closed() => {
                log_stream_closed(id.0, stream);
                self.streams.remove(&id.0);
            }
            StreamState::AwaitingAccept => {
                let _ = self.refuse(id);
            }
            // CLSE goes out if the OKAY arrives (see `on_okay` for unknown streams).
            StreamState::Opening => {
                self.streams.remove(&id.0);
                self.abandoned_opens.insert(id.0);
            }
            _ => {
                stream.state = StreamState::Closing;
                if stream.outgoing.is_empty() {
                    self.finish_close(id.0);
                }
            }
        }
    }

    /// Removes the stream and sends its CLSE.
    fn finish_close(&mut self, local_id: u32) {
        if let Some(stream) = self.streams.remove(&local_id) {
            log_stream_closed(local_id, &stream);
            self.control.push_back(Packet::new(
                Command::Clse,
                local_id,
                stream.remote_id,
                Bytes::new(),
            ));
        }
    }

    /// The next packet to send, if any, with its payload in memory, for
    /// drivers that queue no file ranges (the simulator, tests, the
    /// handshake before TLS). No file is read here: a payload given to
    /// [`Connection::write_payload`] or [`Connection::append_payload`] with
    /// file ranges leaves through [`Connection::poll_outgoing`], and taking
    /// it here is a caller's bug (a panic).
    pub fn poll_transmit(&mut self) -> Option<Packet> {
        self.poll_outgoing().map(|outgoing| {
            outgoing
                .into_packet()
                .expect("file ranges leave through poll_outgoing")
        })
    }

    /// The next packet to send, if any. Control packets (handshake, OKAY, CLSE)
    /// go first so acknowledgements are never stuck behind bulk data.
    pub fn poll_outgoing(&mut self) -> Option<Outgoing> {
        if let Some(packet) = self.control.pop_front() {
            return Some(Outgoing::from(packet));
        }
        let max_payload = self.max_outgoing_payload();
        while let Some(local_id) = self.sendable.pop_front() {
            let send_buffer = self.config.send_buffer;
            let Some(stream) = self.streams.get_mut(&local_id) else {
                continue;
            };
            stream.in_sendable = false;
            if !matches!(stream.state, StreamState::Open | StreamState::Closing)
                || stream.outgoing.is_empty()
                || !stream.send.can_send()
            {
                continue;
            }
            // A whole chunk may be shorter than the payload limit: count what
            // actually leaves, not what was asked for.
            let payload = stream.outgoing.take(max_payload);
            let len = payload.len();
            stream.send.on_sent(len);
            stream.note_credit(self.now_ns);
            stream.stats.bytes_sent += len as u64;
            stream.stats.packets_sent += 1;
            let packet = Outgoing {
                command: Command::Wrte,
                arg0: local_id,
                arg1: stream.remote_id,
                payload,
            };
            let more = !stream.outgoing.is_empty() && stream.send.can_send();
            if stream.writer_blocked && stream.outgoing.len() < send_buffer {
                stream.writer_blocked = false;
                self.events.push_back(Event::Writable(StreamId(local_id)));
            }
            if stream.outgoing.is_empty() && stream.state.closing() {
                self.finish_close(local_id);
            } else if more {
                // Round robin: the stream goes to the back so others get a turn.
                stream.queue_for_send(&mut self.sendable, local_id);
            }
            return Some(packet);
        }
        None
    }

    /// Whether [`Connection::poll_transmit`] would return a packet.
    pub fn has_transmit(&self) -> bool {
        !self.control.is_empty() || !self.sendable.is_empty()
    }
}

/// A packet to send whose payload may hold file ranges ([`Payload`]).
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub command: Command,
    pub arg0: u32,
    pub arg1: u32,
    pub payload: Payload,
}

impl From<Packet> for Outgoing {
    fn from(packet: Packet) -> Outgoing {
        Outgoing {
            command: packet.command,
            arg0: packet.arg0,
            arg1: packet.arg1,
            payload: Payload::from(packet.payload),
        }
    }
}

impl Outgoing {
    /// The packet with its payload in one buffer; `None` when the payload
    /// holds file ranges, which the driver sends or reads
    /// (`oxadb_io::ReadRanges`).
    pub fn into_packet(self) -> Option<Packet> {
        let payload = self.payload.in_memory()?;
        Some(Packet::new(self.command, self.arg0, self.arg1, payload))
    }
}

/// One line per finished stream: what it moved and under which flow control.
fn log_stream_closed(local_id: u32, stream: &Stream) {
    let stats = &stream.stats;
    tracing::debug!(
        local_id,
        remote_id = stream.remote_id,
        delayed_ack = stats.delayed_ack,
        bytes_sent = stats.bytes_sent,
        bytes_received = stats.bytes_received,
        packets_sent = stats.packets_sent,
        packets_received = stats.packets_received,
        okays_sent = stats.okays_sent,
        okays_received = stats.okays_received,
        window = stream.recv.window(),
        headroom = stream.recv.headroom(),
        credit_blocked_us = stats.credit_blocked_ns / 1000,
        consumer_blocked_us = stats.consumer_blocked_ns / 1000,
        min_rtt_us = stream.recv.min_rtt_ns().map(|ns| ns / 1000),
        consume_rate = stream.recv.rate(),
        "stream closed"
    );
}
