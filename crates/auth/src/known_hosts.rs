//! `~/.android/adb_known_hosts.pb`: the GUIDs of the devices this host
//! paired with, as Google's adb keeps them (AOSP `client/adb_wifi.cpp`
//! KnownWifiHostsFile, `proto/adb_known_hosts.proto`). A host server
//! connects a paired device by itself when it sees the device's
//! `_adb-tls-connect._tcp` service, whose instance name is that GUID.
//!
//! The file is the protobuf `AdbKnownHosts { repeated HostInfo host_infos
//! = 1; }` with `HostInfo { string guid = 1; }`, as prost structs, so that
//! adb and oxadb share one file.

use std::path::{Path, PathBuf};

use prost::Message as _;

use crate::error::KeyError;

/// AOSP `proto/adb_known_hosts.proto` AdbKnownHosts.
#[derive(Clone, PartialEq, prost::Message)]
struct AdbKnownHosts {
    #[prost(message, repeated, tag = "1")]
    host_infos: Vec<HostInfo>,
}

/// AOSP `proto/adb_known_hosts.proto` HostInfo.
#[derive(Clone, PartialEq, prost::Message)]
struct HostInfo {
    #[prost(string, tag = "1")]
    guid: String,
}

/// The file's name in `~/.android`.
pub const KNOWN_HOSTS_FILE: &str = "adb_known_hosts.pb";

/// A known-hosts file; every call reads it anew, as adb does, so that a
/// pairing made by another process counts at once.
#[derive(Debug, Clone)]
pub struct KnownHosts {
    path: PathBuf,
}

impl KnownHosts {
    /// `~/.android/adb_known_hosts.pb`.
    pub fn load_default() -> Result<KnownHosts, KeyError> {
        Ok(KnownHosts::at(
            crate::default_android_dir()?.join(KNOWN_HOSTS_FILE),
        ))
    }

    pub fn at(path: impl Into<PathBuf>) -> KnownHosts {
        KnownHosts { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GUIDs recorded, oldest first; none when the file is missing.
    pub fn guids(&self) -> Result<Vec<String>, KeyError> {
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(cause) => {
                return Err(KeyError::Io {
                    path: self.path.clone(),
                    action: "read",
                    cause,
                })
            }
        };
        decode(&bytes).map_err(|reason| KeyError::KnownHosts {
            path: self.path.clone(),
            reason,
        })
    }

    /// Whether the device announcing `instance` was paired with. adb
    /// compares prefixes: a responder that re-announces too early gets
    /// ` (2)` added to its name by the mDNS stack (AOSP IsKnownHost).
    /// An unreadable file counts as no pairing (and is logged).
    pub fn is_known(&self, instance: &str) -> bool {
        match self.guids() {
            Ok(guids) => guids
                .iter()
                .any(|guid| !guid.is_empty() && instance.starts_with(guid.as_str())),
            Err(error) => {
                tracing::warn!(%error, "known hosts unreadable");
                false
            }
        }
    }

    /// Records `guid` (once), writing beside the file and renaming over it
    /// so that a reader never sees half a file.
    pub fn add(&self, guid: &str) -> Result<(), KeyError> {
        let mut guids = self.guids()?;
        if guids.iter().any(|known| known == guid) {
            return Ok(());
        }
        guids.push(guid.to_string());
        let io = |action: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |cause| KeyError::Io {
                path,
                action,
                cause,
            }
        };
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(io("create", dir))?;
        }
        let mut temp = self.path.clone().into_os_string();
        temp.push(format!(".tmp.{}", std::process::id()));
        let temp = PathBuf::from(temp);
        std::fs::write(&temp, encode(&guids)).map_err(io("write", &temp))?;
        std::fs::rename(&temp, &self.path).map_err(|cause| {
            let _ = std::fs::remove_file(&temp);
            io("replace", &self.path)(cause)
        })
    }
}

fn encode(guids: &[String]) -> Vec<u8> {
    AdbKnownHosts {
        host_infos: guids
            .iter()
            .map(|guid| HostInfo { guid: guid.clone() })
            .collect(),
    }
    .encode_to_vec()
}

/// proto3: a HostInfo without the field has the empty GUID.
fn decode(bytes: &[u8]) -> Result<Vec<String>, String> {
    let hosts = AdbKnownHosts::decode(bytes).map_err(|e| e.to_string())?;
    Ok(hosts.host_infos.into_iter().map(|h| h.guid).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_is_adbs_protobuf() {
        // What protoc's encoder writes for two HostInfos.
        let bytes = encode(&["adb-A-x".into(), "g".into()]);
        assert_eq!(bytes, b"\x0a\x09\x0a\x07adb-A-x\x0a\x03\x0a\x01g".to_vec());
        assert_eq!(decode(&bytes).unwrap(), vec!["adb-A-x", "g"]);
        // Unknown fields are skipped; a long GUID takes a two-byte length.
        let long = "x".repeat(200);
        let mut with_unknown = vec![0x10, 0x05];
        with_unknown.extend(encode(std::slice::from_ref(&long)));
        assert_eq!(decode(&with_unknown).unwrap(), vec![long]);
        assert!(decode(b"\x0a\x05\x0a").is_err());
    }

    #[test]
    fn a_file_adb_wrote_is_rewritten_byte_for_byte() {
        // Two HostInfos as adb (and oxadb's earlier hand-written encoder)
        // write them, the second GUID long enough for a two-byte length.
        let long = "adb-".to_string() + &"y".repeat(196);
        let mut file = b"\x0a\x11\x0a\x0fadb-test-0xpair".to_vec();
        file.extend_from_slice(b"\x0a\xcb\x01\x0a\xc8\x01");
        file.extend_from_slice(long.as_bytes());
        let guids = decode(&file).unwrap();
        assert_eq!(guids, vec!["adb-test-0xpair".to_string(), long]);
        assert_eq!(encode(&guids), file);
    }

    #[test]
    fn added_guids_are_known_by_prefix_and_kept_once() {
        let dir = tempfile::tempdir().unwrap();
        let hosts = KnownHosts::at(dir.path().join("sub").join(KNOWN_HOSTS_FILE));
        assert!(hosts.guids().unwrap().is_empty());
        assert!(!hosts.is_known("adb-SER-abc123"));
        hosts.add("adb-SER-abc123").unwrap();
        hosts.add("adb-SER-abc123").unwrap();
        hosts.add("adb-OTHER-zzzzzz").unwrap();
        assert_eq!(
            hosts.guids().unwrap(),
            vec!["adb-SER-abc123", "adb-OTHER-zzzzzz"]
        );
        assert!(hosts.is_known("adb-SER-abc123"));
        assert!(hosts.is_known("adb-SER-abc123 (2)"));
        assert!(!hosts.is_known("adb-SER-abc12"));
        std::fs::write(hosts.path(), b"\x0a\x05\x0a").unwrap();
        assert!(hosts.guids().is_err());
        assert!(!hosts.is_known("adb-SER-abc123"));
    }
}
