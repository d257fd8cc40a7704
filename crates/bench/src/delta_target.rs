//! The device's copy of the image in the delta benchmark: a regular file
//! (in the work directory, tmpfs by default), a block device standing for
//! a board's partition: a loop device over a file on disk, with direct I/O
//! so that nothing of it stays in the page cache but its own pages, which
//! are dropped before every transfer, or a regular file on XFS (reflinks)
//! made on such a loop device, its pages dropped too. A partition the
//! board has not read since boot is not in memory either, and reading it
//! is what a delta onto a target without an index pays for (docs/delta.md,
//! "The device's index").

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Context, Result};

use crate::emulator;

/// `BLKFLSBUF` (linux/fs.h): write back and drop a block device's cache.
const BLKFLSBUF: libc::c_ulong = 0x1261;

pub(crate) enum DeviceTarget {
    File(PathBuf),
    BlockDevice(LoopDevice),
    /// A file on XFS, where `copy_file_range` shares blocks: a delta
    /// rebuilds it beside itself without copying the unchanged ones.
    ReflinkFile(XfsVolume),
}

impl DeviceTarget {
    /// The path the transfers write to.
    pub(crate) fn path(&self) -> PathBuf {
        match self {
            DeviceTarget::File(path) => path.clone(),
            DeviceTarget::BlockDevice(device) => PathBuf::from(&device.node),
            DeviceTarget::ReflinkFile(volume) => volume.file(),
        }
    }

    pub(crate) fn is_block_device(&self) -> bool {
        matches!(self, DeviceTarget::BlockDevice(_))
    }

    /// Puts `image` there, as nothing has read it since: a fresh file (a
    /// new inode and ctime, so no index fits it), or the image written
    /// over the device (its write count moves, so no index fits it either)
    /// and the device's cache dropped.
    pub(crate) fn reset_to(&self, image: &Path) -> Result<()> {
        match self {
            DeviceTarget::File(path) => {
                let _ = std::fs::remove_file(path);
                std::fs::copy(image, path).with_context(|| {
                    format!("copying {} to {}", image.display(), path.display())
                })?;
                Ok(())
            }
            DeviceTarget::BlockDevice(device) => {
                device.write(image)?;
                device.drop_cache()
            }
            DeviceTarget::ReflinkFile(volume) => {
                let path = volume.file();
                let _ = std::fs::remove_file(&path);
                std::fs::copy(image, &path).with_context(|| {
                    format!("copying {} to {}", image.display(), path.display())
                })?;
                volume.drop_cache()
            }
        }
    }

    /// Drops what the page cache holds of a block device (a file on tmpfs
    /// has nowhere else to be).
    pub(crate) fn drop_cache(&self) -> Result<()> {
        match self {
            DeviceTarget::File(_) => Ok(()),
            DeviceTarget::BlockDevice(device) => device.drop_cache(),
            DeviceTarget::ReflinkFile(volume) => volume.drop_cache(),
        }
    }
}

/// An XFS file system with reflinks on a [`LoopDevice`], mounted in the
/// work dir; unmounted on drop (and by the emulator's signal cleanup).
pub(crate) struct XfsVolume {
    mount: PathBuf,
    // Dropped after the unmount: detached, its backing file removed.
    _device: LoopDevice,
}

impl XfsVolume {
    /// A volume of `size` bytes over a new file in `disk_dir`, mounted at
    /// `mount` (made if missing).
    pub(crate) fn make(disk_dir: &Path, size: u64, mount: &Path) -> Result<XfsVolume> {
        let device = LoopDevice::attach(disk_dir, size)?;
        let made = Command::new("mkfs.xfs")
            .args(["-q", "-f", "-m", "reflink=1"])
            .arg(&device.node)
            .output()
            .context("running mkfs.xfs (Debian's xfsprogs package)")?;
        ensure!(
            made.status.success(),
            "mkfs.xfs {}: {}",
            device.node,
            String::from_utf8_lossy(&made.stderr)
        );
        std::fs::create_dir_all(mount)?;
        let mounted = Command::new("mount")
            .args(["-t", "xfs", "-o", "noatime"])
            .arg(&device.node)
            .arg(mount)
            .output()
            .context("running mount")?;
        ensure!(
            mounted.status.success(),
            "mount {} on {}: {}",
            device.node,
            mount.display(),
            String::from_utf8_lossy(&mounted.stderr)
        );
        emulator::register_mount(mount);
        Ok(XfsVolume {
            mount: mount.to_path_buf(),
            _device: device,
        })
    }

    fn file(&self) -> PathBuf {
        self.mount.join("rootfs.img")
    }

    /// Writes the file back and drops its pages (`POSIX_FADV_DONTNEED`):
    /// the next delta reads it from disk.
    fn drop_cache(&self) -> Result<()> {
        let path = self.file();
        let Ok(file) = File::open(&path) else {
            return Ok(());
        };
        file.sync_all()?;
        // SAFETY: advice on a descriptor we own, over the whole file.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        ensure!(
            rc == 0,
            "posix_fadvise on {}: {}",
            path.display(),
            std::io::Error::from_raw_os_error(rc)
        );
        Ok(())
    }
}

impl Drop for XfsVolume {
    fn drop(&mut self) {
        emulator::unmount(&self.mount);
        let _ = std::fs::remove_dir(&self.mount);
    }
}

/// A loop device over a file of its own, detached and removed on drop (and
/// by the emulator's signal cleanup).
pub(crate) struct LoopDevice {
    node: String,
    backing: PathBuf,
}

impl LoopDevice {
    /// A loop device of `size` bytes over a new file in `dir`, which should
    /// be on a disk (not tmpfs: direct I/O and a cold cache mean nothing there).
    pub(crate) fn attach(dir: &Path, size: u64) -> Result<LoopDevice> {
        std::fs::create_dir_all(dir)?;
        let backing = dir.join(format!("oxadb-bench-delta-{}.disk", std::process::id()));
        ensure!(!backing.exists(), "{} already exists", backing.display());
        File::create(&backing)
            .and_then(|file| file.set_len(size))
            .with_context(|| format!("creating {}", backing.display()))?;
        emulator::register_path(&backing);
        let output = Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on"])
            .arg(&backing)
            .output()
            .context("running losetup (Debian's mount package)")?;
        if !output.status.success() {
            let _ = std::fs::remove_file(&backing);
            emulator::forget_path(&backing);
            anyhow::bail!(
                "losetup {}: {}",
                backing.display(),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let node = String::from_utf8_lossy(&output.stdout).trim().to_string();
        emulator::register_loop_device(&node);
        Ok(LoopDevice { node, backing })
    }

    fn write(&self, image: &Path) -> Result<()> {
        let mut from = File::open(image)?;
        let mut to = OpenOptions::new().write(true).open(&self.node)?;
        std::io::copy(&mut from, &mut to)
            .with_context(|| format!("writing {} onto {}", image.display(), self.node))?;
        to.sync_all()?;
        Ok(())
    }

    fn drop_cache(&self) -> Result<()> {
        let device = File::open(&self.node)?;
        // SAFETY: an ioctl without arguments on a descriptor we own.
        let rc = unsafe { libc::ioctl(device.as_raw_fd(), BLKFLSBUF) };
        ensure!(
            rc == 0,
            "BLKFLSBUF on {}: {}",
            self.node,
            std::io::Error::last_os_error()
        );
        Ok(())
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        emulator::detach_loop_device(&self.node);
        let _ = std::fs::remove_file(&self.backing);
        emulator::forget_path(&self.backing);
    }
}
