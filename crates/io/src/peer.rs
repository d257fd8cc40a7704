//! Dead-peer detection on TCP connections, the same on both ends.
//!
//! A peer that vanishes without a FIN or RST (power cut, pulled cable, a
//! host suspended mid-transfer) is otherwise noticed only after Linux gives
//! up retransmitting (about 15 minutes, `tcp_retries2`) when data waits for
//! it, and never when nothing does. One setting, the peer timeout `T`,
//! bounds both cases (tcp(7)):
//!
//! - data waits for acknowledgement: `TCP_USER_TIMEOUT` = `T` ends the
//!   connection once data has gone unacknowledged for `T`;
//! - nothing waits: keepalive probes start after `T/2` of silence and repeat
//!   every `T/10` (at least 1 s each); the connection ends at the first probe
//!   time at or after `T` (the user timeout overrides `TCP_KEEPCNT` then, and
//!   the count is set to the same point for kernels that do not).
//!
//! Either way the socket fails with `ETIMEDOUT`, which the driver reports as
//! [`crate::ConnectionError::PeerTimedOut`].

use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

/// Survives a Wi-Fi roam or a short outage (a few seconds of silence) with
/// room to spare, and notices a dead host or board in half a minute.
pub const DEFAULT_PEER_TIMEOUT: PeerTimeout = PeerTimeout { secs: 30 };

/// How long a TCP peer may stay silent before its connection is declared
/// dead, in whole seconds (keepalive's resolution).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerTimeout {
    secs: u32,
}

impl PeerTimeout {
    /// `None` for 0 (no detection: the kernel's defaults); otherwise at
    /// least 2 s, so that one probe fits before the deadline.
    pub fn from_secs(secs: u64) -> Option<PeerTimeout> {
        (secs > 0).then(|| PeerTimeout {
            secs: secs.clamp(2, u64::from(u32::MAX / 1000)) as u32,
        })
    }

    /// `T`: the user timeout, and the silence after which keepalive gives up.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.secs.into())
    }

    /// Silence before the first keepalive probe: `T/2`.
    pub fn keepidle(&self) -> Duration {
        Duration::from_secs((self.secs / 2).max(1).into())
    }

    /// Between keepalive probes: `T/10`, at least 1 s.
    pub fn keepintvl(&self) -> Duration {
        Duration::from_secs((self.secs / 10).max(1).into())
    }

    /// Unanswered probes that end the connection: as many as reach `T`.
    pub fn keepcnt(&self) -> u32 {
        let idle = self.keepidle().as_secs() as u32;
        let interval = self.keepintvl().as_secs() as u32;
        (self.secs - idle).div_ceil(interval).max(1)
    }

    /// The latest an idle connection to a silent peer ends, counted from
    /// the last packet heard: `T` rounded up to the next probe (less than
    /// `T + T/10`; exactly `T` below 20 s, where probes are 1 s apart).
    pub fn idle_bound(&self) -> Duration {
        self.keepidle() + self.keepintvl() * self.keepcnt()
    }
}

impl std::fmt::Display for PeerTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} s", self.secs)
    }
}

/// Sets up `socket` (a connected TCP socket) to detect a dead peer within
/// `timeout`; `None` leaves the kernel's defaults (no keepalive).
pub fn watch_peer(socket: impl AsFd, timeout: Option<PeerTimeout>) -> io::Result<()> {
    use rustix::net::sockopt;
    let Some(timeout) = timeout else {
        return Ok(());
    };
    let socket = socket.as_fd();
    sockopt::set_socket_keepalive(socket, true)?;
    sockopt::set_tcp_keepidle(socket, timeout.keepidle())?;
    sockopt::set_tcp_keepintvl(socket, timeout.keepintvl())?;
    sockopt::set_tcp_keepcnt(socket, timeout.keepcnt())?;
    sockopt::set_tcp_user_timeout(socket, timeout.secs * 1000)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_reach_the_timeout_and_no_further_than_one_interval() {
        for secs in 2..=600u64 {
            let t = PeerTimeout::from_secs(secs).unwrap();
            let bound = t.idle_bound();
            assert!(bound >= t.timeout(), "{secs}: {bound:?}");
            assert!(bound < t.timeout() + t.keepintvl(), "{secs}: {bound:?}");
            assert!(t.keepidle() < t.timeout(), "{secs}");
            if secs < 20 {
                assert_eq!(bound, t.timeout(), "{secs}");
            }
        }
        let default = DEFAULT_PEER_TIMEOUT;
        assert_eq!(default.keepidle(), Duration::from_secs(15));
        assert_eq!(default.keepintvl(), Duration::from_secs(3));
        assert_eq!(default.keepcnt(), 5);
        assert_eq!(default.idle_bound(), Duration::from_secs(30));
    }

    #[test]
    fn zero_turns_detection_off_and_one_is_raised_to_two() {
        assert_eq!(PeerTimeout::from_secs(0), None);
        assert_eq!(
            PeerTimeout::from_secs(1).unwrap().timeout(),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn the_options_reach_the_socket() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let socket = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        watch_peer(&socket, PeerTimeout::from_secs(5)).unwrap();
        use rustix::net::sockopt;
        assert!(sockopt::socket_keepalive(&socket).unwrap());
        assert_eq!(
            sockopt::tcp_keepidle(&socket).unwrap(),
            Duration::from_secs(2)
        );
        assert_eq!(
            sockopt::tcp_keepintvl(&socket).unwrap(),
            Duration::from_secs(1)
        );
        assert_eq!(sockopt::tcp_keepcnt(&socket).unwrap(), 3);
        assert_eq!(sockopt::tcp_user_timeout(&socket).unwrap(), 5000);
    }
}
