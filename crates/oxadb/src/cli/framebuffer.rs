//! `oxadb framebuffer FILE`: the device's screen (`framebuffer:`, DDMS's raw
//! image as AOSP's `daemon/framebuffer_service.cpp` sends it) as a binary
//! PPM image.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context};
use oxadb::DeviceService;

use super::endpoint::Endpoint;
use tokio::io::AsyncReadExt;

#[derive(Debug, clap::Args)]
pub struct FramebufferArgs {
    /// Where to write the image (binary PPM, P6); `-` for stdout.
    #[arg(value_name = "FILE")]
    file: PathBuf,
}

/// The header's fields: version 1 lacks the colour space, version 2 has it.
#[derive(Debug, PartialEq, Eq)]
struct Header {
    bpp: u32,
    size: u32,
    width: u32,
    height: u32,
    /// (offset, length) of red, green, blue.
    channels: [(u32, u32); 3],
    len: usize,
}

fn parse_header(reply: &[u8]) -> Result<Header, String> {
    let word = |i: usize| -> Option<u32> {
        reply
            .get(4 * i..4 * i + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    };
    let skip = match word(0) {
        Some(1) => 0,
        Some(2) => 1,
        // Not a header: the daemon's words (oxadbd says why it has no framebuffer).
        _ => return Err(String::from_utf8_lossy(reply).trim_end().to_string()),
    };
    // Version 2 put the colour space after bpp; every later field moved by one.
    let field = |i: usize| word(if i < 2 { i } else { i + skip }).ok_or("the header ends early");
    let header = Header {
        bpp: field(1)?,
        size: field(2)?,
        width: field(3)?,
        height: field(4)?,
        // The wire order is red, blue, green.
        channels: [
            (field(5)?, field(6)?),
            (field(9)?, field(10)?),
            (field(7)?, field(8)?),
        ],
        len: 4 * (13 + skip),
    };
    let pixel_bytes = header.bpp as u64 / 8;
    if !matches!(header.bpp, 16 | 24 | 32)
        || u64::from(header.size)
            != u64::from(header.width) * u64::from(header.height) * pixel_bytes
        || header
            .channels
            .iter()
            .any(|&(offset, length)| length == 0 || length > 8 || offset + length > header.bpp)
    {
        return Err(format!("unsupported image: {header:?}"));
    }
    Ok(header)
}

/// One pixel's red, green and blue, scaled to 8 bits.
fn rgb(header: &Header, pixel: &[u8]) -> [u8; 3] {
    let mut word = [0u8; 4];
    word[..pixel.len()].copy_from_slice(pixel);
    let word = u32::from_le_bytes(word);
    header.channels.map(|(offset, length)| {
        let max = (1u32 << length) - 1;
        let value = (word >> offset) & max;
        (value * 255 / max) as u8
    })
}

pub async fn framebuffer(device: &Endpoint, args: &FramebufferArgs) -> anyhow::Result<i32> {
    let mut stream = device.open(&DeviceService::Framebuffer).await?;
    let mut reply = Vec::new();
    stream
        .read_to_end(&mut reply)
        .await
        .with_context(|| format!("{}: framebuffer:", device.serial()))?;
    let header = match parse_header(&reply) {
        Ok(header) => header,
        Err(message) if message.is_empty() => {
            bail!(
                "{}: framebuffer: the device closed the stream without an image",
                device.serial()
            )
        }
        Err(message) => bail!("{}: {message}", device.serial()),
    };
    let pixels = &reply[header.len..];
    if pixels.len() != header.size as usize {
        bail!(
            "{}: framebuffer: {} pixel bytes for a {}x{} image of {} bytes",
            device.serial(),
            pixels.len(),
            header.width,
            header.height,
            header.size
        );
    }
    let mut image = format!("P6\n{} {}\n255\n", header.width, header.height).into_bytes();
    image.reserve(3 * (header.width * header.height) as usize);
    for pixel in pixels.chunks_exact(header.bpp as usize / 8) {
        image.extend_from_slice(&rgb(&header, pixel));
    }
    if args.file.as_os_str() == "-" {
        std::io::stdout()
            .write_all(&image)
            .context("writing to stdout")?;
    } else {
        std::fs::write(&args.file, &image)
            .with_context(|| format!("writing {}", args.file.display()))?;
        eprintln!(
            "{}: {}x{}, {} bpp",
            args.file.display(),
            header.width,
            header.height,
            header.bpp
        );
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(fields: &[u32], pixels: &[u8]) -> Vec<u8> {
        let mut out: Vec<u8> = fields.iter().flat_map(|f| f.to_le_bytes()).collect();
        out.extend_from_slice(pixels);
        out
    }

    #[test]
    fn version_2_headers_and_rgb565_pixels_decode() {
        // adbd's RGB_565: red 11/5, green 5/6, blue 0/5 (wire order red, blue, green).
        let data = reply(&[2, 16, 0, 4, 2, 1, 11, 5, 0, 5, 5, 6, 0, 0], &[]);
        let header = parse_header(&data).unwrap();
        assert_eq!(header.len, 56);
        assert_eq!(header.channels, [(11, 5), (5, 6), (0, 5)]);
        assert_eq!(rgb(&header, &0xf800u16.to_le_bytes()), [255, 0, 0]);
        assert_eq!(rgb(&header, &0x07e0u16.to_le_bytes()), [0, 255, 0]);
        assert_eq!(rgb(&header, &0x001fu16.to_le_bytes()), [0, 0, 255]);
    }

    #[test]
    fn version_1_has_no_colour_space() {
        let data = reply(&[1, 32, 8, 2, 1, 16, 8, 0, 8, 8, 8, 24, 8], &[]);
        let header = parse_header(&data).unwrap();
        assert_eq!(header.len, 52);
        assert_eq!(header.channels, [(16, 8), (8, 8), (0, 8)]);
        assert_eq!(rgb(&header, &[1, 2, 3, 4]), [3, 2, 1]);
    }

    #[test]
    fn words_are_the_daemons_error() {
        let text = b"framebuffer: cannot open /dev/fb0: No such file or directory (os error 2)\n";
        assert_eq!(
            parse_header(text).unwrap_err(),
            "framebuffer: cannot open /dev/fb0: No such file or directory (os error 2)"
        );
        let short = reply(&[2, 32, 0], &[]);
        assert_eq!(parse_header(&short).unwrap_err(), "the header ends early");
    }
}
