//! `tcpip:PORT` and `usb:`: a host moves the daemon's TCP listener to
//! another port, or closes it when the daemon also serves USB, as adbd
//! restarts on `service.adb.tcp.port` (AOSP daemon/restart_service.cpp).
//! The address never changes: only the port does, so a host can never
//! widen the daemon beyond the address its operator chose
//! (docs/security.md, "Moving the listener"). Connections already made
//! are kept.

use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

/// What a host asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// `tcpip:PORT`.
    Tcp(u16),
    /// `usb:`.
    Usb,
}

/// adbd's answer to a `tcpip:` port it cannot use (`port`: the text sent).
pub fn invalid_port(port: &str) -> String {
    format!("invalid port {port}\n")
}

type Message = (Request, oneshot::Sender<String>);

/// The channel from the `tcpip:`/`usb:` services to the TCP accept loop.
pub struct Switch {
    sender: mpsc::UnboundedSender<Message>,
    receiver: Mutex<Option<mpsc::UnboundedReceiver<Message>>>,
}

impl Default for Switch {
    fn default() -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        Switch {
            sender,
            receiver: Mutex::new(Some(receiver)),
        }
    }
}

impl Switch {
    /// For the accept loop; the first caller gets it.
    pub fn take_receiver(&self) -> Option<mpsc::UnboundedReceiver<Message>> {
        self.receiver.lock().ok()?.take()
    }

    /// Serves one `tcpip:`/`usb:` stream: asks the accept loop, writes its
    /// answer, closes the stream. `allowed`: the operator lets hosts do it.
    pub async fn serve<S: AsyncWrite + Unpin>(
        &self,
        mut stream: S,
        request: Request,
        allowed: bool,
    ) {
        let text = if !allowed {
            "oxadbd does not let hosts move its TCP listener (allow-tcpip = false); \
             it stays where it was started\n"
                .to_string()
        } else {
            let (reply, answer) = oneshot::channel();
            match self.sender.send((request, reply)) {
                Ok(()) => answer.await.unwrap_or_else(|_| {
                    "oxadbd's TCP listener is not running; nothing was changed\n".into()
                }),
                Err(_) => "oxadbd's TCP listener is not running; nothing was changed\n".into(),
            }
        };
        tracing::info!(?request, answer = text.trim_end(), "transport switch");
        let _ = stream.write_all(text.as_bytes()).await;
        let _ = stream.shutdown().await;
    }
}

/// Carries out `request` on `listener` (`None`: not listening on TCP), and
/// says what happened in words for the host. `home`: the address to listen
/// on when there is no listener; `usb`: the daemon serves USB too.
pub async fn apply(
    request: Request,
    listener: &mut Option<TcpListener>,
    home: IpAddr,
    usb: bool,
) -> String {
    let current = listener.as_ref().and_then(|l| l.local_addr().ok());
    match request {
        Request::Tcp(port) => {
            let ip = current.map_or(home, |addr| addr.ip());
            let wanted = SocketAddr::new(ip, port);
            if current == Some(wanted) {
                return format!("restarting in TCP mode port: {port}\n");
            }
            match TcpListener::bind(wanted).await {
                Ok(new) => {
                    tracing::warn!(from = ?current, to = %wanted, "a host moved the TCP listener");
                    *listener = Some(new);
                    format!("restarting in TCP mode port: {port}\n")
                }
                Err(error) => {
                    let now = current.map_or("not on TCP".into(), |a| format!("still on {a}"));
                    tracing::warn!(to = %wanted, %error, "cannot move the TCP listener");
                    format!("oxadbd cannot listen on {wanted}: {error}; {now}\n")
                }
            }
        }
        Request::Usb if usb => {
            if listener.take().is_some() {
                tracing::warn!(from = ?current, "a host closed the TCP listener (USB only now)");
            }
            "restarting in USB mode\n".into()
        }
        Request::Usb => match current {
            Some(addr) => format!(
                "oxadbd serves no USB gadget here (start it with --usb); staying in TCP mode \
                 on {addr}\n"
            ),
            None => "oxadbd serves no USB gadget here\n".into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_port_is_answered_in_adbds_words() {
        assert_eq!(invalid_port("0"), "invalid port 0\n");
        assert_eq!(invalid_port("x"), "invalid port x\n");
    }

    #[tokio::test]
    async fn the_port_moves_and_the_address_stays() {
        let old = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let old_addr = old.local_addr().unwrap();
        let mut listener = Some(old);
        let free = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
        let home = "198.18.0.1".parse().unwrap();
        let text = apply(Request::Tcp(port), &mut listener, home, false).await;
        assert_eq!(text, format!("restarting in TCP mode port: {port}\n"));
        let now = listener.as_ref().unwrap().local_addr().unwrap();
        assert_eq!(now, SocketAddr::new(old_addr.ip(), port));
        assert!(std::net::TcpStream::connect(old_addr).is_err());
        // A port in use: refused, the listener stays.
        let busy = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let busy_port = busy.local_addr().unwrap().port();
        let text = apply(Request::Tcp(busy_port), &mut listener, home, false).await;
        assert!(
            text.starts_with("oxadbd cannot listen on 127.0.0.1:"),
            "{text}"
        );
        assert!(text.ends_with(&format!("still on {now}\n")), "{text}");
        // No USB: refused; with USB, TCP closes.
        let text = apply(Request::Usb, &mut listener, home, false).await;
        assert!(text.starts_with("oxadbd serves no USB gadget"), "{text}");
        assert!(listener.is_some());
        assert_eq!(
            apply(Request::Usb, &mut listener, home, true).await,
            "restarting in USB mode\n"
        );
        assert!(listener.is_none());
    }
}
