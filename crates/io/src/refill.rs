//! Keeping a TCP socket's send buffer as full as its path needs, for every
//! sink that writes one (plaintext [`TcpSink`](crate::TcpSink) and TLS [`TlsSink`](crate::tls_stream::TlsSink)).
//!
//! Linux reports a TCP socket writable (EPOLLOUT) only once a third of its
//! send buffer is free (`sk_stream_is_writeable`: free space at least half
//! of what is queued), yet a write succeeds as soon as anything is free
//! (`sk_stream_memory_free`). A writer woken by readiness alone therefore
//! lets the queue fall to two thirds before it refills. Where the send buffer
//! is what limits a connection (a long round trip under the kernel's default
//! `tcp_wmem` maximum of 4 MiB), bytes in flight and so throughput fall with
//! it: 1 Gbit/s at 50 ms moved 48 MB/s that way, and 60 MB/s when the writer
//! also retried every millisecond (iperf3: 54). See docs/benchmarks.md,
//! "On an emulated link".
//!
//! Refilling early helps only while the buffer is small against the path.
//! Where two thirds of it already cover what the congestion control wants in
//! flight, a full buffer only adds to the bottleneck's queue: at 10 ms with a
//! 4 MiB buffer, BBR (stuck in STARTUP while the buffer limits it) then lost
//! thousands of segments a run and the transfer fell to 0.85 of iperf3's
//! (docs/benchmarks.md, "Pulls in two round trips, a window past 32 MiB, and
//! 10 ms again"). So the timer runs only when [`needs_early_refill`] says so,
//! and where the buffer is that large the writer keeps no more queued than
//! twice the path's bandwidth-delay product (`Plan`): iperf3, which
//! writes 1.25 MiB per wake-up, peaks below a full buffer by luck, not rule.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use oxadb_engine::RecentSamples;
use tokio::io::Interest;
use tokio::net::tcp::OwnedWriteHalf;

/// First retry after a write found the buffer full: at 1 Gbit/s a
/// millisecond frees 125 KB, a few percent of a 4 MiB buffer.
const FIRST_RETRY: Duration = Duration::from_millis(1);
/// Retries back off to this while nothing at all is accepted (a peer that
/// stopped reading), so a blocked connection costs a few wake-ups a second.
const LAST_RETRY: Duration = Duration::from_millis(64);

/// When a writer retries a full socket: on readiness, and on a timer that
/// starts at [`FIRST_RETRY`] and doubles while nothing is accepted.
#[derive(Debug)]
pub(crate) struct Refill {
    retry: Duration,
    /// Whether the next attempt bypasses tokio's readiness flag, which
    /// stays clear until the kernel's one-third wake-up.
    eager: bool,
    plan: MeasuredPlan,
    /// What was queued when the writer last waited for the queue to drain
    /// below the plan's cap: no progress since backs the wait off, so a
    /// peer that stopped reading costs a few wake-ups a second here too.
    queued_at_last_wait: Option<u64>,
}

impl Refill {
    pub(crate) fn new() -> Refill {
        Refill {
            retry: FIRST_RETRY,
            eager: false,
            plan: MeasuredPlan::default(),
            queued_at_last_wait: None,
        }
    }

    /// Runs `attempt` (one non-blocking system call on `socket`) until it
    /// succeeds and returns what it returned; a full socket is retried.
    pub(crate) async fn write(
        &mut self,
        socket: &OwnedWriteHalf,
        mut attempt: impl FnMut(BorrowedFd<'_>) -> io::Result<usize>,
    ) -> io::Result<usize> {
        let socket = socket.as_ref();
        loop {
            let cap = self.plan.cap(socket.as_fd());
            let over_cap = cap.and_then(|cap| queued(socket.as_fd()).filter(|&q| q >= cap));
            // A queue that stopped draining may be a dead connection: only a
            // write (or readiness) reports its error, so stop waiting then.
            let stuck = over_cap
                .is_some_and(|queued| self.queued_at_last_wait.is_some_and(|last| queued >= last));
            if let Some(queued) = over_cap.filter(|_| !stuck || connected(socket.as_fd())) {
                if stuck {
                    self.retry = (self.retry * 2).min(LAST_RETRY);
                }
                self.queued_at_last_wait = Some(queued);
                tokio::time::sleep(self.retry).await;
                continue;
            }
            self.queued_at_last_wait = None;
            let result = if self.eager {
                attempt(socket.as_fd())
            } else {
                socket.try_io(Interest::WRITABLE, || attempt(socket.as_fd()))
            };
            match result {
                Ok(written) => {
                    self.retry = FIRST_RETRY;
                    self.eager = false;
                    return Ok(written);
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    if self.eager {
                        self.retry = (self.retry * 2).min(LAST_RETRY);
                    } else if !self.plan.readiness_starves(socket.as_fd()) {
                        socket.writable().await?;
                        continue;
                    }
                    tokio::select! {
                        ready = socket.writable() => {
                            ready?;
                            self.eager = false;
                        }
                        _ = tokio::time::sleep(self.retry) => self.eager = true,
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
    }
}

/// How often the path is measured again: two round trips of a 10 ms link;
/// two `getsockopt` calls each time.
const REMEASURE: Duration = Duration::from_millis(20);
/// The cap's floor: what the link carries in this long, so that the
/// millisecond timer that waits for the queue to drain never starves it.
const CAP_FLOOR_TIME: Duration = Duration::from_millis(4);

/// How the writer refills a full socket, from the path as `TCP_INFO` last
/// measured it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Retry on the millisecond timer as well as on readiness: the buffer is
    /// small against the path, or nothing is measured yet.
    Early,
    /// Wait for readiness, and keep at most `cap` bytes queued.
    OnReadiness { cap: Option<u64> },
}

/// The [`Plan`], measured again every [`REMEASURE`].
#[derive(Debug, Default)]
struct MeasuredPlan {
    measured: Option<(Instant, Plan)>,
    full_rate: FullRate,
}

impl MeasuredPlan {
    /// The cap on queued bytes, if the plan has one.
    fn cap(&mut self, socket: BorrowedFd<'_>) -> Option<u64> {
        match self.current(socket) {
            Plan::OnReadiness { cap } => cap,
            Plan::Early => None,
        }
    }

    /// Whether waking only at the kernel's one-third mark would starve this
    /// connection.
    fn readiness_starves(&mut self, socket: BorrowedFd<'_>) -> bool {
        self.current(socket) == Plan::Early
    }

    /// The plan, measured again once it is [`REMEASURE`] old: measuring on
    /// every full socket as well fed the full-pipe test and the median many
    /// samples a millisecond apart, where they should span round trips.
    fn current(&mut self, socket: BorrowedFd<'_>) -> Plan {
        match self.measured {
            Some((at, plan)) if at.elapsed() < REMEASURE => plan,
            _ => self.measure(socket),
        }
    }

    fn measure(&mut self, socket: BorrowedFd<'_>) -> Plan {
        let now = Instant::now();
        let plan = match (
            rustix::net::sockopt::socket_send_buffer_size(socket),
            path(socket),
        ) {
            (Ok(send_buffer), Some(path)) => {
                match self.full_rate.sample(path.rate, path.min_rtt, now) {
                    Some((peak, typical)) => {
                        plan(send_buffer as u64, Path { rate: peak, ..path }, typical)
                    }
                    None => Plan::Early,
                }
            }
            _ => Plan::Early,
        };
        self.measured = Some((now, plan));
        plan
    }
}

/// BBR's full-pipe test (`bbr_check_full_bw_reached` in tcp_bbr.c) on the
/// delivery rates `TCP_INFO` reports: the link's rate is known once three
/// round trips in a row failed to raise it by a quarter. While it still
/// grows, its bandwidth-delay product is an underestimate: planned from it,
/// 256 MiB over 100 ms with 32 MiB buffers ran at 0.90 of iperf3 instead of
/// 0.96, the cap holding back the ramp.
#[derive(Debug, Default)]
struct FullRate {
    /// The rate that last grew by a quarter.
    full: u64,
    /// The highest sample of the current round.
    round_max: u64,
    round_started: Option<Instant>,
    /// Rounds in a row without a quarter's growth.
    flat_rounds: u32,
    /// The last [`RECENT_SAMPLES`] samples.
    recent: RecentSamples<RECENT_SAMPLES>,
}

/// Samples the rate handed to the plan is the median of. Single samples
/// at 10 ms spread from 0.9 to 1.2 times the link's rate (ACKs released in
/// bursts); a cap planned from a high one let the queue overflow for a
/// whole transfer (one 1 GiB pull in three lost 40,949 frames).
const RECENT_SAMPLES: usize = 5;

impl FullRate {
    /// Takes a sample; once the rate stopped growing, returns the rate it
    /// stopped at (the peak) and the median of the recent samples.
    fn sample(&mut self, rate: u64, min_rtt: Duration, now: Instant) -> Option<(u64, u64)> {
        self.recent.push(rate);
        self.round_max = self.round_max.max(rate);
        let started = *self.round_started.get_or_insert(now);
        if now.duration_since(started) >= min_rtt && self.round_max > 0 {
            if self.round_max >= self.full + self.full / 4 {
                self.full = self.round_max;
                self.flat_rounds = 0;
            } else {
                self.flat_rounds += 1;
            }
            self.round_max = 0;
            self.round_started = Some(now);
        }
        (self.flat_rounds >= 3).then(|| {
            let typical = self.recent.median().expect("a sample was just kept");
            (self.full, typical)
        })
    }
}

/// What `TCP_INFO` says of the path.
#[derive(Debug, Clone, Copy)]
struct Path {
    /// `tcpi_delivery_rate`, bytes a second (Linux 4.9).
    rate: u64,
    /// `tcpi_min_rtt` (Linux 4.10).
    min_rtt: Duration,
}

impl Path {
    fn bdp(self) -> u64 {
        (u128::from(self.rate) * self.min_rtt.as_micros() / 1_000_000) as u64
    }
}

/// The plan for a send buffer on a path: refill early where the buffer is
/// small against it at the rate the ramp stopped at (or nothing is measured
/// yet), as measured before this rule; else wait for readiness, keeping
/// queued at most twice the bandwidth-delay product at the `typical` rate,
/// because BBR's PROBE_BW keeps up to two in flight (`bbr_cwnd_gain`), and
/// at least what the link carries in [`CAP_FLOOR_TIME`]; no cap where that
/// would not bind before the buffer does.
fn plan(send_buffer: u64, path: Path, typical: u64) -> Plan {
    let bdp = path.bdp();
    if bdp == 0 || needs_early_refill(send_buffer, bdp) {
        return Plan::Early;
    }
    let typical = Path {
        rate: typical,
        ..path
    };
    let floor = (u128::from(typical.rate) * CAP_FLOOR_TIME.as_micros() / 1_000_000) as u64;
    let cap = (2 * typical.bdp()).max(floor);
    Plan::OnReadiness {
        cap: (cap < send_buffer).then_some(cap),
    }
}

/// Whether waking only at the kernel's one-third mark would starve a
/// connection: two thirds of the send buffer hold less than twice the
/// path's bandwidth-delay product (BBR's PROBE_BW keeps up to two in flight).
fn needs_early_refill(send_buffer: u64, bdp: u64) -> bool {
    send_buffer * 2 / 3 < 2 * bdp
}

/// The path's rate and round trip from `TCP_INFO`; `None` off TCP or on a
/// kernel older than 4.10.
fn path(socket: BorrowedFd<'_>) -> Option<Path> {
    let info = tcp_info(socket)?;
    Some(Path {
        rate: info.tcpi_delivery_rate,
        min_rtt: Duration::from_micros(u64::from(info.tcpi_min_rtt)),
    })
}

/// Whether the connection can still carry data: established, or closed by
/// the peer only for its own direction. Not after the kernel gave up on it
/// (`TCP_USER_TIMEOUT`, keepalive, a reset).
fn connected(socket: BorrowedFd<'_>) -> bool {
    const TCP_ESTABLISHED: u8 = 1;
    const TCP_CLOSE_WAIT: u8 = 8;
    tcp_info(socket)
        .is_some_and(|info| info.tcpi_state == TCP_ESTABLISHED || info.tcpi_state == TCP_CLOSE_WAIT)
}

/// `TCP_INFO`, if the kernel fills it up to `tcpi_delivery_rate`.
fn tcp_info(socket: BorrowedFd<'_>) -> Option<libc::tcp_info> {
    let mut info = std::mem::MaybeUninit::<libc::tcp_info>::zeroed();
    let mut length = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` is a zeroed tcp_info of `length` bytes that the kernel
    // fills up to `length`; the descriptor is borrowed for the call.
    let status = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut length,
        )
    };
    let filled =
        std::mem::offset_of!(libc::tcp_info, tcpi_delivery_rate) + std::mem::size_of::<u64>();
    if status != 0 || (length as usize) < filled {
        return None;
    }
    // SAFETY: zero-initialised, and the kernel wrote at least the fields read.
    Some(unsafe { info.assume_init() })
}

/// Bytes queued in the socket and not yet acknowledged (`SIOCOUTQ`).
fn queued(socket: BorrowedFd<'_>) -> Option<u64> {
    let mut bytes: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one int through the pointer; the descriptor is
    // borrowed for the call.
    let status = unsafe { libc::ioctl(socket.as_raw_fd(), libc::TIOCOUTQ, &mut bytes) };
    (status == 0).then_some(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEBIAN_SEND_BUFFER: u64 = 4 << 20;
    const GIGABIT: u64 = 125_000_000;

    fn path(rate: u64, min_rtt_ms: u64) -> Path {
        Path {
            rate,
            min_rtt: Duration::from_millis(min_rtt_ms),
        }
    }

    /// Debian's 4 MiB send buffer at 1 Gbit/s: a 10 ms path holds 1.25 MB,
    /// and two thirds of the buffer cover twice that; a 50 ms path holds
    /// 6.25 MB, and they do not.
    #[test]
    fn early_refill_only_where_the_buffer_is_small_against_the_path() {
        assert!(!needs_early_refill(
            DEBIAN_SEND_BUFFER,
            path(GIGABIT, 10).bdp()
        ));
        assert!(needs_early_refill(
            DEBIAN_SEND_BUFFER,
            path(GIGABIT, 50).bdp()
        ));
    }

    #[test]
    fn the_queue_is_capped_only_where_the_buffer_outgrows_the_path() {
        let capped = |cap| Plan::OnReadiness { cap: Some(cap) };
        assert_eq!(
            plan(DEBIAN_SEND_BUFFER, path(GIGABIT, 10), GIGABIT),
            capped(2_500_000)
        );
        assert_eq!(
            plan(DEBIAN_SEND_BUFFER, path(GIGABIT, 50), GIGABIT),
            Plan::Early
        );
        // The cap follows the typical rate; the choice, the peak.
        assert_eq!(
            plan(DEBIAN_SEND_BUFFER, path(GIGABIT, 10), GIGABIT * 9 / 10),
            capped(2_250_000)
        );
        assert_eq!(
            plan(DEBIAN_SEND_BUFFER, path(0, 10), 0),
            Plan::Early,
            "nothing measured"
        );
        // Loopback: 3 GB/s over 30 us. The floor (what 4 ms carry) is past
        // the buffer, so the timer never paces a fast local link.
        let loopback = Path {
            rate: 3_000_000_000,
            min_rtt: Duration::from_micros(30),
        };
        assert_eq!(
            plan(DEBIAN_SEND_BUFFER, loopback, loopback.rate),
            Plan::OnReadiness { cap: None }
        );
    }

    /// A rate doubling every round trip is never taken as the link's; one
    /// that holds within a quarter for three round trips is.
    #[test]
    fn the_rate_counts_once_it_stopped_growing() {
        let rtt = Duration::from_millis(100);
        let start = Instant::now();
        let mut full = FullRate::default();
        let mut rate = 1_000_000;
        for round in 1..=8 {
            assert_eq!(
                full.sample(rate, rtt, start + rtt * round),
                None,
                "round {round}"
            );
            rate *= 2;
        }
        let link = rate;
        let mut known = None;
        for round in 9..=12 {
            // Samples vary within a round; the round's highest counts.
            full.sample(link * 9 / 10, rtt, start + rtt * round - rtt / 2);
            known = full.sample(link, rtt, start + rtt * round);
        }
        assert_eq!(known, Some((link, link)));
        // One high sample among steady ones does not raise the typical rate.
        assert_eq!(
            full.sample(link * 6 / 5, rtt, start + rtt * 12 + rtt / 4),
            Some((link, link))
        );
        // A quarter more (a competing flow left) is a ramp again.
        assert_eq!(full.sample(link * 2, rtt, start + rtt * 13), None);
    }

    #[test]
    fn a_tcp_socket_reports_its_path_queue_and_state() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        (&client).write_all(&[7; 100_000]).unwrap();
        let mut received = vec![0; 100_000];
        server.read_exact(&mut received).unwrap();
        // The rate sample exists once data was acknowledged, and then
        // nothing is left queued.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let measured = super::path(client.as_fd()).unwrap();
            if measured.rate > 0 && queued(client.as_fd()) == Some(0) {
                assert!(measured.min_rtt < Duration::from_millis(100));
                assert!(connected(client.as_fd()));
                // One sample says nothing of whether the rate still grows.
                assert!(MeasuredPlan::default().readiness_starves(client.as_fd()));
                break;
            }
            assert!(Instant::now() < deadline, "no TCP_INFO rate sample");
            std::thread::sleep(Duration::from_millis(10));
        }
        // A peer's reset ends the connection: a writer waiting for the queue
        // to drain must then stop waiting and write, to see the error.
        rustix::net::sockopt::set_socket_linger(&server, Some(Duration::ZERO)).unwrap();
        drop(server);
        while connected(client.as_fd()) {
            assert!(Instant::now() < deadline, "the reset was not seen");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
