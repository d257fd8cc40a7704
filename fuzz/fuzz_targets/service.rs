//! Service names (crates/wire/src/service.rs): what an OPEN packet asks a
//! device for, and what a client asks an adb host server for.
//!
//! Input: the name's bytes, read as both kinds. A name that parses is
//! written out and parsed again: the same value comes back, and the text
//! written is canonical (it writes itself). Names whose free text is taken
//! whole come back byte for byte. A name that does not parse is named by
//! its error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oxadb_wire::service::{DeviceService, ForwardRequest, HostRequest, HostService};

fuzz_target!(|data: &[u8]| {
    let Ok(name) = std::str::from_utf8(data) else {
        return;
    };
    check_device(name);
    check_host(name);
});

fn check_device(name: &str) {
    let service = match DeviceService::parse(name) {
        Ok(service) => service,
        Err(error) => {
            assert_eq!(error.service, name);
            return;
        }
    };
    let written = service.to_string();
    assert_eq!(
        DeviceService::parse(&written).as_ref(),
        Ok(&service),
        "{name:?} written as {written:?}"
    );
    use DeviceService::*;
    match &service {
        Shell(shell) => {
            // The command is everything after the first colon.
            assert_eq!(
                Some(shell.command.as_str()),
                name.split_once(':').map(|(_, c)| c)
            );
        }
        Exec(_)
        | Sync
        | Delta
        | LocalAbstract(_)
        | LocalReserved(_)
        | LocalFilesystem(_)
        | Local(_)
        | Dev { .. }
        | TrackJdwp
        | TrackApp
        | Reverse(_)
        | Reboot(_)
        | Remount(_)
        | Abb(_)
        | AbbExec(_) => {
            // Remount's name may come without its colon.
            if name != "remount" {
                assert_eq!(written, name, "taken whole, written back differently");
            }
        }
        Tcp { host, .. } => {
            if let Some(host) = host {
                assert!(name.starts_with(&format!("tcp:{host}:")));
            }
        }
        Jdwp(_) | Framebuffer | Root | Unroot | EnableVerity | DisableVerity | Usb | TcpIp(_)
        | Sink(_) | Source(_) => {}
    }
}

fn check_host(name: &str) {
    let service = match HostService::parse(name) {
        Ok(service) => service,
        Err(error) => {
            assert_eq!(error.service, name);
            return;
        }
    };
    let written = service.to_string();
    assert_eq!(
        HostService::parse(&written).as_ref(),
        Ok(&service),
        "{name:?} written as {written:?}"
    );
    // The request is the end of the name; only numbers (ids, ports) have
    // other spellings.
    let request = service.request.to_string();
    let numeric = matches!(
        service.request,
        HostRequest::Transport(_) | HostRequest::Emulator(_)
    ) || matches!(
        service.device,
        oxadb_wire::service::DeviceSelector::TransportId(_)
    );
    if !numeric {
        assert!(
            name.ends_with(&request),
            "{name:?} does not end with {request:?}"
        );
        assert_eq!(written, name, "written back differently");
    }
    if let HostRequest::Forward(ForwardRequest::Forward { local, remote, .. }) = &service.request {
        assert!(!local.is_empty() && !remote.is_empty());
        assert!(!local.contains(';') && !remote.contains(';') && !remote.starts_with('*'));
    }
}
