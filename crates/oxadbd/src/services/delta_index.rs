//! The block digests of images a delta built, kept in the state directory
//! so that the next delta onto the same target sends them without reading
//! the image again (docs/delta.md, "The device's index"). An index is used
//! only while its key still describes the target: for a regular file its
//! inode, size, mtime and ctime (any write moves the ctime, and nobody can
//! set it back); for a block device its size, the boot, its medium (the
//! disk sequence number) and the sectors the kernel has written to it
//! (/sys/dev/block/M:N/stat), which any write that reached it moves. Whatever the index says,
//! the end check compares the built image's digest with the host's, and a
//! mismatch removes the index.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use oxadb_delta::{BlockDigest, BlockSize, DIGEST_LEN};

const MAGIC: &[u8; 8] = b"OXDIDX1\n";

/// What must not have changed for an index to be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexKey {
    pub device: u64,
    pub inode: u64,
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
    pub block_size: u32,
    /// Block devices: what says nothing else wrote to it.
    pub written: Option<DeviceWrites>,
}

impl IndexKey {
    /// The key of the regular file or block device `file` as it is now; `None` for a block device whose write count cannot be
    /// read (no index then).
    pub fn of(file: &File, block_size: BlockSize, size: u64) -> io::Result<Option<IndexKey>> {
        let metadata = file.metadata()?;
        let written = if metadata.file_type().is_file() {
            None
        } else {
            match DeviceWrites::of(metadata.rdev()) {
                Some(writes) => Some(writes),
                None => return Ok(None),
            }
        };
        let nanos = |secs: i64, nsec: i64| i128::from(secs) * 1_000_000_000 + i128::from(nsec);
        Ok(Some(IndexKey {
            device: metadata.dev(),
            inode: metadata.ino(),
            size,
            mtime_ns: nanos(metadata.mtime(), metadata.mtime_nsec()),
            ctime_ns: nanos(metadata.ctime(), metadata.ctime_nsec()),
            block_size: block_size.bytes(),
            written,
        }))
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.device.to_le_bytes());
        out.extend_from_slice(&self.inode.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.mtime_ns.to_le_bytes());
        out.extend_from_slice(&self.ctime_ns.to_le_bytes());
        out.extend_from_slice(&self.block_size.to_le_bytes());
        let writes = self.written.unwrap_or(DeviceWrites {
            boot: [0; 16],
            disk_sequence: u64::MAX,
            sectors: u64::MAX,
        });
        out.push(u8::from(self.written.is_some()));
        out.extend_from_slice(&writes.boot);
        out.extend_from_slice(&writes.disk_sequence.to_le_bytes());
        out.extend_from_slice(&writes.sectors.to_le_bytes());
    }

    const ENCODED_LEN: usize = 8 * 3 + 16 * 2 + 4 + 1 + 16 + 8 + 8;
}

/// A block device's medium and what was written to it: the same boot,
/// the same medium (the disk sequence number Linux 5.15 and later give
/// each disk and bump when its medium changes, as when a loop device is
/// attached to another file, or a card is swapped), and the same count of
/// sectors written since the medium came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceWrites {
    boot: [u8; 16],
    disk_sequence: u64,
    sectors: u64,
}

impl DeviceWrites {
    /// `None` where the kernel does not say (then no index is kept).
    fn of(rdev: u64) -> Option<DeviceWrites> {
        let (major, minor) = (rustix::fs::major(rdev), rustix::fs::minor(rdev));
        let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
        let read = |path: PathBuf| std::fs::read_to_string(path).ok();
        // A partition's number is its disk's, one directory up.
        let disk_sequence = read(sys.join("diskseq"))
            .or_else(|| read(sys.join("../diskseq")))?
            .trim()
            .parse()
            .ok()?;
        // Sectors written: the seventh field (the kernel's Documentation/block/stat.rst).
        let sectors = read(sys.join("stat"))?
            .split_whitespace()
            .nth(6)?
            .parse()
            .ok()?;
        Some(DeviceWrites {
            boot: boot_id()?,
            disk_sequence,
            sectors,
        })
    }
}

fn boot_id() -> Option<[u8; 16]> {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let hex: String = text.trim().chars().filter(|c| *c != '-').collect();
    let mut id = [0u8; 16];
    for (i, byte) in id.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(id)
}

/// Where indexes are kept: one file per target path.
#[derive(Debug, Clone)]
pub struct IndexStore {
    dir: PathBuf,
}

impl IndexStore {
    pub fn new(dir: PathBuf) -> IndexStore {
        IndexStore { dir }
    }

    fn file_for(&self, target: &Path) -> PathBuf {
        let name = BlockDigest::of(target.as_os_str().as_encoded_bytes());
        let hex: String = name.0.iter().map(|b| format!("{b:02x}")).collect();
        self.dir.join(format!("{hex}.idx"))
    }

    /// The digests kept for `target`, if its key is still `key`.
    pub fn load(&self, target: &Path, key: &IndexKey) -> Option<Vec<BlockDigest>> {
        let mut bytes = Vec::new();
        File::open(self.file_for(target))
            .ok()?
            .read_to_end(&mut bytes)
            .ok()?;
        let mut expected = MAGIC.to_vec();
        key.encode(&mut expected);
        let rest = bytes.strip_prefix(expected.as_slice())?;
        let blocks = BlockSize::new(key.block_size)?.blocks_in(key.size) as usize;
        if rest.len() != blocks * DIGEST_LEN {
            return None;
        }
        Some(
            rest.chunks_exact(DIGEST_LEN)
                .map(|d| BlockDigest(d.try_into().expect("DIGEST_LEN bytes")))
                .collect(),
        )
    }

    /// Keeps `digests` for `target` under `key`, replacing what was there
    /// (a temporary file renamed into place: a reader never sees half).
    pub fn save(&self, target: &Path, key: &IndexKey, digests: &[BlockDigest]) -> io::Result<()> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        let mut bytes =
            Vec::with_capacity(MAGIC.len() + IndexKey::ENCODED_LEN + digests.len() * DIGEST_LEN);
        bytes.extend_from_slice(MAGIC);
        key.encode(&mut bytes);
        for digest in digests {
            bytes.extend_from_slice(&digest.0);
        }
        let path = self.file_for(target);
        let temp = path.with_extension(format!("tmp{}", std::process::id()));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temp)?;
        file.write_all(&bytes)?;
        std::fs::rename(&temp, &path)
    }

    /// Forgets `target`'s index (a delta onto it failed its check).
    pub fn remove(&self, target: &Path) {
        let _ = std::fs::remove_file(self.file_for(target));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_is_found_only_under_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = IndexStore::new(dir.path().join("delta-index"));
        let image = dir.path().join("image");
        std::fs::write(&image, vec![7u8; 10_000]).unwrap();
        let file = File::open(&image).unwrap();
        let key = IndexKey::of(&file, BlockSize::DEFAULT, 10_000)
            .unwrap()
            .unwrap();
        let digests: Vec<BlockDigest> = (0..3u8).map(|i| BlockDigest([i; DIGEST_LEN])).collect();
        store.save(&image, &key, &digests).unwrap();
        assert_eq!(store.load(&image, &key), Some(digests.clone()));
        // Another path, another key, or another block size: not found.
        assert_eq!(store.load(&dir.path().join("other"), &key), None);
        let changed = IndexKey {
            ctime_ns: key.ctime_ns + 1,
            ..key.clone()
        };
        assert_eq!(store.load(&image, &changed), None);
        let wider = IndexKey {
            block_size: 8192,
            ..key.clone()
        };
        assert_eq!(store.load(&image, &wider), None);
        // A write moves the ctime, so the key no longer matches.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::OpenOptions::new()
            .append(true)
            .open(&image)
            .unwrap()
            .write_all(b"x")
            .unwrap();
        let now = IndexKey::of(&file, BlockSize::DEFAULT, 10_000)
            .unwrap()
            .unwrap();
        assert_ne!(now, key);
        store.remove(&image);
        assert_eq!(store.load(&image, &key), None);
    }
}
