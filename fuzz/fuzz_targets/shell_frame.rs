//! Shell protocol v2: the frame decoder, the window-size payload and what
//! a `shell,...:` / `exec:` service name asks to run.
//!
//! Input: one control byte, then the stream. The control byte's low four bits
//! pick how many bytes arrive per read (1 to 16) and its top bit a small
//! payload limit, so that the limit check is reached with short inputs.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use oxadb_wire::service::DeviceService;
use oxadb_wire::shell::*;

fuzz_target!(|data: &[u8]| {
    let Some((&control, stream)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(control & 0x0f) + 1;
    let max_payload = if control & 0x80 != 0 {
        64
    } else {
        DEFAULT_MAX_PAYLOAD
    };

    // Frames do not depend on how the bytes were split into reads.
    let whole = decode(stream, stream.len().max(1), max_payload);
    let pieces = decode(stream, chunk, max_payload);
    assert_eq!(whole.frames, pieces.frames, "chunk {chunk}");
    assert_eq!(whole.error, pieces.error, "chunk {chunk}");

    // Encoding the frames gives back the bytes they were decoded from.
    let mut encoded = BytesMut::new();
    for frame in &whole.frames {
        assert!(frame.payload.len() <= max_payload);
        encode_frame(frame.id, &frame.payload, &mut encoded).unwrap();
        if let (FrameId::Exit, [status]) = (frame.id, &frame.payload[..]) {
            assert_eq!(
                exit_frame(*status),
                encoded[encoded.len() - HEADER_LEN - 1..]
            );
        }
        if frame.id == FrameId::WindowSizeChange {
            check_window_size(&frame.payload);
        }
    }
    assert_eq!(&encoded[..], &stream[..encoded.len()]);
    let rest = &stream[encoded.len()..];
    match &whole.error {
        // An over-long frame stops the stream where its header starts.
        Some(ShellWireError::PayloadTooLarge { len, max }) => {
            assert_eq!(*max, max_payload);
            assert_eq!(
                *len,
                u64::from(u32::from_le_bytes(rest[1..5].try_into().unwrap()))
            );
            assert!(*len > max_payload as u64);
        }
        Some(other) => panic!("the decoder can only fail on length: {other}"),
        // What is left is an incomplete frame.
        None => {
            assert_eq!(whole.buffered, rest.len());
            assert_eq!(pieces.buffered, rest.len());
            if rest.len() >= HEADER_LEN {
                let len = u32::from_le_bytes(rest[1..5].try_into().unwrap()) as usize;
                assert!(rest.len() < HEADER_LEN + len);
            }
        }
    }

    // The same bytes as the other two things the daemon parses from the host.
    check_window_size(stream);
    if let Ok(service) = std::str::from_utf8(stream) {
        check_service(service);
    }
});

#[derive(Debug)]
struct Decoded {
    frames: Vec<Frame>,
    error: Option<ShellWireError>,
    buffered: usize,
}

/// Feeds `stream` `chunk` bytes at a time, taking out every complete frame;
/// an error ends the stream, as it does for the daemon.
fn decode(stream: &[u8], chunk: usize, max_payload: usize) -> Decoded {
    let mut decoder = FrameDecoder::with_max_payload(max_payload);
    let mut frames = Vec::new();
    for piece in stream.chunks(chunk) {
        decoder.feed(piece);
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => break,
                Err(error) => {
                    // The error stays: the stream cannot resynchronise.
                    assert_eq!(decoder.next_frame(), Err(error.clone()));
                    return Decoded {
                        frames,
                        error: Some(error),
                        buffered: decoder.buffered(),
                    };
                }
            }
        }
    }
    Decoded {
        frames,
        error: None,
        buffered: decoder.buffered(),
    }
}

/// `ROWSxCOLS,XPIXELSxYPIXELS` as adbd's `sscanf("%dx%d,%dx%d")` reads it,
/// limited to non-negative numbers that fit a u16.
fn check_window_size(payload: &[u8]) {
    let got = WindowSize::parse(payload);
    let want = scan_window_size(payload);
    match (&got, want) {
        (Ok(size), Some(expected)) => {
            assert_eq!(*size, expected);
            assert_eq!(WindowSize::parse(&size.to_payload()).as_ref(), Ok(size));
            let text = size.to_payload();
            assert_eq!(
                WindowSize::parse(&text[..text.len() - 1]).as_ref(),
                Ok(size)
            );
        }
        (Err(ShellWireError::BadWindowSize(_)), None) => {}
        _ => panic!(
            "window size {:?}: sscanf reads {want:?}, WindowSize::parse gives {got:?}",
            String::from_utf8_lossy(payload)
        ),
    }
}

fn scan_window_size(mut s: &[u8]) -> Option<WindowSize> {
    let mut nums = [0u16; 4];
    for (i, sep) in [Some(b'x'), Some(b','), Some(b'x'), None]
        .into_iter()
        .enumerate()
    {
        // %d: C isspace, an optional sign, then at least one digit.
        while let [b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r', tail @ ..] = s {
            s = tail;
        }
        match s.first() {
            Some(b'+') => s = &s[1..],
            Some(b'-') => return None,
            _ => {}
        }
        let digits = s.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        let mut value: u32 = 0;
        for &d in &s[..digits] {
            value = value * 10 + u32::from(d - b'0');
            if value > u32::from(u16::MAX) {
                return None;
            }
        }
        nums[i] = value as u16;
        s = &s[digits..];
        // Separators in the format match themselves exactly.
        if let Some(sep) = sep {
            s = s.strip_prefix(&[sep])?;
        }
    }
    Some(WindowSize {
        rows: nums[0],
        cols: nums[1],
        x_pixels: nums[2],
        y_pixels: nums[3],
    })
}

/// A shell request means the same once its name is written out in full.
/// (The names themselves are fuzzed by the `service` target.)
fn check_service(service: &str) {
    let Some(request) = shell_request(service) else {
        return;
    };
    let after_colon = service.split_once(':').map(|(_, command)| command);
    assert_eq!(Some(request.command.as_str()), after_colon);
    let canonical = if service.starts_with("exec:") {
        assert_eq!(
            (request.protocol, request.mode, &request.term),
            (ShellProtocol::V1, ShellMode::Raw, &None)
        );
        format!("exec:{}", request.command)
    } else {
        assert!(service.starts_with("shell,") || service.starts_with("shell:"));
        let term = request.term.as_deref().unwrap_or("");
        assert!(!term.contains([',', ':']));
        format!(
            "shell{},{},TERM={term}:{}",
            if request.protocol == ShellProtocol::V2 {
                ",v2"
            } else {
                ""
            },
            if request.mode == ShellMode::Pty {
                "pty"
            } else {
                "raw"
            },
            request.command
        )
    };
    assert_eq!(
        shell_request(&canonical).as_ref(),
        Some(&request),
        "{service:?} written out as {canonical:?}"
    );
}

fn shell_request(service: &str) -> Option<ShellRequest> {
    DeviceService::parse(service)
        .ok()
        .and_then(ShellRequest::from_service)
}
