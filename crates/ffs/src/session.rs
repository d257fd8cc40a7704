//! One ADB connection per enabled configuration: started on ENABLE, ended
//! on DISABLE/UNBIND, started afresh if it ends on its own while the host
//! still has us configured.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use oxadb_engine::Config;
use oxadb_io::{Auth, Authenticator, Connection, ConnectionError};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::bulk::bulk_pair;
use crate::endpoint::Endpoint;
use crate::event::Event;
use crate::FfsError;

/// A connection that ended on its own (a protocol error, a handshake
/// timeout) is replaced after this pause, so a confused host cannot make
/// the daemon spin.
const RESTART_DELAY: Duration = Duration::from_millis(100);
/// How long an ended connection may take to let go of its endpoints.
const END_TIMEOUT: Duration = Duration::from_secs(5);

/// A USB function the host configures and deconfigures: FunctionFS
/// ([`crate::FunctionFs`]), or a fake in tests.
pub trait Gadget: Send {
    type Endpoint: Endpoint;

    /// The next lifecycle event (control requests already answered).
    /// Must be cancel-safe: it is raced against the connection's end.
    fn next_event(&mut self) -> impl Future<Output = Result<Event, FfsError>> + Send;

    /// Opens the bulk-out and bulk-in endpoints for a new connection.
    fn open_endpoints(&self) -> Result<(Self::Endpoint, Self::Endpoint), FfsError>;
}

struct Session {
    connection: Connection,
    run: JoinHandle<ConnectionError>,
}

/// Serves ADB over `gadget` until its control endpoint fails: each time
/// the host enables the function, a device-role connection with `engine`'s
/// configuration (and `authenticator` when it requires auth: a USB host
/// must authenticate like any other) is started and handed to
/// `on_connection`, which serves its streams.
pub async fn serve<G: Gadget>(
    mut gadget: G,
    engine: Config,
    authenticator: Option<Arc<dyn Authenticator>>,
    mut on_connection: impl FnMut(Connection) + Send,
) -> Result<(), FfsError> {
    let mut session: Option<Session> = None;
    let mut enabled = false;
    let mut restart_at: Option<Instant> = None;
    let mut started = 0u64;
    let mut start = |gadget: &G| -> Option<Session> {
        let (bulk_out, bulk_in) = match gadget.open_endpoints() {
            Ok(endpoints) => endpoints,
            Err(error) => {
                tracing::warn!(%error, "cannot start a USB connection");
                return None;
            }
        };
        started += 1;
        let (reader, sink) = bulk_pair(bulk_out, bulk_in);
        let auth = authenticator.clone().map_or(Auth::None, Auth::Device);
        let (connection, run) = Connection::start(reader, sink, engine.clone(), "usb", auth);
        tracing::info!(connection = started, "USB connection started");
        let span = tracing::info_span!("usb", connection = started);
        let run = tokio::spawn(run.instrument(span));
        on_connection(connection.clone());
        Some(Session { connection, run })
    };
    loop {
        tokio::select! {
            event = gadget.next_event() => match event? {
                Event::Enable => {
                    // Enabled again without a DISABLE (a bus reset): the
                    // old endpoints' transfers were cancelled.
                    end(session.take(), "re-enabled").await;
                    enabled = true;
                    restart_at = None;
                    session = start(&gadget);
                    if session.is_none() {
                        restart_at = Some(Instant::now() + RESTART_DELAY * 10);
                    }
                }
                event @ (Event::Disable | Event::Unbind) => {
                    enabled = false;
                    restart_at = None;
                    let why = if event == Event::Disable { "disabled" } else { "unbound" };
                    tracing::info!("USB function {why}");
                    end(session.take(), why).await;
                }
                Event::Bind => tracing::info!("USB function bound to a UDC"),
                Event::Setup(setup) => tracing::debug!(?setup, "control request stalled"),
                event => tracing::debug!(?event, "USB event"),
            },
            error = ended(&mut session) => {
                session = None;
                if error.is_clean() {
                    tracing::info!("USB connection closed: {error}");
                } else {
                    tracing::warn!("USB connection failed: {error}");
                }
                if enabled {
                    restart_at = Some(Instant::now() + RESTART_DELAY);
                }
            }
            () = sleep_until(restart_at) => {
                restart_at = None;
                if enabled && session.is_none() {
                    session = start(&gadget);
                    if session.is_none() {
                        restart_at = Some(Instant::now() + RESTART_DELAY * 10);
                    }
                }
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Completes when the session's connection has ended; never without one.
async fn ended(session: &mut Option<Session>) -> ConnectionError {
    match session {
        Some(session) => (&mut session.run).await.unwrap_or(ConnectionError::Closed),
        None => std::future::pending().await,
    }
}

/// Closes a connection and waits until its endpoints are released, so the
/// next connection starts on fresh transfers.
async fn end(session: Option<Session>, why: &str) {
    let Some(Session {
        connection,
        mut run,
    }) = session
    else {
        return;
    };
    connection.close();
    match tokio::time::timeout(END_TIMEOUT, &mut run).await {
        Ok(Ok(error)) => tracing::info!("USB connection ended ({why}): {error}"),
        Ok(Err(error)) => tracing::warn!(%error, "USB connection task failed"),
        Err(_) => {
            tracing::error!(
                timeout_s = END_TIMEOUT.as_secs(),
                "USB connection did not end in time; abandoning it"
            );
            run.abort();
        }
    }
}
