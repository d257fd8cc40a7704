//! The host's reading of the device's side of a shell v2 stream
//! (`oxadb_wire::shell::DeviceOutputReader`): output, one exit status,
//! nothing after it.
//!
//! Input: one control byte, whose low four bits pick how many bytes arrive
//! per read (1 to 16), then the stream the device sends.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use oxadb_wire::shell::*;

fuzz_target!(|data: &[u8]| {
    let Some((&control, stream)) = data.split_first() else {
        return;
    };
    let piece = usize::from(control & 0x0f) + 1;
    let whole = read(stream, stream.len().max(1));
    let pieces = read(stream, piece);

    // What the host reads does not depend on how the bytes were split into
    // reads. Only the count of bytes after the exit packet can: it is what
    // had arrived when the error was found.
    assert_eq!(whole.outputs, pieces.outputs, "piece {piece}");
    match (&whole.error, &pieces.error) {
        (Some(DeviceOutputError::AfterExit(all)), Some(DeviceOutputError::AfterExit(first))) => {
            assert!(1 <= *first && first <= all, "piece {piece}");
        }
        (whole, pieces) => assert_eq!(whole, pieces, "piece {piece}"),
    }

    // Read at once, it is what the frames say.
    let (outputs, error) = model(stream);
    assert_eq!(whole.outputs, outputs);
    assert_eq!(whole.error, error);

    // Output re-encodes to frames of the stream, in order: nothing is made
    // up, only the host's own kinds and unknown ids are skipped (the model).
    let mut rest = stream;
    let mut left = &whole.outputs[..];
    while let (Some(output), Some((frame, after))) = (left.first(), next_frame(rest)) {
        let mut encoded = BytesMut::new();
        match output {
            DeviceOutput::Stdout(data) => {
                encode_frame(FrameId::Stdout, data, &mut encoded).unwrap()
            }
            DeviceOutput::Stderr(data) => {
                encode_frame(FrameId::Stderr, data, &mut encoded).unwrap()
            }
            DeviceOutput::Exit(status) => encoded.extend_from_slice(&exit_frame(*status)),
        }
        if encoded[..] == *frame {
            left = &left[1..];
        }
        rest = after;
    }
    assert!(left.is_empty(), "{left:?} is no frame of the stream");

    // At most one exit status, and nothing after it.
    let exits = whole
        .outputs
        .iter()
        .filter(|o| matches!(o, DeviceOutput::Exit(_)))
        .count();
    assert!(exits <= 1);
    if exits == 1 {
        assert!(matches!(whole.outputs.last(), Some(DeviceOutput::Exit(_))));
    }
});

/// What a reader handed out, and the error that stopped it.
#[derive(Debug)]
struct Read {
    outputs: Vec<DeviceOutput>,
    error: Option<DeviceOutputError>,
}

/// Feeds `stream` `piece` bytes at a time, taking out every output; an
/// error ends the stream, as it does for the host.
fn read(stream: &[u8], piece: usize) -> Read {
    let mut reader = DeviceOutputReader::new();
    let mut outputs = Vec::new();
    let mut fed = 0;
    for chunk in stream.chunks(piece) {
        reader.feed(chunk);
        fed += chunk.len();
        loop {
            match reader.next_output() {
                Ok(Some(output)) => {
                    assert!(!reader.exited() || matches!(output, DeviceOutput::Exit(_)));
                    if let Some(DeviceOutput::Exit(_)) = outputs.last() {
                        panic!("{output:?} after the exit status");
                    }
                    outputs.push(output);
                }
                Ok(None) => {
                    let held = reader.buffered();
                    assert!(
                        held <= HEADER_LEN + DEFAULT_MAX_PAYLOAD,
                        "{held} bytes held"
                    );
                    // What waits is the start of one frame, or nothing after
                    // the exit status.
                    let unread = &stream[fed - held..fed];
                    if reader.exited() {
                        assert_eq!(held, 0);
                    } else if held >= HEADER_LEN {
                        let len = u32::from_le_bytes(unread[1..5].try_into().unwrap()) as usize;
                        assert!(len <= DEFAULT_MAX_PAYLOAD && held < HEADER_LEN + len);
                    }
                    break;
                }
                Err(error) => {
                    // The stream cannot resynchronise: the error stays,
                    // whatever arrives after it.
                    assert_eq!(reader.next_output(), Err(error.clone()));
                    reader.feed(&[1, 0, 0, 0, 0]);
                    assert_eq!(reader.next_output(), Err(error.clone()));
                    return Read {
                        outputs,
                        error: Some(error),
                    };
                }
            }
        }
    }
    Read {
        outputs,
        error: None,
    }
}

/// The next whole frame's bytes and what follows them.
fn next_frame(stream: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = u32::from_le_bytes(stream.get(1..HEADER_LEN)?.try_into().unwrap()) as usize;
    (stream.len() >= HEADER_LEN + len).then(|| stream.split_at(HEADER_LEN + len))
}

/// The stream as adb's read_and_dump (client/commandline.cpp) reads it,
/// stricter where adb guesses: stdout (1) and stderr (2) are output; exit
/// (3) carries the status in its one byte (adb takes the first byte of any
/// exit packet) and is the last packet (adb reads on, so a later packet
/// would still print or change the status); other ids are skipped; a
/// length over the limit is an error at its header.
fn model(mut stream: &[u8]) -> (Vec<DeviceOutput>, Option<DeviceOutputError>) {
    let mut outputs = Vec::new();
    loop {
        if stream.len() < HEADER_LEN {
            return (outputs, None);
        }
        let len = u32::from_le_bytes(stream[1..HEADER_LEN].try_into().unwrap()) as usize;
        if len > DEFAULT_MAX_PAYLOAD {
            let error = ShellWireError::PayloadTooLarge {
                len: len as u64,
                max: DEFAULT_MAX_PAYLOAD,
            };
            return (outputs, Some(DeviceOutputError::Frame(error)));
        }
        let Some((frame, rest)) = next_frame(stream) else {
            return (outputs, None);
        };
        let payload = bytes::Bytes::copy_from_slice(&frame[HEADER_LEN..]);
        stream = rest;
        match frame[0] {
            1 => outputs.push(DeviceOutput::Stdout(payload)),
            2 => outputs.push(DeviceOutput::Stderr(payload)),
            3 if len == 1 => {
                outputs.push(DeviceOutput::Exit(payload[0]));
                let error = (!rest.is_empty()).then_some(DeviceOutputError::AfterExit(rest.len()));
                return (outputs, error);
            }
            3 => return (outputs, Some(DeviceOutputError::ExitLength(len))),
            _ => {}
        }
    }
}
