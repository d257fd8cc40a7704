//! Shell protocol v2 frames, and what a `shell:` / `exec:` request asks a
//! daemon to run (its name is parsed in `service.rs`). No I/O.
//!
//! A shell-protocol frame is a 1-byte id, a little-endian `u32` payload length
//! and the payload. The host sends stdin (0), close-stdin (4) and
//! window-size-change (5); the device sends stdout (1), stderr (2) and one
//! exit (3) frame whose single payload byte is the exit status.

use bytes::{Buf, Bytes, BytesMut};

use crate::service::DeviceService;
pub use crate::service::{ShellMode, ShellProtocol, ShellService};

/// Feature name a device advertises when it speaks shell protocol v2.
pub const FEATURE_SHELL_V2: &str = "shell_v2";

/// Size of a frame header: 1-byte id + 4-byte little-endian length.
pub const HEADER_LEN: usize = 5;

/// Default cap on a single incoming payload. adb's own buffers are 1 MiB
/// (`MAX_PAYLOAD`); anything far beyond that is a broken or hostile peer.
pub const DEFAULT_MAX_PAYLOAD: usize = 16 * 1024 * 1024;

/// Most a decoder reserves for a frame not yet arrived: adb's largest.
const RESERVE_AHEAD: usize = crate::MAX_PAYLOAD as usize;

/// Errors from this module.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShellWireError {
    #[error("shell frame payload of {len} bytes exceeds the limit of {max} bytes")]
    PayloadTooLarge { len: u64, max: usize },
    #[error("malformed window size {0:?} (expected ROWSxCOLS,XPIXELSxYPIXELS)")]
    BadWindowSize(String),
}

/// Frame ids of shell protocol v2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameId {
    Stdin,
    Stdout,
    Stderr,
    Exit,
    CloseStdin,
    WindowSizeChange,
    /// 255: AOSP's marker for an invalid/unknown packet.
    Invalid,
    /// Any other value; peers ignore these (room for future ids).
    Unknown(u8),
}

impl FrameId {
    pub const fn from_u8(b: u8) -> Self {
        match b {
            0 => FrameId::Stdin,
            1 => FrameId::Stdout,
            2 => FrameId::Stderr,
            3 => FrameId::Exit,
            4 => FrameId::CloseStdin,
            5 => FrameId::WindowSizeChange,
            255 => FrameId::Invalid,
            other => FrameId::Unknown(other),
        }
    }

    pub const fn as_u8(self) -> u8 {
        match self {
            FrameId::Stdin => 0,
            FrameId::Stdout => 1,
            FrameId::Stderr => 2,
            FrameId::Exit => 3,
            FrameId::CloseStdin => 4,
            FrameId::WindowSizeChange => 5,
            FrameId::Invalid => 255,
            FrameId::Unknown(b) => b,
        }
    }
}

impl From<u8> for FrameId {
    fn from(b: u8) -> Self {
        FrameId::from_u8(b)
    }
}

impl From<FrameId> for u8 {
    fn from(id: FrameId) -> Self {
        id.as_u8()
    }
}

/// One complete shell-protocol frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub id: FrameId,
    pub payload: Bytes,
}

/// Header for a frame of `id` carrying `len` payload bytes.
pub fn encode_header(id: FrameId, len: usize) -> Result<[u8; HEADER_LEN], ShellWireError> {
    let len32 = u32::try_from(len).map_err(|_| ShellWireError::PayloadTooLarge {
        len: len as u64,
        max: u32::MAX as usize,
    })?;
    let l = len32.to_le_bytes();
    Ok([id.as_u8(), l[0], l[1], l[2], l[3]])
}

/// Appends a complete frame (header + payload) to `dst`.
pub fn encode_frame(id: FrameId, payload: &[u8], dst: &mut BytesMut) -> Result<(), ShellWireError> {
    let header = encode_header(id, payload.len())?;
    dst.reserve(HEADER_LEN + payload.len());
    dst.extend_from_slice(&header);
    dst.extend_from_slice(payload);
    Ok(())
}

/// The exit frame: one payload byte holding the status.
pub fn exit_frame(status: u8) -> [u8; HEADER_LEN + 1] {
    [FrameId::Exit.as_u8(), 1, 0, 0, 0, status]
}

/// Incremental decoder: feed bytes in any chunking, take complete frames out.
#[derive(Debug)]
pub struct FrameDecoder {
    buf: BytesMut,
    max_payload: usize,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::with_max_payload(DEFAULT_MAX_PAYLOAD)
    }

    pub fn with_max_payload(max_payload: usize) -> Self {
        FrameDecoder {
            buf: BytesMut::new(),
            max_payload,
        }
    }

    /// Appends received bytes.
    pub fn feed(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The undecoded bytes, for reading into directly (e.g. `read_buf`).
    pub fn buffer_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Number of buffered, not yet decoded bytes.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Next complete frame, `Ok(None)` if more bytes are needed. A length over
    /// the limit is an error (and stays one: the stream cannot resynchronise).
    pub fn next_frame(&mut self) -> Result<Option<Frame>, ShellWireError> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let len = u32::from_le_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > self.max_payload {
            return Err(ShellWireError::PayloadTooLarge {
                len: len as u64,
                max: self.max_payload,
            });
        }
        if self.buf.len() < HEADER_LEN + len {
            // Room for the rest of this frame in one go, up to the frame adb
            // sends (`shell_protocol.h` kBufferSize, 1 MiB): a header that
            // announces 16 MiB gets its memory only as its bytes arrive.
            let rest = HEADER_LEN + len - self.buf.len();
            self.buf.reserve(rest.min(RESERVE_AHEAD));
            return Ok(None);
        }
        let id = FrameId::from_u8(self.buf[0]);
        self.buf.advance(HEADER_LEN);
        let payload = self.buf.split_to(len).freeze();
        Ok(Some(Frame { id, payload }))
    }
}

/// What the device's side of a shell v2 stream carries, as the host reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceOutput {
    Stdout(Bytes),
    Stderr(Bytes),
    /// The command's exit status; nothing follows it.
    Exit(u8),
}

/// Why the host cannot read the device's shell stream on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceOutputError {
    #[error(transparent)]
    Frame(#[from] ShellWireError),
    /// adbd sends the status as one byte; adb reads the first byte of any
    /// exit frame, even an empty one, and so reports a status nobody sent.
    #[error("exit packet of {0} bytes (an exit status is 1 byte)")]
    ExitLength(usize),
    #[error("{0} bytes after the exit packet")]
    AfterExit(usize),
}

/// The host's reading of the device's side of a shell v2 stream (AOSP
/// `client/commandline.cpp` read_and_dump): bytes in as they arrive,
/// output and one exit status out. Frames of the host's own kinds (stdin,
/// close-stdin, window size) and unknown ids are skipped, as adb skips
/// them; an error stays an error (the stream cannot resynchronise).
#[derive(Debug, Default)]
pub struct DeviceOutputReader {
    decoder: FrameDecoder,
    exited: bool,
    failed: Option<DeviceOutputError>,
}

impl DeviceOutputReader {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends received bytes.
    pub fn feed(&mut self, data: &[u8]) {
        self.decoder.feed(data);
    }

    /// Whether the exit status was read.
    pub fn exited(&self) -> bool {
        self.exited
    }

    /// Bytes held, not yet read as a frame: at most one frame's header and
    /// payload ([`DEFAULT_MAX_PAYLOAD`]) once [`DeviceOutputReader::next_output`]
    /// returned `Ok(None)`.
    pub fn buffered(&self) -> usize {
        self.decoder.buffered()
    }

    /// The next piece of output, `Ok(None)` until more bytes arrive.
    pub fn next_output(&mut self) -> Result<Option<DeviceOutput>, DeviceOutputError> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        let read = self.next_unchecked();
        if let Err(error) = &read {
            self.failed = Some(error.clone());
        }
        read
    }

    fn next_unchecked(&mut self) -> Result<Option<DeviceOutput>, DeviceOutputError> {
        loop {
            if self.exited {
                return match self.decoder.buffered() {
                    0 => Ok(None),
                    extra => Err(DeviceOutputError::AfterExit(extra)),
                };
            }
            let Some(frame) = self.decoder.next_frame()? else {
                return Ok(None);
            };
            return Ok(Some(match frame.id {
                FrameId::Stdout => DeviceOutput::Stdout(frame.payload),
                FrameId::Stderr => DeviceOutput::Stderr(frame.payload),
                FrameId::Exit => {
                    let [status] = frame.payload[..] else {
                        return Err(DeviceOutputError::ExitLength(frame.payload.len()));
                    };
                    self.exited = true;
                    DeviceOutput::Exit(status)
                }
                _ => continue,
            }));
        }
    }
}

/// Payload of a window-size-change frame: an ASCII `struct winsize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowSize {
    pub rows: u16,
    pub cols: u16,
    pub x_pixels: u16,
    pub y_pixels: u16,
}

impl WindowSize {
    /// Parses `ROWSxCOLS,XPIXELSxYPIXELS`. adb's client sends it NUL-terminated
    /// and adbd reads it with `sscanf("%dx%d,%dx%d")`, so like sscanf we allow
    /// leading white space (C's `isspace`) and a `+` before each number and
    /// ignore trailing bytes. Unlike sscanf we refuse negative numbers and
    /// numbers beyond `u16` rather than truncate them.
    pub fn parse(payload: &[u8]) -> Result<Self, ShellWireError> {
        let bad = || ShellWireError::BadWindowSize(String::from_utf8_lossy(payload).into_owned());
        let mut rest = payload;
        let mut nums = [0u16; 4];
        for (i, sep) in [Some(b'x'), Some(b','), Some(b'x'), None]
            .into_iter()
            .enumerate()
        {
            let (n, tail) = scan_u16(rest).ok_or_else(bad)?;
            nums[i] = n;
            rest = tail;
            if let Some(sep) = sep {
                rest = rest.strip_prefix(&[sep]).ok_or_else(bad)?;
            }
        }
        Ok(WindowSize {
            rows: nums[0],
            cols: nums[1],
            x_pixels: nums[2],
            y_pixels: nums[3],
        })
    }

    /// Payload as adb's client sends it (with the trailing NUL).
    pub fn to_payload(&self) -> Vec<u8> {
        let mut v = format!(
            "{}x{},{}x{}",
            self.rows, self.cols, self.x_pixels, self.y_pixels
        )
        .into_bytes();
        v.push(0);
        v
    }
}

/// sscanf-style `%d` restricted to values that fit a `u16`.
fn scan_u16(s: &[u8]) -> Option<(u16, &[u8])> {
    // C's isspace, which unlike `u8::is_ascii_whitespace` includes '\v'.
    let start = s
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r'))
        .unwrap_or(s.len());
    let mut s = &s[start..];
    if let Some(t) = s.strip_prefix(b"+") {
        s = t;
    }
    let digits = s.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    let mut v: u32 = 0;
    for &d in &s[..digits] {
        v = v.checked_mul(10)?.checked_add(u32::from(d - b'0'))?;
        if v > u32::from(u16::MAX) {
            return None;
        }
    }
    Some((v as u16, &s[digits..]))
}

/// What a `shell[,arg...]:CMD` or `exec:CMD` request runs, its defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShellRequest {
    pub protocol: ShellProtocol,
    pub mode: ShellMode,
    /// Value for `$TERM`; `None` leaves the daemon's own environment alone.
    pub term: Option<String>,
    /// Empty for an interactive login shell.
    pub command: String,
    /// The host ends the child's input by closing the stream: `exec:` (`adb
    /// exec-in CMD < FILE`). A `shell:` client never does (adb's
    /// `stdin_read_thread_loop` leaves a v1 stream open at stdin EOF), so
    /// there a close means the host hung up.
    pub close_ends_input: bool,
}

/// AOSP's `$TERM` for `shell` when the host sends no (or an empty) `TERM=`.
pub const DEFAULT_TERM: &str = "dumb";

impl From<ShellService> for ShellRequest {
    /// adbd's defaults for what the name leaves out: without `raw` or
    /// `pty`, an empty command gets a pty and any other command pipes;
    /// without `TERM=`, `$TERM` is `dumb`; an empty `TERM=` leaves the
    /// daemon's environment alone (daemon/shell_service.cpp).
    fn from(shell: ShellService) -> ShellRequest {
        let mode = shell.mode.unwrap_or(if shell.command.is_empty() {
            ShellMode::Pty
        } else {
            ShellMode::Raw
        });
        let term = match shell.term {
            None => Some(DEFAULT_TERM.to_owned()),
            Some(term) => (!term.is_empty()).then_some(term),
        };
        ShellRequest {
            protocol: shell.protocol,
            mode,
            term,
            command: shell.command,
            close_ends_input: false,
        }
    }
}

impl ShellRequest {
    /// What a `shell` or `exec:` service runs; `None` for other services.
    pub fn from_service(service: DeviceService) -> Option<ShellRequest> {
        match service {
            DeviceService::Shell(shell) => Some(shell.into()),
            DeviceService::Exec(command) => Some(ShellRequest::exec(command)),
            _ => None,
        }
    }

    /// `exec:COMMAND`: v1 and pipes, with the daemon's environment untouched.
    pub fn exec(command: String) -> ShellRequest {
        ShellRequest {
            protocol: ShellProtocol::V1,
            mode: ShellMode::Raw,
            term: None,
            command,
            close_ends_input: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(dec: &mut FrameDecoder) -> Vec<Frame> {
        let mut v = Vec::new();
        while let Some(f) = dec.next_frame().unwrap() {
            v.push(f);
        }
        v
    }

    #[test]
    fn the_host_reads_output_and_one_exit_status_of_one_byte() {
        let mut bytes = BytesMut::new();
        encode_frame(FrameId::Stdout, b"out", &mut bytes).unwrap();
        encode_frame(FrameId::Unknown(9), b"skipped", &mut bytes).unwrap();
        encode_frame(FrameId::Stderr, b"err", &mut bytes).unwrap();
        bytes.extend_from_slice(&exit_frame(3));
        let mut reader = DeviceOutputReader::new();
        // One byte at a time: the result does not depend on the reads.
        let mut got = Vec::new();
        for byte in bytes.iter() {
            reader.feed(&[*byte]);
            while let Some(output) = reader.next_output().unwrap() {
                got.push(output);
            }
        }
        assert_eq!(
            got,
            [
                DeviceOutput::Stdout(Bytes::from_static(b"out")),
                DeviceOutput::Stderr(Bytes::from_static(b"err")),
                DeviceOutput::Exit(3),
            ]
        );
        assert!(reader.exited());
        reader.feed(b"x");
        assert_eq!(reader.next_output(), Err(DeviceOutputError::AfterExit(1)));
    }

    #[test]
    fn an_exit_packet_of_another_length_is_an_error_that_stays() {
        for payload in [&b""[..], b"\0\0"] {
            let mut bytes = BytesMut::new();
            encode_frame(FrameId::Exit, payload, &mut bytes).unwrap();
            let mut reader = DeviceOutputReader::new();
            reader.feed(&bytes);
            let error = DeviceOutputError::ExitLength(payload.len());
            assert_eq!(reader.next_output(), Err(error.clone()));
            assert_eq!(reader.next_output(), Err(error));
            assert!(!reader.exited());
        }
        let mut reader = DeviceOutputReader::new();
        reader.feed(&[1, 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(
            reader.next_output(),
            Err(DeviceOutputError::Frame(
                ShellWireError::PayloadTooLarge { .. }
            ))
        ));
    }

    #[test]
    fn id_round_trip() {
        for b in 0..=255u8 {
            assert_eq!(FrameId::from_u8(b).as_u8(), b);
        }
        assert_eq!(FrameId::from(3), FrameId::Exit);
        assert_eq!(FrameId::from(255), FrameId::Invalid);
        assert_eq!(FrameId::from(9), FrameId::Unknown(9));
    }

    #[test]
    fn encode_layout() {
        let mut b = BytesMut::new();
        encode_frame(FrameId::Stdout, b"hi", &mut b).unwrap();
        assert_eq!(&b[..], &[1, 2, 0, 0, 0, b'h', b'i']);
        assert_eq!(
            encode_header(FrameId::Stdin, 0x0102_0304).unwrap(),
            [0, 4, 3, 2, 1]
        );
        assert_eq!(exit_frame(42), [3, 1, 0, 0, 0, 42]);
    }

    #[test]
    fn round_trip_all_at_once() {
        let mut b = BytesMut::new();
        encode_frame(FrameId::Stdin, b"abc", &mut b).unwrap();
        encode_frame(FrameId::CloseStdin, b"", &mut b).unwrap();
        encode_frame(FrameId::Unknown(77), b"x", &mut b).unwrap();
        b.extend_from_slice(&exit_frame(7));
        let mut dec = FrameDecoder::new();
        dec.feed(&b);
        let got = frames(&mut dec);
        assert_eq!(
            got,
            vec![
                Frame {
                    id: FrameId::Stdin,
                    payload: Bytes::from_static(b"abc")
                },
                Frame {
                    id: FrameId::CloseStdin,
                    payload: Bytes::new()
                },
                Frame {
                    id: FrameId::Unknown(77),
                    payload: Bytes::from_static(b"x")
                },
                Frame {
                    id: FrameId::Exit,
                    payload: Bytes::from_static(&[7])
                },
            ]
        );
        assert_eq!(dec.buffered(), 0);
    }

    #[test]
    fn split_inputs_byte_by_byte() {
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let mut b = BytesMut::new();
        encode_frame(FrameId::Stderr, &payload, &mut b).unwrap();
        encode_frame(FrameId::Stdout, b"tail", &mut b).unwrap();
        for chunk in [1usize, 2, 3, 5, 7, 64, 4096] {
            let mut dec = FrameDecoder::new();
            let mut got = Vec::new();
            for piece in b.chunks(chunk) {
                dec.feed(piece);
                got.extend(frames(&mut dec));
            }
            assert_eq!(got.len(), 2, "chunk {chunk}");
            assert_eq!(got[0].id, FrameId::Stderr);
            assert_eq!(&got[0].payload[..], &payload[..]);
            assert_eq!(&got[1].payload[..], b"tail");
        }
    }

    #[test]
    fn partial_header_waits() {
        let mut dec = FrameDecoder::new();
        dec.feed(&[0, 3, 0]);
        assert_eq!(dec.next_frame().unwrap(), None);
        dec.feed(&[0, 0, b'a', b'b']);
        assert_eq!(dec.next_frame().unwrap(), None);
        dec.feed(b"c");
        assert_eq!(
            dec.next_frame().unwrap().unwrap().payload,
            Bytes::from_static(b"abc")
        );
    }

    #[test]
    fn rejects_absurd_length() {
        let mut dec = FrameDecoder::with_max_payload(1024);
        dec.feed(&encode_header(FrameId::Stdin, 1025).unwrap());
        assert_eq!(
            dec.next_frame(),
            Err(ShellWireError::PayloadTooLarge {
                len: 1025,
                max: 1024
            })
        );
        let mut dec = FrameDecoder::new();
        dec.feed(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(
            dec.next_frame(),
            Err(ShellWireError::PayloadTooLarge { .. })
        ));
        // Exactly at the limit is fine.
        let mut dec = FrameDecoder::with_max_payload(4);
        dec.feed(&[0, 4, 0, 0, 0, 1, 2, 3, 4]);
        assert_eq!(dec.next_frame().unwrap().unwrap().payload.len(), 4);
    }

    #[test]
    fn window_size_parse() {
        let ws = WindowSize {
            rows: 40,
            cols: 120,
            x_pixels: 0,
            y_pixels: 0,
        };
        assert_eq!(WindowSize::parse(b"40x120,0x0").unwrap(), ws);
        assert_eq!(WindowSize::parse(b"40x120,0x0\0").unwrap(), ws);
        assert_eq!(WindowSize::parse(b" 40x +120, 0x0junk").unwrap(), ws);
        // Found by fuzz/fuzz_targets/shell_frame.rs: sscanf's %d skips '\v' too.
        assert_eq!(WindowSize::parse(b"\x0b40x\t120,\x0c0x\r\n0").unwrap(), ws);
        let ws2 = WindowSize {
            rows: 25,
            cols: 80,
            x_pixels: 640,
            y_pixels: 400,
        };
        assert_eq!(WindowSize::parse(&ws2.to_payload()).unwrap(), ws2);
        assert_eq!(ws2.to_payload(), b"25x80,640x400\0");
        for bad in [
            &b""[..],
            b"40x120",
            b"40x120,0",
            b"40,120,0x0",
            b"40x120;0x0",
            b"-1x120,0x0",
            b"70000x1,0x0",
            b"ax1,0x0",
            b"40 x120,0x0",
        ] {
            assert!(
                matches!(
                    WindowSize::parse(bad),
                    Err(ShellWireError::BadWindowSize(_))
                ),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    fn req(p: ShellProtocol, m: ShellMode, term: Option<&str>, cmd: &str) -> ShellRequest {
        ShellRequest {
            protocol: p,
            mode: m,
            term: term.map(str::to_owned),
            command: cmd.to_owned(),
            close_ends_input: false,
        }
    }

    /// The request a `shell` or `exec:` name makes.
    fn request(name: &str) -> ShellRequest {
        ShellRequest::from_service(name.parse().unwrap()).unwrap()
    }

    #[test]
    fn requests_get_adbds_defaults() {
        use ShellMode::*;
        use ShellProtocol::*;
        let cases: &[(&str, ShellRequest)] = &[
            ("shell:", req(V1, Pty, Some("dumb"), "")),
            ("shell:ls -l", req(V1, Raw, Some("dumb"), "ls -l")),
            ("shell:echo a:b", req(V1, Raw, Some("dumb"), "echo a:b")),
            (
                "shell,v2,TERM=xterm-256color,raw:cat",
                req(V2, Raw, Some("xterm-256color"), "cat"),
            ),
            (
                "shell,v2,TERM=xterm-256color,pty:",
                req(V2, Pty, Some("xterm-256color"), ""),
            ),
            ("shell,v2,pty:tty", req(V2, Pty, Some("dumb"), "tty")),
            ("shell,v2:", req(V2, Pty, Some("dumb"), "")),
            ("shell,v2:id", req(V2, Raw, Some("dumb"), "id")),
            ("shell,raw:", req(V1, Raw, Some("dumb"), "")),
            ("shell,pty,raw:x", req(V1, Raw, Some("dumb"), "x")),
            ("shell,raw,pty:x", req(V1, Pty, Some("dumb"), "x")),
            ("shell,,future-arg,v2:x", req(V2, Raw, Some("dumb"), "x")),
            ("shell,TERM=:x", req(V1, Raw, None, "x")),
        ];
        for (name, want) in cases {
            assert_eq!(&request(name), want, "{name}");
        }
        for (name, command) in [("exec:cat", "cat"), ("exec:", ""), ("exec:a,b:c", "a,b:c")] {
            let want = ShellRequest {
                close_ends_input: true,
                ..req(V1, Raw, None, command)
            };
            assert_eq!(request(name), want, "{name}");
        }
    }
}
