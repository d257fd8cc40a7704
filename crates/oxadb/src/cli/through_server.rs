//! The commands an adb host server answers itself when `oxadb` goes through
//! one, as adb's CLI asks them (AOSP `client/commandline.cpp`): devices,
//! connections, states, waits and forwards. Services opened on the device
//! (shell, sync, reverse...) go through `endpoint::Endpoint` instead.

use anyhow::bail;
use oxadb::host_client::{HostServer, Selector, ServerDevice};
use tokio::net::TcpStream;

use super::forward::ForwardArgs;
use super::reverse::ReverseArgs;

/// `devices [-l]`: the server's list under adb's heading.
pub async fn devices(server: &HostServer, long: bool) -> anyhow::Result<i32> {
    let request = if long {
        "host:devices-l"
    } else {
        "host:devices"
    };
    let list = server.query(request).await?;
    println!("List of devices attached");
    println!("{list}");
    Ok(0)
}

/// A request whose answer is printed as it comes (`connect`, `get-state`...),
/// as adb's `adb_query_command` prints it.
pub async fn print_query(server: &HostServer, request: &str) -> anyhow::Result<i32> {
    let answer = server.query(request).await?;
    println!("{answer}");
    Ok(0)
}

/// `connect HOST[:PORT]`: the server connects and keeps the device.
pub async fn connect(server: &HostServer, address: Option<&str>) -> anyhow::Result<i32> {
    let Some(address) = address else {
        eprintln!("adb: usage: adb connect HOST[:PORT]");
        return Ok(1);
    };
    print_query(server, &format!("host:connect:{address}")).await
}

/// `disconnect [HOST[:PORT]]`: one device, or every TCP device.
pub async fn disconnect(server: &HostServer, address: Option<&str>) -> anyhow::Result<i32> {
    print_query(
        server,
        &format!("host:disconnect:{}", address.unwrap_or("")),
    )
    .await
}

/// `wait-for[-TRANSPORT]-STATE`: the server answers `OKAY` at once and
/// again once the state is reached; without a transport in the command,
/// the one `-d`/`-e` imply (AOSP `wait_for_device`).
pub async fn wait_for(
    server: &HostServer,
    selector: &Selector,
    command: &str,
) -> anyhow::Result<i32> {
    let Some(rest) = command.strip_prefix("wait-for-") else {
        bail!("unknown command {command}");
    };
    let has_transport = ["usb-", "local-", "any-"]
        .iter()
        .any(|transport| rest.starts_with(transport));
    let request = if has_transport {
        command.to_string()
    } else {
        let transport = match selector {
            Selector::Usb => "usb",
            Selector::Local => "local",
            _ => "any",
        };
        format!("wait-for-{transport}-{rest}")
    };
    let mut stream = server
        .request(&format!("{}:{request}", selector.host_prefix()))
        .await?;
    server.status(&mut stream).await?;
    Ok(0)
}

/// `forward`: the server's forwards, `host-serial:S:forward:...` and the
/// rest, as adb's CLI asks for them.
pub async fn forward(
    server: &HostServer,
    selector: &Selector,
    args: &ForwardArgs,
) -> anyhow::Result<i32> {
    if args.list {
        // The list is the server's, all devices' (adb asks `host:` too).
        return print_query(server, "host:list-forward").await;
    }
    let prefix = selector.host_prefix();
    let request = if args.remove_all {
        format!("{prefix}:killforward-all")
    } else if let Some(local) = &args.remove {
        format!("{prefix}:killforward:{local}")
    } else {
        let (Some(local), Some(remote)) = (&args.local, &args.remote) else {
            bail!("forward takes two arguments: LOCAL REMOTE");
        };
        let norebind = if args.no_rebind { "norebind:" } else { "" };
        format!("{prefix}:forward:{norebind}{local};{remote}")
    };
    // The first OKAY says the device was found, the second the result
    // (AOSP `adb.cpp` handle_forward_request).
    let mut stream = server.request(&request).await?;
    server.status(&mut stream).await?;
    print_resolved_port(server, &mut stream).await;
    Ok(0)
}

/// `reverse`: the device's own forwarding service, through the server,
/// which connects what the device opens to this machine for as long as it
/// holds the device.
pub async fn reverse(device: &ServerDevice, args: &ReverseArgs) -> anyhow::Result<i32> {
    let server = device.server();
    if args.list {
        let mut stream = device.open_text("reverse:list-forward").await?;
        let list = server.message(&mut stream).await?;
        println!("{list}");
        return Ok(0);
    }
    let service = if args.remove_all {
        "reverse:killforward-all".to_string()
    } else if let Some(remote) = &args.remove {
        format!("reverse:killforward:{remote}")
    } else {
        let (Some(remote), Some(local)) = (&args.remote, &args.local) else {
            bail!("reverse takes two arguments: REMOTE LOCAL");
        };
        let norebind = if args.no_rebind { "norebind:" } else { "" };
        format!("reverse:forward:{norebind}{remote};{local}")
    };
    // The server's OKAY opened the service; the device's says the result.
    let mut stream = device.open_text(&service).await?;
    server.status(&mut stream).await?;
    print_resolved_port(&server, &mut stream).await;
    Ok(0)
}

/// A `tcp:0` forward answers the port it chose after its `OKAY`.
async fn print_resolved_port(server: &HostServer, stream: &mut TcpStream) {
    if let Ok(port) = server.message(stream).await {
        if !port.is_empty() {
            println!("{port}");
        }
    }
}
