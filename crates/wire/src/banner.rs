//! The connection banner ("system identity string") carried by CNXN:
//! `device::ro.product.name=X;ro.product.model=Y;ro.product.device=Z;features=a,b,c`
//! (a host sends `host::features=...`).

use thiserror::Error;

/// Features, as named on the wire. Advertise only what is implemented.
pub mod feature {
    pub const SHELL_V2: &str = "shell_v2";
    pub const CMD: &str = "cmd";
    pub const STAT_V2: &str = "stat_v2";
    pub const LS_V2: &str = "ls_v2";
    pub const FIXED_PUSH_MKDIR: &str = "fixed_push_mkdir";
    pub const FIXED_PUSH_SYMLINK_TIMESTAMP: &str = "fixed_push_symlink_timestamp";
    pub const SENDRECV_V2: &str = "sendrecv_v2";
    pub const SENDRECV_V2_BROTLI: &str = "sendrecv_v2_brotli";
    pub const SENDRECV_V2_LZ4: &str = "sendrecv_v2_lz4";
    pub const SENDRECV_V2_ZSTD: &str = "sendrecv_v2_zstd";
    pub const SENDRECV_V2_DRY_RUN_SEND: &str = "sendrecv_v2_dry_run_send";
    pub const DELAYED_ACK: &str = "delayed_ack";
    /// oxadbd's own: a `RECV` of anything but a regular file or a device
    /// fails at once, so a host may send it before the `STAT` reply that
    /// tells it what the path is (docs/protocol.md, "Pulls in two round
    /// trips"). Against AOSP's adbd that would block on a FIFO.
    pub const OXADB_RECV_AHEAD: &str = "oxadb_recv_ahead";
    /// oxadbd's own: the `oxadb-delta:` service, which builds an image from
    /// block operations on the old one (docs/delta.md).
    pub const OXADB_DELTA: &str = "oxadb_delta";

    /// Features a device names in its CNXN only when the host's CNXN named
    /// them too, and serves only then: stock adb never sees them.
    pub const ONLY_IF_ASKED: &[&str] = &[OXADB_DELTA];

    /// What oxadb implements on both sides, besides `delayed_ack` (which is a
    /// per-connection choice): shell protocol v2 and the whole sync protocol.
    pub const IMPLEMENTED: &[&str] = &[
        SHELL_V2,
        STAT_V2,
        LS_V2,
        FIXED_PUSH_MKDIR,
        FIXED_PUSH_SYMLINK_TIMESTAMP,
        SENDRECV_V2,
        SENDRECV_V2_BROTLI,
        SENDRECV_V2_LZ4,
        SENDRECV_V2_ZSTD,
        SENDRECV_V2_DRY_RUN_SEND,
    ];
}

/// Longest banner we accept; a CNXN payload is bounded by the max payload anyway,
/// this keeps a hostile peer from making us parse megabytes of features.
pub const MAX_BANNER_LEN: usize = 64 * 1024;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum BannerError {
    #[error("banner longer than {MAX_BANNER_LEN} bytes")]
    TooLong,
    #[error("banner is not UTF-8")]
    NotUtf8,
    #[error("banner {0:?} has no `kind:serial:` prefix")]
    Malformed(String),
}

/// A parsed banner.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Banner {
    /// `device`, `host`, `bootloader`, `recovery`, `sideload`, ...
    pub kind: String,
    /// Historical serial field, empty in practice.
    pub serial: String,
    /// `key=value` properties in order, except `features`.
    pub properties: Vec<(String, String)>,
    pub features: Vec<String>,
}

impl Banner {
    pub fn new(kind: &str) -> Banner {
        Banner {
            kind: kind.to_string(),
            ..Banner::default()
        }
    }

    pub fn property(&self, key: &str) -> Option<&str> {
        self.properties
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn has_feature(&self, name: &str) -> bool {
        self.features.iter().any(|f| f == name)
    }

    /// Parses a CNXN payload. Peers send a C string, so the banner ends at its
    /// first NUL: a NUL kept inside a field would not survive [`Banner::encode`].
    pub fn parse(raw: &[u8]) -> Result<Banner, BannerError> {
        if raw.len() > MAX_BANNER_LEN {
            return Err(BannerError::TooLong);
        }
        let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        let text = std::str::from_utf8(&raw[..end]).map_err(|_| BannerError::NotUtf8)?;
        let mut parts = text.splitn(3, ':');
        let (Some(kind), Some(serial), Some(rest)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(BannerError::Malformed(text.chars().take(80).collect()));
        };
        let mut banner = Banner::new(kind);
        banner.serial = serial.to_string();
        for item in rest.split(';').filter(|s| !s.is_empty()) {
            let (key, value) = item.split_once('=').unwrap_or((item, ""));
            if key == "features" {
                banner.features = value
                    .split(',')
                    .filter(|f| !f.is_empty())
                    .map(str::to_string)
                    .collect();
            } else {
                banner.properties.push((key.to_string(), value.to_string()));
            }
        }
        Ok(banner)
    }

    /// Encodes for a CNXN payload (no trailing NUL: AOSP strips it and adb 29 accepts both).
    pub fn encode(&self) -> String {
        let mut out = format!("{}:{}:", self.kind, self.serial);
        for (key, value) in &self.properties {
            out.push_str(&format!("{key}={value};"));
        }
        out.push_str("features=");
        out.push_str(&self.features.join(","));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_banner() {
        let banner = Banner::parse(
            b"device::ro.product.name=board;ro.product.model=Model X;ro.product.device=dev;features=shell_v2,delayed_ack\0",
        )
        .unwrap();
        assert_eq!(banner.kind, "device");
        assert_eq!(banner.property("ro.product.model"), Some("Model X"));
        assert!(banner.has_feature("delayed_ack"));
        assert!(!banner.has_feature("cmd"));
    }

    #[test]
    fn parses_host_banner_and_round_trips() {
        let banner = Banner::parse(b"host::features=shell_v2,cmd").unwrap();
        assert_eq!(banner.kind, "host");
        assert_eq!(banner.features, vec!["shell_v2", "cmd"]);
        assert_eq!(Banner::parse(banner.encode().as_bytes()).unwrap(), banner);
        let mut device = Banner::new("device");
        device
            .properties
            .push(("ro.product.name".into(), "n".into()));
        device.features.push(feature::DELAYED_ACK.into());
        assert_eq!(
            device.encode(),
            "device::ro.product.name=n;features=delayed_ack"
        );
        assert_eq!(Banner::parse(device.encode().as_bytes()).unwrap(), device);
    }

    #[test]
    fn old_host_banner_without_features() {
        let banner = Banner::parse(b"host::\0").unwrap();
        assert!(banner.features.is_empty());
    }

    #[test]
    fn banner_ends_at_the_first_nul() {
        // Found by fuzz/fuzz_targets/banner.rs: with only trailing NULs dropped,
        // this feature kept a NUL that encode() then put at the end, where the
        // next parse dropped it.
        let banner = Banner::parse(b"host::features=shell_v2\0;x=y\0\0").unwrap();
        assert_eq!(banner.features, vec!["shell_v2"]);
        assert!(banner.properties.is_empty());
        assert_eq!(Banner::parse(banner.encode().as_bytes()).unwrap(), banner);
        let banner = Banner::parse(b"device::a=b\0junk").unwrap();
        assert_eq!(banner.property("a"), Some("b"));
        assert!(matches!(
            Banner::parse(b"host\0::features=cmd"),
            Err(BannerError::Malformed(_))
        ));
    }

    #[test]
    fn rejects_garbage() {
        assert!(matches!(
            Banner::parse(b"nonsense"),
            Err(BannerError::Malformed(_))
        ));
        assert_eq!(
            Banner::parse(&[0xff, b':', b':']),
            Err(BannerError::NotUtf8)
        );
        assert_eq!(
            Banner::parse(&vec![b'a'; MAX_BANNER_LEN + 1]),
            Err(BannerError::TooLong)
        );
    }
}
