//! Who owns the other end of a local TCP connection: the uid of the
//! connecting socket, asked of the kernel. NETLINK_SOCK_DIAG's exact inet_diag
//! lookup (what `ss -e` uses) comes first; `/proc/net/tcp` and `tcp6` are read
//! when it fails (kernels built without inet_diag). Only an ESTABLISHED socket
//! counts: a closed one is orphaned or a TIME_WAIT entry, which the kernel
//! reports as owned by root whoever made it (docs/security.md, "Who gets in").

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use rustix::fd::OwnedFd;
use rustix::net::{netlink, AddressFamily, RecvFlags, SendFlags, SocketType};
use thiserror::Error;

/// `TCP_ESTABLISHED` in include/net/tcp_states.h.
const TCP_ESTABLISHED: u8 = 1;
/// `SOCK_DIAG_BY_FAMILY` in include/uapi/linux/sock_diag.h.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_HDRLEN: usize = 16;
/// `struct inet_diag_req_v2`: family, protocol, ext, pad, states, then the
/// 48-byte `struct inet_diag_sockid`.
const REQ_LEN: usize = 8 + SOCKID_LEN;
const SOCKID_LEN: usize = 48;
/// `struct inet_diag_msg`: family, state, timer, retrans, the sockid, then
/// expires, rqueue, wqueue, uid and inode (u32 each).
const MSG_UID_OFFSET: usize = 4 + SOCKID_LEN + 12;
const MSG_LEN: usize = MSG_UID_OFFSET + 8;

#[derive(Debug, Error)]
#[error("sock_diag: {diag}; /proc/net/tcp: {proc}")]
pub struct OwnerError {
    pub diag: io::Error,
    pub proc: io::Error,
}

/// What the kernel knows of the socket at `peer` connected to `local`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// Established and owned by this uid.
    Uid(u32),
    /// There, but not established (closed, closing): its owner is not
    /// reported faithfully, so nobody is vouched for.
    NotEstablished(u8),
    /// No such socket in this network namespace.
    Missing,
}

/// The name of a TCP state (include/net/tcp_states.h), for logs.
pub fn state_name(state: u8) -> &'static str {
    match state {
        1 => "ESTABLISHED",
        2 => "SYN_SENT",
        3 => "SYN_RECV",
        4 => "FIN_WAIT1",
        5 => "FIN_WAIT2",
        6 => "TIME_WAIT",
        7 => "CLOSE",
        8 => "CLOSE_WAIT",
        9 => "LAST_ACK",
        10 => "LISTEN",
        11 => "CLOSING",
        _ => "unknown",
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it stands for, so that a
/// dual-stack listener's `::ffff:127.0.0.1` peer and a `127.0.0.1` one are the same.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// 127.0.0.0/8, ::1, and ::ffff:127.0.0.0/104.
pub fn is_loopback(ip: IpAddr) -> bool {
    canonical(ip).is_loopback()
}

/// The owner of the socket whose local address is `peer` and whose remote
/// address is `local`: for an accepted connection, `local` is our socket's
/// local address and `peer` its peer address.
pub fn peer_owner(local: SocketAddr, peer: SocketAddr) -> Result<Owner, OwnerError> {
    let local = SocketAddr::new(canonical(local.ip()), local.port());
    let peer = SocketAddr::new(canonical(peer.ip()), peer.port());
    match sock_diag(local, peer) {
        Ok(owner) => Ok(owner),
        // ENOENT also means "no TCP diag module": only /proc tells them apart.
        Err(diag) => proc_net_tcp(local, peer).map_err(|proc| OwnerError { diag, proc }),
    }
}

/// The exact lookup of `inet_diag_find_one_icsk` (net/ipv4/inet_diag.c): the
/// kernel matches a socket with local `src:sport` and remote `dst:dport`.
fn sock_diag(local: SocketAddr, peer: SocketAddr) -> io::Result<Owner> {
    let family = match (local.ip(), peer.ip()) {
        (IpAddr::V4(_), IpAddr::V4(_)) => libc::AF_INET,
        (IpAddr::V6(_), IpAddr::V6(_)) => libc::AF_INET6,
        // Canonical addresses of one connection are of one family.
        _ => return Ok(Owner::Missing),
    };
    let socket: OwnedFd = rustix::net::socket(
        AddressFamily::NETLINK,
        SocketType::DGRAM,
        Some(netlink::SOCK_DIAG),
    )?;
    // The kernel answers while handling the request; the timeout only guards
    // against a kernel that never does.
    rustix::net::sockopt::set_socket_timeout(
        &socket,
        rustix::net::sockopt::Timeout::Recv,
        Some(Duration::from_secs(1)),
    )?;
    let request = diag_request(family as u8, peer, local);
    rustix::net::send(&socket, &request, SendFlags::empty())?;
    let mut reply = vec![0u8; 8192];
    let (received, _) = rustix::net::recv(&socket, &mut reply[..], RecvFlags::empty())?;
    parse_diag_reply(&reply[..received], peer, local)
}

/// A `SOCK_DIAG_BY_FAMILY` request for the TCP socket with local address
/// `src` and remote address `dst`.
fn diag_request(family: u8, src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    let mut message = Vec::with_capacity(NLMSG_HDRLEN + REQ_LEN);
    message.extend_from_slice(&((NLMSG_HDRLEN + REQ_LEN) as u32).to_ne_bytes());
    message.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    message.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    message.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    message.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it in
    message.extend_from_slice(&[family, libc::IPPROTO_TCP as u8, 0, 0]);
    message.extend_from_slice(&u32::MAX.to_ne_bytes()); // states: not used by exact lookups
    message.extend_from_slice(&sockid(src, dst));
    message
}

/// `struct inet_diag_sockid`: ports and addresses in network order, no
/// interface, `INET_DIAG_NOCOOKIE`.
fn sockid(src: SocketAddr, dst: SocketAddr) -> [u8; SOCKID_LEN] {
    let mut id = [0u8; SOCKID_LEN];
    id[0..2].copy_from_slice(&src.port().to_be_bytes());
    id[2..4].copy_from_slice(&dst.port().to_be_bytes());
    let octets = |ip: IpAddr| match ip {
        IpAddr::V4(v4) => {
            let mut out = [0u8; 16];
            out[..4].copy_from_slice(&v4.octets());
            out
        }
        IpAddr::V6(v6) => v6.octets(),
    };
    id[4..20].copy_from_slice(&octets(src.ip()));
    id[20..36].copy_from_slice(&octets(dst.ip()));
    id[40..48].fill(0xff);
    id
}

fn parse_diag_reply(reply: &[u8], src: SocketAddr, dst: SocketAddr) -> io::Result<Owner> {
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    if reply.len() < NLMSG_HDRLEN {
        return Err(invalid("short netlink reply"));
    }
    let kind = u16::from_ne_bytes([reply[4], reply[5]]);
    let body = &reply[NLMSG_HDRLEN..];
    match kind {
        NLMSG_ERROR => {
            let code = body
                .get(..4)
                .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                .ok_or_else(|| invalid("short netlink error"))?;
            Err(io::Error::from_raw_os_error(-code))
        }
        SOCK_DIAG_BY_FAMILY if body.len() >= MSG_LEN => {
            // The kernel may also match a listener or a socket bound to
            // another device: only the exact connection counts. An IPv6
            // socket connected over IPv4 comes back with mapped addresses.
            let addr = |port: &[u8], ip: &[u8]| {
                let port = u16::from_be_bytes([port[0], port[1]]);
                let ip = match i32::from(body[0]) {
                    libc::AF_INET => IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3])),
                    _ => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(ip).unwrap_or_default())),
                };
                SocketAddr::new(canonical(ip), port)
            };
            if addr(&body[4..6], &body[8..24]) != src || addr(&body[6..8], &body[24..40]) != dst {
                return Ok(Owner::Missing);
            }
            let state = body[1];
            if state != TCP_ESTABLISHED {
                return Ok(Owner::NotEstablished(state));
            }
            let uid = &body[MSG_UID_OFFSET..MSG_UID_OFFSET + 4];
            Ok(Owner::Uid(u32::from_ne_bytes([
                uid[0], uid[1], uid[2], uid[3],
            ])))
        }
        other => Err(invalid(&format!("unexpected netlink message type {other}"))),
    }
}

/// Reads `/proc/net/tcp` (and `tcp6`, absent without IPv6) for the socket
/// at `peer` connected to `local`.
fn proc_net_tcp(local: SocketAddr, peer: SocketAddr) -> io::Result<Owner> {
    let mut found = Owner::Missing;
    for (path, required) in [("/proc/net/tcp", true), ("/proc/net/tcp6", false)] {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if !required && error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => return Err(error),
        };
        match find_in_proc_table(&text, peer, local) {
            Owner::Missing => {}
            Owner::Uid(uid) => return Ok(Owner::Uid(uid)),
            not_established => found = not_established,
        }
    }
    Ok(found)
}

/// Finds the entry with local address `src` and remote address `dst` in the
/// text of `/proc/net/tcp` or `tcp6` (net/ipv4/tcp_ipv4.c `get_tcp4_sock`,
/// net/ipv6/tcp_ipv6.c `get_tcp6_sock`). Addresses compare canonically, as
/// an IPv6 socket connected over IPv4 is listed with mapped addresses.
fn find_in_proc_table(text: &str, src: SocketAddr, dst: SocketAddr) -> Owner {
    let mut found = Owner::Missing;
    for line in text.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // sl local rem st tx:rx tr:when retrnsmt uid ...
        let (Some(local), Some(remote), Some(state), Some(uid)) = (
            fields.get(1).and_then(|f| parse_proc_addr(f)),
            fields.get(2).and_then(|f| parse_proc_addr(f)),
            fields.get(3).and_then(|f| u8::from_str_radix(f, 16).ok()),
            fields.get(7).and_then(|f| f.parse::<u32>().ok()),
        ) else {
            continue;
        };
        if local != src || remote != dst {
            continue;
        }
        if state == TCP_ESTABLISHED {
            return Owner::Uid(uid);
        }
        found = Owner::NotEstablished(state);
    }
    found
}

/// `0100007F:15B3` (IPv4) or 32 hex digits and a port (IPv6): each 32-bit
/// word of the address is printed as a native-endian number.
fn parse_proc_addr(text: &str) -> Option<SocketAddr> {
    let (addr, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| {
        addr.get(i * 8..i * 8 + 8)
            .and_then(|hex| u32::from_str_radix(hex, 16).ok())
            .map(u32::to_ne_bytes)
    };
    let ip = match addr.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut octets = [0u8; 16];
            for i in 0..4 {
                octets[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(octets))
        }
        _ => return None,
    };
    Some(SocketAddr::new(canonical(ip), port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    fn euid() -> u32 {
        rustix::process::geteuid().as_raw()
    }

    /// A connection to a listener on `bind`, made to `to` (default: the
    /// listener's address): (our accepted socket's local address, its peer
    /// address, the client, the accepted socket).
    fn connection(bind: &str, to: Option<&str>) -> (SocketAddr, SocketAddr, TcpStream, TcpStream) {
        let listener = TcpListener::bind(bind).expect(bind);
        let port = listener.local_addr().unwrap().port();
        let target = match to {
            Some(ip) => SocketAddr::new(ip.parse().unwrap(), port),
            None => listener.local_addr().unwrap(),
        };
        let client = TcpStream::connect(target).unwrap();
        let (accepted, peer) = listener.accept().unwrap();
        (accepted.local_addr().unwrap(), peer, client, accepted)
    }

    #[test]
    fn our_own_connections_are_ours_on_every_loopback() {
        // IPv4, IPv6 (::1 must exist: the daemon is meant to serve it), IPv4
        // to a dual-stack socket (its peers appear as ::ffff:127.0.0.1), and
        // an IPv6 client socket reaching an IPv4 listener (the kernel lists
        // it with mapped addresses).
        for (bind, to) in [
            ("127.0.0.1:0", None),
            ("[::1]:0", None),
            ("[::ffff:127.0.0.1]:0", Some("127.0.0.1")),
            ("127.0.0.1:0", Some("::ffff:127.0.0.1")),
        ] {
            let (local, peer, _client, _accepted) = connection(bind, to);
            assert!(is_loopback(peer.ip()), "{peer}");
            assert_eq!(
                peer_owner(local, peer).unwrap(),
                Owner::Uid(euid()),
                "{bind} {to:?}"
            );
            let local = SocketAddr::new(canonical(local.ip()), local.port());
            let peer = SocketAddr::new(canonical(peer.ip()), peer.port());
            assert_eq!(
                sock_diag(local, peer).unwrap(),
                Owner::Uid(euid()),
                "{bind} {to:?}"
            );
            assert_eq!(
                proc_net_tcp(local, peer).unwrap(),
                Owner::Uid(euid()),
                "{bind} {to:?}"
            );
        }
    }

    #[test]
    fn a_tuple_nobody_holds_has_no_owner() {
        let (local, peer, _client, _accepted) = connection("127.0.0.1:0", None);
        // Our accepted socket's own end is not a peer: swapped, the tuple is ours.
        assert_eq!(peer_owner(peer, local).unwrap(), Owner::Uid(euid()));
        let nobody = SocketAddr::new(peer.ip(), 1);
        assert_eq!(peer_owner(local, nobody).unwrap(), Owner::Missing);
        let nowhere: SocketAddr = "[::1]:1".parse().unwrap();
        assert_eq!(peer_owner(nowhere, nobody).unwrap(), Owner::Missing);
    }

    #[test]
    fn a_peer_that_closed_is_not_vouched_for() {
        // The kernel reports a closed socket's TIME_WAIT or FIN_WAIT2 remains
        // as root's: the lookup must not turn that into a trusted uid.
        let (local, peer, client, _accepted) = connection("127.0.0.1:0", None);
        drop(client);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let owner = loop {
            let owner = peer_owner(local, peer).unwrap();
            if owner != Owner::Uid(euid()) || std::time::Instant::now() > deadline {
                break owner;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(
            matches!(owner, Owner::NotEstablished(_) | Owner::Missing),
            "{owner:?}"
        );
        let (local, peer) = (
            SocketAddr::new(canonical(local.ip()), local.port()),
            SocketAddr::new(canonical(peer.ip()), peer.port()),
        );
        assert_eq!(sock_diag(local, peer).unwrap(), owner);
        assert!(!matches!(proc_net_tcp(local, peer).unwrap(), Owner::Uid(_)));
    }

    #[test]
    fn proc_tables_parse() {
        let hex4 = |octets: [u8; 4]| format!("{:08X}", u32::from_ne_bytes(octets));
        let lo = hex4([127, 0, 0, 1]);
        let table = format!(
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
             0: 00000000:15B3 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0\n\
             1: {lo}:9C40 {lo}:15B3 06 00000000:00000000 03:00000150 00000000     0        0 0 3 0\n\
             2: {lo}:9C41 {lo}:15B3 01 00000000:00000000 00:00000000 00000000  1234        0 9 1 0\n"
        );
        let daemon: SocketAddr = "127.0.0.1:5555".parse().unwrap();
        let at = |port: u16| SocketAddr::new([127, 0, 0, 1].into(), port);
        assert_eq!(
            find_in_proc_table(&table, at(0x9C41), daemon),
            Owner::Uid(1234)
        );
        assert_eq!(
            find_in_proc_table(&table, at(0x9C40), daemon),
            Owner::NotEstablished(6)
        );
        assert_eq!(
            find_in_proc_table(&table, at(0x9C42), daemon),
            Owner::Missing
        );
        // IPv6: ::1, and ::ffff:127.0.0.1 (which compares as 127.0.0.1).
        let words = |octets: [u8; 16]| -> String {
            octets
                .chunks(4)
                .map(|w| hex4([w[0], w[1], w[2], w[3]]))
                .collect()
        };
        let one = words(Ipv6Addr::LOCALHOST.octets());
        let mapped = words(Ipv4Addr::LOCALHOST.to_ipv6_mapped().octets());
        let table6 = format!(
            "  sl  local_address remote_address st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
             0: {one}:9C40 {one}:15B3 01 00000000:00000000 00:00000000 00000000   42        0 7 1 0\n\
             1: {mapped}:9C41 {mapped}:15B3 01 00000000:00000000 00:00000000 00000000   43        0 8 1 0\n"
        );
        let daemon6: SocketAddr = "[::1]:5555".parse().unwrap();
        let at6 = |port: u16| SocketAddr::new(Ipv6Addr::LOCALHOST.into(), port);
        assert_eq!(
            find_in_proc_table(&table6, at6(0x9C40), daemon6),
            Owner::Uid(42)
        );
        assert_eq!(
            find_in_proc_table(&table6, at(0x9C41), daemon),
            Owner::Uid(43)
        );
        assert_eq!(parse_proc_addr("0100007G:15B3"), None);
        assert_eq!(parse_proc_addr("0100007F"), None);
    }

    #[test]
    fn mapped_addresses_are_their_ipv4_selves() {
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert_eq!(canonical(mapped), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert!(is_loopback(mapped));
        assert!(is_loopback("::1".parse().unwrap()));
        // ::0.0.0.1 (IPv4-compatible) is not loopback; ::1 is not 0.0.0.1.
        assert!(!is_loopback("::ffff:198.18.0.1".parse().unwrap()));
        assert_eq!(
            canonical("::1".parse().unwrap()),
            IpAddr::V6(Ipv6Addr::LOCALHOST)
        );
    }
}
