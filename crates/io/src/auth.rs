//! Authentication, both roles: a host answers a device's AUTH tokens with an
//! [`AuthResponder`]; a device lets hosts in through an [`Authenticator`].
//! The driver hands the engine's AUTH events to a connection's
//! `Authentication`, which answers through the engine alone.

use std::sync::Arc;

use bytes::Bytes;
use oxadb_engine::AuthReply;

/// Who authenticates on a connection, given to [`Connection::start`](crate::Connection::start).
pub enum Auth {
    /// Nobody: a device without [`Config::require_auth`](oxadb_engine::Config),
    /// or a host with nothing to answer AUTH tokens with.
    None,
    /// Host role: answers the device's AUTH tokens.
    Host(AuthResponder),
    /// Device role with [`Config::require_auth`](oxadb_engine::Config): lets
    /// hosts in.
    Device(Arc<dyn Authenticator>),
}

/// Answers a device's AUTH token (host role): `Some(reply)` to send, `None` to
/// stay silent (waiting for the user to accept the key on the device).
pub type AuthResponder = Box<dyn FnMut(&[u8], u32) -> Option<AuthReply> + Send>;

/// Device role: decides who may connect (`oxadbd --auth`). Called with the
/// connection's engine locked, so each call must be quick (an RSA-2048
/// verification is about 50 us).
pub trait Authenticator: Send + Sync {
    /// A fresh, unpredictable token (20 bytes, as adbd sends).
    fn token(&self) -> Bytes;
    /// Whether `signature` signs `token` with a trusted key.
    fn verify(&self, peer: &str, token: &[u8], signature: &[u8]) -> bool;
    /// The host offers `key` (adb's base64 public key text, NUL-terminated)
    /// after its signatures failed: whether to trust it without proof.
    fn offer_key(&self, peer: &str, key: &[u8]) -> bool;
    /// How long to wait before the next token after `failures` refused
    /// signatures on this connection (rate-limits guessing).
    fn retry_delay(&self, failures: u32) -> std::time::Duration;
}

/// One connection's authentication: who authenticates and how it has gone
/// so far. The driver hands it the engine's AUTH events.
pub(crate) struct Authentication {
    auth: Auth,
    /// Signatures refused on this connection.
    failures: u32,
    /// Host role: the device challenged us and we have no more answers: it
    /// is "unauthorized" until its user accepts our public key.
    awaiting_user: bool,
    /// Host role: our public key is queued but not yet written. Only once it
    /// is out may a caller that does not wait for the user give up: closing
    /// earlier drops it, and the device never shows its prompt.
    key_offer_unsent: bool,
}

impl Authentication {
    pub(crate) fn new(auth: Auth) -> Authentication {
        Authentication {
            auth,
            failures: 0,
            awaiting_user: false,
            key_offer_unsent: false,
        }
    }

    /// Whether the device refused our keys and waits for its user.
    pub(crate) fn awaiting_user(&self) -> bool {
        self.awaiting_user && !self.key_offer_unsent
    }

    /// Host role: the writer has written our public key offer.
    pub(crate) fn key_offer_written(&mut self) {
        self.key_offer_unsent = false;
    }

    /// The CNXN exchange completed: nobody waits for a user any more.
    pub(crate) fn connected(&mut self) {
        self.awaiting_user = false;
    }

    /// Host role: the device sent its `attempt`th token.
    pub(crate) fn answer_challenge(
        &mut self,
        engine: &mut oxadb_engine::Connection,
        token: &[u8],
        attempt: u32,
    ) {
        let reply = match &mut self.auth {
            Auth::Host(respond) => respond(token, attempt),
            _ => None,
        };
        // Once our public key is offered (or nothing is left to
        // offer) only the device's user can let us in.
        self.awaiting_user = !matches!(reply, Some(AuthReply::Signature(_)));
        self.key_offer_unsent = matches!(reply, Some(AuthReply::PublicKey(_)));
        if let Some(reply) = reply {
            engine.send_auth(reply);
        }
    }

    /// Device role: the host `peer` signed `token`. A refused signature's
    /// next token waits for the authenticator's delay, a timer the engine
    /// keeps (`Connection::refuse_signature`).
    pub(crate) fn check_signature(
        &mut self,
        engine: &mut oxadb_engine::Connection,
        peer: &str,
        token: &[u8],
        signature: &[u8],
    ) {
        let trusted = self
            .authenticator()
            .is_some_and(|auth| auth.verify(peer, token, signature));
        if trusted {
            engine.authorize();
        } else {
            self.failures += 1;
            let delay = self
                .authenticator()
                .map_or(std::time::Duration::ZERO, |auth| {
                    auth.retry_delay(self.failures)
                });
            engine.refuse_signature(delay);
        }
    }

    /// Device role: the host `peer` offers its public key.
    pub(crate) fn consider_key(
        &mut self,
        engine: &mut oxadb_engine::Connection,
        peer: &str,
        key: &[u8],
    ) {
        if self
            .authenticator()
            .is_some_and(|auth| auth.offer_key(peer, key))
        {
            engine.authorize();
        }
    }

    /// Device role: challenges the host with a fresh token.
    pub(crate) fn send_token(&self, engine: &mut oxadb_engine::Connection) {
        if let Some(auth) = self.authenticator() {
            let token: Bytes = auth.token();
            engine.send_auth_token(token);
        }
    }

    fn authenticator(&self) -> Option<&Arc<dyn Authenticator>> {
        match &self.auth {
            Auth::Device(authenticator) => Some(authenticator),
            _ => None,
        }
    }
}
