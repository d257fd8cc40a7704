//! The compressed streams of SND2/RCV2, as AOSP's adb and adbd produce and
//! expect them (`compression_utils.h`): one brotli stream (quality 1, window
//! 22), one LZ4 *frame* (LZ4F, 64 KiB blocks), one zstd frame (level 1). Both
//! roles build their encoders and decoders here so they cannot drift apart.
//! The codecs come from the `brotli`, `lz4_flex` and `zstd` crates.

use std::io::{self, BufRead, Read, Write};

use crate::sync::Compression;

/// adb's and adbd's level for brotli and zstd.
pub const LEVEL: u32 = 1;
/// Brotli's default window (`lgwin`), which adb keeps.
pub const BROTLI_WINDOW_BITS: u32 = 22;
/// Buffer of the brotli encoder and decoder.
const BROTLI_BUFFER: usize = 64 * 1024;

/// A compressing writer; [`Encoder::finish`] ends the stream and returns the sink.
pub enum Encoder<W: Write> {
    Brotli(Box<brotli::CompressorWriter<W>>),
    Lz4(lz4_flex::frame::FrameEncoder<W>),
    Zstd(zstd::stream::write::Encoder<'static, W>),
}

impl<W: Write> Encoder<W> {
    /// `compression` must not be `None` (plain data needs no encoder).
    pub fn new(compression: Compression, sink: W) -> io::Result<Encoder<W>> {
        Ok(match compression {
            Compression::Brotli => Encoder::Brotli(Box::new(brotli::CompressorWriter::new(
                sink,
                BROTLI_BUFFER,
                LEVEL,
                BROTLI_WINDOW_BITS,
            ))),
            Compression::Lz4 => {
                let info = lz4_flex::frame::FrameInfo::new()
                    .block_size(lz4_flex::frame::BlockSize::Max64KB);
                Encoder::Lz4(lz4_flex::frame::FrameEncoder::with_frame_info(info, sink))
            }
            Compression::Zstd => {
                Encoder::Zstd(zstd::stream::write::Encoder::new(sink, LEVEL as i32)?)
            }
            Compression::None => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "no encoder for uncompressed data",
                ))
            }
        })
    }

    /// The sink, e.g. to check a flag it set while the encoder wrote to it.
    pub fn get_ref(&self) -> &W {
        match self {
            Encoder::Brotli(encoder) => encoder.get_ref(),
            Encoder::Lz4(encoder) => encoder.get_ref(),
            Encoder::Zstd(encoder) => encoder.get_ref(),
        }
    }

    /// Ends the compressed stream. Brotli's `into_inner` cannot report a sink
    /// error; callers that need to know check the sink itself.
    pub fn finish(self) -> io::Result<W> {
        match self {
            Encoder::Brotli(encoder) => Ok(encoder.into_inner()),
            Encoder::Lz4(encoder) => encoder.finish().map_err(io::Error::other),
            Encoder::Zstd(encoder) => encoder.finish(),
        }
    }
}

impl<W: Write> Write for Encoder<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        match self {
            Encoder::Brotli(encoder) => encoder.write(data),
            Encoder::Lz4(encoder) => encoder.write(data),
            Encoder::Zstd(encoder) => encoder.write(data),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Encoder::Brotli(encoder) => encoder.flush(),
            Encoder::Lz4(encoder) => encoder.flush(),
            Encoder::Zstd(encoder) => encoder.flush(),
        }
    }
}

/// A decompressing reader over `input` for one stream or frame (zstd: a
/// single frame, as adbd reads it). LZ4 and zstd stop reading at its end, so
/// the caller can check that nothing follows; brotli's decoder reads ahead
/// into its own buffer, so a sync stream is ended by DONE, not by the reader.
/// `compression` must not be `None`.
pub fn decoder<'a, R: BufRead + 'a>(
    compression: Compression,
    input: R,
) -> io::Result<Box<dyn Read + 'a>> {
    Ok(match compression {
        Compression::Brotli => Box::new(brotli::Decompressor::new(input, BROTLI_BUFFER)),
        Compression::Lz4 => Box::new(lz4_flex::frame::FrameDecoder::new(input)),
        Compression::Zstd => {
            Box::new(zstd::stream::read::Decoder::with_buffer(input)?.single_frame())
        }
        Compression::None => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no decoder for uncompressed data",
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_stops_at_the_end_of_the_stream() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 97) as u8).collect();
        for compression in [Compression::Brotli, Compression::Lz4, Compression::Zstd] {
            let mut encoder = Encoder::new(compression, Vec::new()).unwrap();
            encoder.write_all(&data).unwrap();
            let mut stream = encoder.finish().unwrap();
            assert!(
                stream.len() < data.len() / 4,
                "{compression:?} did not compress"
            );
            stream.extend_from_slice(b"TRAILER");
            let mut input = &stream[..];
            let mut decoded = Vec::new();
            decoder(compression, &mut input)
                .unwrap()
                .read_to_end(&mut decoded)
                .unwrap();
            assert_eq!(decoded, data, "{compression:?}");
            if compression != Compression::Brotli {
                assert_eq!(input, b"TRAILER", "{compression:?} read past its stream");
            }
        }
        assert!(Encoder::new(Compression::None, Vec::new()).is_err());
    }
}
