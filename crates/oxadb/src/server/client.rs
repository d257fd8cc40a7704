//! One client connection to the server: requests read one at a time
//! (`oxadb_wire::smart_socket`), host requests answered as
//! [`host::dispatch`] decides, and, after a `host:transport*`, a device
//! service opened on the chosen device and relayed both ways.

use std::sync::Arc;

use oxadb_wire::service::{DeviceListFormat, DeviceSelector, HostService, WaitState};
use oxadb_wire::smart_socket::{
    self, binary_message, fail, message, okay_message, RequestError, OKAY,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::host::{self, Action, MdnsQuery, WaitOutcome};
use super::registry::TransportId;
use super::Shared;
use super::{mdns, pair};

/// Serves `socket` until its requests are done (or it relays a device
/// stream until either side ends).
pub async fn serve(shared: Arc<Shared>, mut socket: TcpStream) {
    if let Err(error) = serve_requests(&shared, &mut socket).await {
        tracing::debug!(%error, "client connection ended");
    }
}

async fn serve_requests(shared: &Arc<Shared>, socket: &mut TcpStream) -> std::io::Result<()> {
    let mut bound: Option<TransportId> = None;
    loop {
        let text = match read_request(socket).await? {
            Ok(Some(text)) => text,
            Ok(None) => return Ok(()),
            Err(error) => return socket.write_all(&fail(&error.to_string())).await,
        };
        tracing::debug!(request = %text, ?bound, "request");
        if !host::is_host_service(&text) {
            return open_device_service(shared, socket, bound, &text).await;
        }
        let service = match HostService::parse(&text) {
            Ok(service) => service,
            Err(error) => return socket.write_all(&host::malformed(&error)).await,
        };
        let action = host::dispatch(&service, bound, &shared.registry.list());
        match action {
            Action::Reply(reply) => return socket.write_all(&reply).await,
            Action::Switch { transport, reply } => {
                socket.write_all(&reply).await?;
                bound = Some(transport);
            }
            Action::Connect(address) => {
                socket.write_all(OKAY).await?;
                // A service name seen over mDNS first, as adb's
                // socket_spec_connect does.
                let answer = match shared.mdns.find(&address, None) {
                    Some(found) if found.v4.is_some() => {
                        let dial = found.v4_address().unwrap_or_default();
                        shared.registry.connect_at(found.name(), dial).await
                    }
                    _ => shared.registry.connect(&address).await,
                };
                return socket.write_all(&message(&answer)).await;
            }
            Action::Pair { code, address } => {
                socket.write_all(OKAY).await?;
                let reply = match pair::pair(&shared.mdns, &shared.registry, &code, &address).await
                {
                    Ok(answer) => message(&answer),
                    Err(error) => fail(&error),
                };
                return socket.write_all(&reply).await;
            }
            Action::Mdns(MdnsQuery::Check) => {
                return socket.write_all(&okay_message(&shared.mdns.check())).await
            }
            Action::Mdns(MdnsQuery::Services) => {
                let text = mdns::services_text(&shared.mdns.services());
                return socket.write_all(&okay_message(&text)).await;
            }
            Action::Mdns(MdnsQuery::Track) => return track_mdns(shared, socket).await,
            Action::Disconnect(address) => {
                let reply = match shared.registry.disconnect(&address) {
                    Ok(answer) => okay_message(&answer),
                    Err(error) => fail(&error),
                };
                return socket.write_all(&reply).await;
            }
            Action::Reconnect(id) => {
                let answer = shared.registry.reconnect(id);
                return socket.write_all(&okay_message(&answer)).await;
            }
            Action::ReconnectOffline => {
                let answer = shared.registry.reconnect_offline();
                return socket.write_all(&okay_message(&answer)).await;
            }
            Action::ServerStatus => {
                // A few hundred bytes: it always fits a message.
                let reply = binary_message(&shared.status).unwrap_or_default();
                socket.write_all(OKAY).await?;
                return socket.write_all(&reply).await;
            }
            Action::Track(format) => return track(shared, socket, format).await,
            Action::WaitFor { selector, state } => {
                return wait_for(shared, socket, selector, state).await
            }
            Action::Forward { request, transport } => {
                let reply = shared.forwards.answer(&request, transport.as_ref()).await;
                return socket.write_all(&reply).await;
            }
            Action::Kill => {
                socket.write_all(OKAY).await?;
                socket.flush().await?;
                tracing::info!("stopping: a client asked (host:kill)");
                shared.stop.notify_one();
                return Ok(());
            }
        }
    }
}

/// The next request: `Ok(Ok(None))` when the client closed before one.
/// Read exactly, so what follows a request stays in the socket for the
/// service it opens.
async fn read_request<S>(socket: &mut S) -> std::io::Result<Result<Option<String>, RequestError>>
where
    S: AsyncRead + Unpin,
{
    let mut prefix = [0u8; 4];
    let mut got = 0;
    while got < prefix.len() {
        match socket.read(&mut prefix[got..]).await? {
            0 if got == 0 => return Ok(Ok(None)),
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => got += n,
        }
    }
    let length = match smart_socket::request_length(prefix) {
        Ok(length) => length,
        Err(error) => return Ok(Err(error)),
    };
    let mut body = vec![0u8; length];
    socket.read_exact(&mut body).await?;
    Ok(smart_socket::request_text(body).map(Some))
}

/// A device service on the transport the connection switched to: `OKAY`
/// once the device accepted the stream (AOSP `sockets.cpp`: the answer
/// waits for the device's), `FAIL closed` when it refused.
async fn open_device_service(
    shared: &Arc<Shared>,
    socket: &mut TcpStream,
    bound: Option<TransportId>,
    service: &str,
) -> std::io::Result<()> {
    let Some(id) = bound else {
        return socket.write_all(&fail(host::NO_TRANSPORT)).await;
    };
    let Some(device) = shared.registry.device(id) else {
        return socket.write_all(&fail(host::TRANSPORT_OFFLINE)).await;
    };
    match device.open_text(service).await {
        Ok(stream) => {
            socket.write_all(OKAY).await?;
            super::relay_tcp(socket, stream).await;
            Ok(())
        }
        // adb's word for a refusal; a device that never answered is told
        // as such (adb's server would wait for ever).
        Err(error @ crate::Error::OpenTimeout { .. }) => {
            tracing::warn!(%error, "device did not answer an OPEN");
            socket.write_all(&fail(&error.to_string())).await
        }
        Err(error) => {
            tracing::debug!(%error, service, "device refused a service");
            socket.write_all(&fail(host::STREAM_CLOSED)).await
        }
    }
}

/// `track-devices[-l|-proto-binary|-proto-text]`: `OKAY`, the list, and
/// the list again whenever it changes, until the client closes (or sends anything: AOSP
/// `transport.cpp` device_tracker_enqueue closes then).
async fn track<S>(
    shared: &Arc<Shared>,
    socket: &mut S,
    format: DeviceListFormat,
) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let mut changes = shared.registry.changes();
    socket.write_all(OKAY).await?;
    let mut sent: Option<Vec<u8>> = None;
    let mut scratch = [0u8; 64];
    loop {
        let _ = changes.borrow_and_update();
        let list = host::tracked_list(&shared.registry.list(), format);
        if sent.as_ref() != Some(&list) {
            match binary_message(&list) {
                Some(framed) => socket.write_all(&framed).await?,
                None => tracing::warn!(bytes = list.len(), "device list too long to send"),
            }
            sent = Some(list);
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return Ok(()) },
            _ = socket.read(&mut scratch) => return Ok(()),
        }
    }
}

/// `track-mdns-services`: `OKAY`, then the services seen as an
/// `MdnsServices` protobuf in a length-prefixed message, now and at every
/// change, until the client closes or sends anything (AOSP
/// `client/mdns_tracker.cpp`).
async fn track_mdns<S>(shared: &Arc<Shared>, socket: &mut S) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let mut changes = shared.mdns.changes();
    let known = oxadb_auth::KnownHosts::load_default().ok();
    let is_known = |instance: &str| known.as_ref().is_some_and(|k| k.is_known(instance));
    socket.write_all(OKAY).await?;
    let mut scratch = [0u8; 64];
    loop {
        let _ = changes.borrow_and_update();
        let proto = mdns::services_proto(&shared.mdns.services(), &is_known);
        match binary_message(&proto) {
            Some(framed) => socket.write_all(&framed).await?,
            None => tracing::warn!(bytes = proto.len(), "mDNS services too many to send"),
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return Ok(()) },
            _ = socket.read(&mut scratch) => return Ok(()),
        }
    }
}

/// `wait-for-*`: `OKAY` now, a second `OKAY` once reached (or `FAIL` when
/// several devices make it undecidable); ends early if the client leaves.
async fn wait_for<S>(
    shared: &Arc<Shared>,
    socket: &mut S,
    selector: DeviceSelector,
    state: WaitState,
) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let mut changes = shared.registry.changes();
    socket.write_all(OKAY).await?;
    let mut scratch = [0u8; 64];
    loop {
        let _ = changes.borrow_and_update();
        match host::wait_outcome(&shared.registry.list(), &selector, state) {
            WaitOutcome::Done => return socket.write_all(OKAY).await,
            WaitOutcome::Fail(error) => return socket.write_all(&fail(&error)).await,
            WaitOutcome::Wait => {}
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return Ok(()) },
            _ = socket.read(&mut scratch) => return Ok(()),
        }
    }
}
