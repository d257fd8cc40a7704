//! The device a command talks to: connected directly, or through the adb
//! host server that answers on the server port (docs/server.md, "oxadb
//! through a server"). Commands that only open services on the device run
//! the same over either.

use oxadb::host_client::ServerDevice;
use oxadb::shell::{shell_service, ShellOptions, ShellSession};
use oxadb::sync::SyncOpener;
use oxadb::{BoxedStream, Device, DeviceService};
use oxadb_wire::feature;

pub enum Endpoint {
    /// Boxed: a connection's state is large beside a server's address.
    Direct(Box<Device>),
    Server(ServerDevice),
}

impl Endpoint {
    pub fn serial(&self) -> &str {
        match self {
            Endpoint::Direct(device) => device.serial(),
            Endpoint::Server(device) => device.serial(),
        }
    }

    pub fn features(&self) -> &[String] {
        match self {
            Endpoint::Direct(device) => device.features(),
            Endpoint::Server(device) => device.features(),
        }
    }

    pub async fn open(&self, service: &DeviceService) -> oxadb::Result<BoxedStream> {
        Ok(match self {
            Endpoint::Direct(device) => Box::new(device.open(service).await?),
            Endpoint::Server(device) => Box::new(device.open(service).await?),
        })
    }

    pub async fn open_text(&self, service: &str) -> oxadb::Result<BoxedStream> {
        Ok(match self {
            Endpoint::Direct(device) => Box::new(device.open_text(service).await?),
            Endpoint::Server(device) => Box::new(device.open_text(service).await?),
        })
    }

    /// A shell session, `shell,v2` when the device has the feature (as
    /// adb's CLI asks a server for it).
    pub async fn shell_session(
        &self,
        command: &str,
        options: &ShellOptions,
    ) -> oxadb::Result<ShellSession> {
        match self {
            Endpoint::Direct(device) => device.shell_session(command, options).await,
            Endpoint::Server(device) => {
                let v2 = !options.no_v2 && device.has_feature(feature::SHELL_V2);
                let service = shell_service(command, options, v2);
                let stream = device.open(&service).await?;
                Ok(ShellSession::over_stream(
                    Box::new(stream),
                    v2,
                    device.serial(),
                    command,
                ))
            }
        }
    }

    /// Why the direct connection ended, if it did; a server's device has
    /// no connection here to lose.
    pub fn lost(&self) -> Option<oxadb::Error> {
        match self {
            Endpoint::Direct(device) => device.lost(),
            Endpoint::Server(_) => None,
        }
    }

    pub fn sync(&self) -> &dyn SyncOpener {
        match self {
            Endpoint::Direct(device) => &**device,
            Endpoint::Server(device) => device,
        }
    }

    /// Whether burst mode is in use: only a direct connection knows.
    pub fn burst_mode(&self) -> Option<bool> {
        match self {
            Endpoint::Direct(device) => Some(device.burst_mode()),
            Endpoint::Server(_) => None,
        }
    }

    pub fn close(&self) {
        if let Endpoint::Direct(device) = self {
            device.close();
        }
    }
}
