//! oxadb: a host library for the Android Debug Bridge. It talks to any adbd
//! (Android's or `oxadbd`) directly over TCP or USB, with no adb server in between,
//! and pipelines transfers ("burst mode", `delayed_ack`) whenever the device
//! supports it.
//!
//! ```no_run
//! # async fn demo() -> oxadb::Result<()> {
//! use oxadb::{ConnectOptions, Device};
//!
//! let device = Device::connect("127.0.0.1:5555", &ConnectOptions::default()).await?;
//! println!("burst mode: {}", device.burst_mode());
//! let output = device.shell("uname -a").await?;
//! print!("{}", String::from_utf8_lossy(&output.stdout));
//! assert_eq!(output.exit_code, 0);
//! # Ok(())
//! # }
//! ```
mod byte_stream;
pub mod delta;
pub mod device;
pub mod error;
mod first_bytes;
pub mod host_client;
pub mod pair;
pub mod relay;
pub mod reverse;
pub mod server;
pub mod shell;
pub mod sync;
pub mod target;
pub mod usb;

pub use byte_stream::{BoxedStream, ByteStream};
pub use device::{resolve, ConnectOptions, CreditMode, Device, DeviceState};
pub use error::{Error, Result};
pub use oxadb_engine::{BudgetLimits, MemoryBudget};
pub use oxadb_io::{AdbStream, Incoming, StreamStats};
pub use oxadb_wire::service::DeviceService;
pub use reverse::{HostEnd, ReverseEntry};
pub use shell::ShellOutput;
pub use target::Target;
pub use usb::UsbDeviceInfo;
