//! `framebuffer:`: the screen as DDMS's raw image, version 2 (AOSP
//! `daemon/framebuffer_service.cpp`): a header of 14 little-endian u32
//! (version 2, bpp, colour space, size in bytes, width, height, then offset
//! and length of red, blue, green and alpha, in that order) and the pixels,
//! rows top to bottom without padding. adbd gets them from `screencap`;
//! here they come from a Linux framebuffer device (`/dev/fb0` by default),
//! its geometry and channel layout from `FBIOGET_VSCREENINFO` and
//! `FBIOGET_FSCREENINFO` (`linux/fb.h`), the visible area at the panning
//! offset.
//!
//! When there is no framebuffer, adbd closes the stream without a byte; we
//! send one line saying why instead (it cannot be taken for a header: it
//! does not start with version 1 or 2), then close.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use rustix::fs::{Mode, OFlags};
use thiserror::Error;
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// `DDMS_RAWIMAGE_VERSION` in adbd: the header with a colour space field.
pub const VERSION: u32 = 2;
/// The header's size: 14 u32.
pub const HEADER_LEN: usize = 14 * 4;
/// Rows are read and sent in batches of about this many bytes.
const BATCH: usize = 256 * 1024;

#[derive(Debug, Error)]
pub enum FramebufferError {
    #[error("framebuffer: cannot open {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("framebuffer: {path} is not a framebuffer ({ioctl} failed: {source})")]
    Ioctl {
        path: PathBuf,
        ioctl: &'static str,
        source: io::Error,
    },
    #[error("framebuffer: {path}: {message}")]
    Unsupported { path: PathBuf, message: String },
    #[error("framebuffer: reading {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
}

/// One colour channel: its lowest bit and its width in bits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Channel {
    pub offset: u32,
    pub length: u32,
}

/// What the header says and where the pixels are in the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    pub width: u32,
    pub height: u32,
    pub bpp: u32,
    pub red: Channel,
    pub green: Channel,
    pub blue: Channel,
    pub alpha: Channel,
    /// Bytes from one row's start to the next's in the device.
    pub line_length: u32,
    /// Byte offset of the visible area's first pixel (the panning offset).
    pub start: u64,
}

impl Geometry {
    fn row_bytes(&self) -> usize {
        self.width as usize * (self.bpp as usize / 8)
    }

    /// The header adbd sends before the pixels.
    pub fn header(&self) -> [u8; HEADER_LEN] {
        let size = self.row_bytes() as u32 * self.height;
        let fields = [
            VERSION,
            self.bpp,
            0, // colour space: unknown (screencap's would be sRGB or P3)
            size,
            self.width,
            self.height,
            self.red.offset,
            self.red.length,
            self.blue.offset,
            self.blue.length,
            self.green.offset,
            self.green.length,
            self.alpha.offset,
            self.alpha.length,
        ];
        let mut header = [0u8; HEADER_LEN];
        for (slot, value) in header.chunks_exact_mut(4).zip(fields) {
            slot.copy_from_slice(&value.to_le_bytes());
        }
        header
    }
}

// `struct fb_bitfield`, `fb_var_screeninfo` and `fb_fix_screeninfo` from
// linux/fb.h (uapi), field for field.
#[repr(C)]
#[derive(Clone, Copy)]
struct FbBitfield {
    offset: u32,
    length: u32,
    msb_right: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct FbVarScreeninfo {
    xres: u32,
    yres: u32,
    xres_virtual: u32,
    yres_virtual: u32,
    xoffset: u32,
    yoffset: u32,
    bits_per_pixel: u32,
    grayscale: u32,
    red: FbBitfield,
    green: FbBitfield,
    blue: FbBitfield,
    transp: FbBitfield,
    nonstd: u32,
    activate: u32,
    height: u32,
    width: u32,
    accel_flags: u32,
    timing: [u32; 11],
    reserved: [u32; 4],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct FbFixScreeninfo {
    id: [u8; 16],
    smem_start: libc::c_ulong,
    smem_len: u32,
    kind: u32,
    type_aux: u32,
    visual: u32,
    xpanstep: u16,
    ypanstep: u16,
    ywrapstep: u16,
    line_length: u32,
    mmio_start: libc::c_ulong,
    mmio_len: u32,
    accel: u32,
    capabilities: u16,
    reserved: [u16; 2],
}

const FBIOGET_VSCREENINFO: rustix::ioctl::Opcode = 0x4600;
const FBIOGET_FSCREENINFO: rustix::ioctl::Opcode = 0x4602;

/// Opens `path` and reads its geometry.
pub fn open(path: &Path) -> Result<(std::fs::File, Geometry), FramebufferError> {
    let fd: OwnedFd = rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|errno| FramebufferError::Open {
            path: path.to_path_buf(),
            source: errno.into(),
        })?;
    let ioctl_error = |ioctl, errno: rustix::io::Errno| FramebufferError::Ioctl {
        path: path.to_path_buf(),
        ioctl,
        source: errno.into(),
    };
    // SAFETY: both opcodes write exactly the struct named (linux/fb.h), and
    // the structs mirror the kernel's layout.
    let var = unsafe {
        rustix::ioctl::ioctl(
            fd.as_fd(),
            rustix::ioctl::Getter::<FBIOGET_VSCREENINFO, FbVarScreeninfo>::new(),
        )
    }
    .map_err(|errno| ioctl_error("FBIOGET_VSCREENINFO", errno))?;
    // SAFETY: as above.
    let fix = unsafe {
        rustix::ioctl::ioctl(
            fd.as_fd(),
            rustix::ioctl::Getter::<FBIOGET_FSCREENINFO, FbFixScreeninfo>::new(),
        )
    }
    .map_err(|errno| ioctl_error("FBIOGET_FSCREENINFO", errno))?;
    let geometry = geometry(&var, &fix).map_err(|message| FramebufferError::Unsupported {
        path: path.to_path_buf(),
        message,
    })?;
    Ok((std::fs::File::from(fd), geometry))
}

fn geometry(var: &FbVarScreeninfo, fix: &FbFixScreeninfo) -> Result<Geometry, String> {
    let bpp = var.bits_per_pixel;
    if !matches!(bpp, 8 | 16 | 24 | 32) {
        return Err(format!(
            "{bpp} bits per pixel: only whole bytes per pixel (8, 16, 24, 32) can be sent"
        ));
    }
    if var.xres == 0 || var.yres == 0 {
        return Err(format!("the mode is {}x{}", var.xres, var.yres));
    }
    let line_length = if fix.line_length != 0 {
        fix.line_length
    } else {
        var.xres_virtual * bpp / 8
    };
    let channel = |field: &FbBitfield| Channel {
        offset: field.offset,
        length: field.length,
    };
    let start = u64::from(var.yoffset) * u64::from(line_length)
        + u64::from(var.xoffset) * u64::from(bpp / 8);
    Ok(Geometry {
        width: var.xres,
        height: var.yres,
        bpp,
        red: channel(&var.red),
        green: channel(&var.green),
        blue: channel(&var.blue),
        alpha: channel(&var.transp),
        line_length,
        start,
    })
}

/// Serves one `framebuffer:` stream from the device at `path`.
pub async fn serve<W: AsyncWrite + Unpin>(mut stream: W, path: &Path) -> io::Result<()> {
    let opened = {
        let path = path.to_path_buf();
        tokio::task::spawn_blocking(move || open(&path))
            .await
            .map_err(io::Error::other)?
    };
    let (file, geometry) = match opened {
        Ok(opened) => opened,
        Err(error) => {
            tracing::warn!(%error, "framebuffer unavailable");
            stream.write_all(format!("{error}\n").as_bytes()).await?;
            return stream.shutdown().await;
        }
    };
    tracing::debug!(
        width = geometry.width,
        height = geometry.height,
        bpp = geometry.bpp,
        "framebuffer"
    );
    stream.write_all(&geometry.header()).await?;
    // Rows are read by a blocking thread, a couple of batches ahead.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Bytes, FramebufferError>>(2);
    let reader_path = path.to_path_buf();
    let reader = tokio::task::spawn_blocking(move || {
        for batch in read_rows(&file, &geometry, &reader_path) {
            let failed = batch.is_err();
            if tx.blocking_send(batch).is_err() || failed {
                return;
            }
        }
    });
    while let Some(batch) = rx.recv().await {
        match batch {
            Ok(bytes) => stream.write_all(&bytes).await?,
            Err(error) => {
                // The header promised more; a short image is all a client can be told.
                tracing::warn!(%error, "framebuffer read failed; closing the stream");
                break;
            }
        }
    }
    drop(rx);
    let _ = reader.await;
    stream.shutdown().await
}

/// The visible rows, packed, in batches of about [`BATCH`] bytes.
fn read_rows<'a>(
    file: &'a std::fs::File,
    geometry: &'a Geometry,
    path: &'a Path,
) -> impl Iterator<Item = Result<Bytes, FramebufferError>> + 'a {
    let row = geometry.row_bytes();
    let rows_per_batch = (BATCH / row).max(1) as u32;
    (0..geometry.height)
        .step_by(rows_per_batch as usize)
        .map(move |first| {
            let rows = rows_per_batch.min(geometry.height - first);
            let mut batch = vec![0u8; row * rows as usize];
            for (index, out) in batch.chunks_exact_mut(row).enumerate() {
                let offset = geometry.start
                    + u64::from(first + index as u32) * u64::from(geometry.line_length);
                file.read_exact_at(out, offset)
                    .map_err(|source| FramebufferError::Read {
                        path: path.to_path_buf(),
                        source,
                    })?;
            }
            Ok(Bytes::from(batch))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_structs_have_the_kernels_sizes() {
        assert_eq!(std::mem::size_of::<FbVarScreeninfo>(), 160);
        #[cfg(target_pointer_width = "64")]
        assert_eq!(std::mem::size_of::<FbFixScreeninfo>(), 80);
        #[cfg(target_pointer_width = "32")]
        assert_eq!(std::mem::size_of::<FbFixScreeninfo>(), 68);
    }

    #[test]
    fn the_header_is_adbds_version_2_layout() {
        let geometry = Geometry {
            width: 3,
            height: 2,
            bpp: 32,
            red: Channel {
                offset: 16,
                length: 8,
            },
            green: Channel {
                offset: 8,
                length: 8,
            },
            blue: Channel {
                offset: 0,
                length: 8,
            },
            alpha: Channel {
                offset: 24,
                length: 8,
            },
            line_length: 64,
            start: 0,
        };
        let header = geometry.header();
        let fields: Vec<u32> = header
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        // version, bpp, colour space, size, width, height, red, blue, green, alpha
        assert_eq!(
            fields,
            [2, 32, 0, 24, 3, 2, 16, 8, 0, 8, 8, 8, 24, 8],
            "{fields:?}"
        );
    }

    #[test]
    fn rows_are_packed_from_the_panning_offset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fb");
        // 4 rows of 8 bytes in the device, 2x2 visible 16-bit pixels from row 1, byte 2.
        let device: Vec<u8> = (0..32).collect();
        std::fs::write(&path, &device).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let geometry = Geometry {
            width: 2,
            height: 2,
            bpp: 16,
            red: Channel::default(),
            green: Channel::default(),
            blue: Channel::default(),
            alpha: Channel::default(),
            line_length: 8,
            start: 8 + 2,
        };
        let got: Vec<u8> = read_rows(&file, &geometry, &path)
            .flat_map(|batch| batch.unwrap().to_vec())
            .collect();
        assert_eq!(got, [10, 11, 12, 13, 18, 19, 20, 21]);
    }

    #[test]
    fn a_missing_device_or_a_plain_file_is_named_with_the_cause() {
        let error = open(Path::new("/nonexistent/fb0")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "framebuffer: cannot open /nonexistent/fb0: No such file or directory (os error 2)"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plain");
        std::fs::write(&path, b"x").unwrap();
        let error = open(&path).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "framebuffer: {} is not a framebuffer (FBIOGET_VSCREENINFO failed: \
                 Inappropriate ioctl for device (os error 25))",
                path.display()
            )
        );
    }
}
