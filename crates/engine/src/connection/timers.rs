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

use std::time::Duration;

use super::{Connection, Event, Handshake, StreamId};

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
            let limit = limit.as_nanos() as u64;
            self.streams
                .values()
                .filter_map(|stream| stream.credit_blocked_since)
                .min()
                .map(|since| since.saturating_add(limit))
        });
        token
            .into_iter()
            .chain(stalled)
            .min()
            .map(Duration::from_nanos)
    }

    /// Sets the time to `now` (as [`Connection::set_time`]) and fires every
    /// timer due by then; what that queues is taken as usual, with
    /// [`Connection::poll_event`] and [`Connection::poll_outgoing`].
    pub fn handle_timeout(&mut self, now: Duration) {
        self.set_time(now);
        let now = self.now_ns;
        if let Handshake::AwaitingAuth { next_token_at, .. } = &mut self.handshake {
            if next_token_at.is_some_and(|at| at <= now) {
                *next_token_at = None;
                self.events.push_back(Event::TokenNeeded);
            }
        }
        if let Some(limit) = self.config.stalled_stream_timeout {
            self.abort_stalled_streams(limit.as_nanos() as u64);
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
