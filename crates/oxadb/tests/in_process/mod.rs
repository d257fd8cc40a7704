//! An `oxadbd` served in this test process, on its own runtime thread, for
//! tests that run the `oxadb` binary against it.

use std::net::{SocketAddr, TcpListener};

use oxadbd::config::DaemonConfig;

/// Starts a daemon on a free loopback port with the configuration `config`
/// makes from its address; returns the address.
pub fn start_daemon(
    config: impl FnOnce(SocketAddr) -> DaemonConfig + Send + 'static,
) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            oxadbd::server::serve(listener, config(addr)).await.unwrap();
        });
    });
    addr
}
