//! The connection's timers: every protocol rule that acts when time passes
//! rather than when a packet arrives. The driver asks
//! [`Connection::poll_timeout`] when to wake, sleeps until then and calls
//! [`Connection::handle_timeout`] (the shape of quinn-proto's timers); the
//! engine itself never sleeps or reads a clock.
//!
//! - A stream whose data has waited for the peer's credit for
//!   [`Config::stalled_stream_timeout`](super::Config) is closed: its unsent
//!   data is dropped, CLSE goes out and the local side sees
//!   [`Event::Closed`] (a host that stopped reading, or vanished behind a
//!   live TCP connection).
//! - Device role: the token owed after a refused signature
//!   ([`Connection::refuse_signature`]) is asked for with
//!   [`Event::TokenNeeded`] once its delay has passed.
//! - A peer that has not finished the handshake by its deadline
//!   ([`Config::handshake_timeout`](super::Config) for CNXN and TLS,
//!   [`Config::auth_timeout`](super::Config) for authentication) gets no
//!   more: [`Event::HandshakeTimedOut`], and the driver closes the
//!   connection (docs/security.md, "Limits").

use std::time::Duration;

use super::{Connection, Event, Handshake, HandshakeStage, StreamId};

impl Connection {
    /// When [`Connection::handle_timeout`] must next be called, on the clock
    /// [`Connection::set_time`] reads; `None` while no timer is running. It
    /// changes as packets arrive and streams are used, so a driver asks
    /// again after each call into the engine (a deadline that moved later
    /// may simply be slept past: firing early does nothing).
    pub fn poll_timeout(&self) -> Option<Duration> {
        let token = match self.handshake {
            Handshake::AwaitingAuth { next_token_at, .. } => next_token_at,
            _ => None,
        };
        let stalled = self.config.stalled_stream_timeout.and_then(|limit| {
            let limit = nanos(limit);
            self.streams
                .values()
                .filter_map(|stream| stream.credit_blocked_since)
                .min()
                .map(|since| since.saturating_add(limit))
        });
        let handshake = self.handshake_deadline().map(|(at, _, _)| at);
        token
            .into_iter()
            .chain(stalled)
            .chain(handshake)
            .min()
            .map(Duration::from_nanos)
    }

    /// The handshake's pending deadline (ns), the stage it bounds and its
    /// setting. Before CNXN, and while STLS and TLS are under way, the peer
    /// has `handshake_timeout` from the start; a host that must
    /// authenticate has `auth_timeout` from the start as well when the
    /// handshake is bounded (TCP), or from its CNXN when it is not (USB).
    /// Once the peer has been online nothing is bounded any more.
    fn handshake_deadline(&self) -> Option<(u64, HandshakeStage, Duration)> {
        if self.handshake_completed {
            return None;
        }
        let from_start =
            |stage, limit: Option<Duration>| limit.map(|limit| (nanos(limit), stage, limit));
        match self.handshake {
            Handshake::AwaitingCnxn => {
                from_start(HandshakeStage::Cnxn, self.config.handshake_timeout)
            }
            Handshake::AwaitingStls { .. } | Handshake::StartingTls { .. } => {
                from_start(HandshakeStage::Tls, self.config.handshake_timeout)
            }
            Handshake::AwaitingAuth { since, .. } => {
                let limit = self.config.auth_timeout?;
                let from = if self.config.handshake_timeout.is_some() {
                    0
                } else {
                    since
                };
                Some((
                    from.saturating_add(nanos(limit)),
                    HandshakeStage::Auth,
                    limit,
                ))
            }
            Handshake::Online(_) | Handshake::TimedOut(_) => None,
        }
    }

    /// Sets the time to `now` (as [`Connection::set_time`]) and fires every
    /// timer due by then; what that queues is taken as usual, with
    /// [`Connection::poll_event`] and [`Connection::poll_outgoing`].
    pub fn handle_timeout(&mut self, now: Duration) {
        self.set_time(now);
        let now = self.now_ns;
        if let Some((at, stage, limit)) = self.handshake_deadline() {
            if at <= now {
                // Nothing the engine queued (a STLS, an AUTH token) may
                // leave once the connection is given up.
                self.handshake = Handshake::TimedOut(stage);
                self.control.clear();
                self.events
                    .push_back(Event::HandshakeTimedOut { stage, limit });
                return;
            }
        }
        if let Handshake::AwaitingAuth { next_token_at, .. } = &mut self.handshake {
            if next_token_at.is_some_and(|at| at <= now) {
                *next_token_at = None;
                self.events.push_back(Event::TokenNeeded);
            }
        }
        if let Some(limit) = self.config.stalled_stream_timeout {
            self.abort_stalled_streams(nanos(limit));
        }
    }

    /// Closes every stream whose data has waited for the peer's credit for
    /// at least `limit` nanoseconds, in id order.
    fn abort_stalled_streams(&mut self, limit: u64) {
        let now = self.now_ns;
        let mut stalled: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, stream)| {
                stream
                    .credit_blocked_since
                    .is_some_and(|since| now.saturating_sub(since) >= limit)
            })
            .map(|(&id, _)| id)
            .collect();
        stalled.sort_unstable();
        for id in stalled {
            if let Some(stream) = self.streams.get_mut(&id) {
                tracing::warn!(
                    stream = id,
                    queued = stream.outgoing.len(),
                    stalled_s = now.saturating_sub(stream.credit_blocked_since.unwrap_or(now))
                        / 1_000_000_000,
                    "closing stream: the peer has granted no credit for too long"
                );
                stream.outgoing.clear();
            }
            self.events.push_back(Event::Closed(StreamId(id)));
            self.finish_close(id);
        }
    }
}

/// A duration on the engine's clock (ns in a u64: 584 years).
fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}
