//! The framing of an adb host server's client connections (port 5037, the
//! "smart socket"): a request is four hex digits of length and that many
//! bytes of text; the server answers `OKAY` or `FAIL` followed by a
//! length-prefixed message, and some requests send further length-prefixed
//! messages (`host:devices`' list, each `track-devices` update). AOSP:
//! `sockets.cpp` smart_socket_enqueue (the request and its limits),
//! `adb_io.cpp` SendProtocolString and SendFail, `docs/dev/protocol.md`.
//! No I/O: bytes in, values out, and back.

use std::fmt::Write as _;

/// The longest request a server takes (AOSP `adb.h` MAX_PAYLOAD, which
/// `sockets.cpp` checks a request's length against).
pub const MAX_REQUEST: usize = 1024 * 1024;

/// The longest message a length prefix of four hex digits can carry.
pub const MAX_MESSAGE: usize = 0xffff;

/// `OKAY`: the request was served (for a device service: the device
/// accepted the stream).
pub const OKAY: &[u8; 4] = b"OKAY";

/// `FAIL`: followed by a length-prefixed message saying why.
pub const FAIL: &[u8; 4] = b"FAIL";

/// Why a request's framing is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The four bytes are not hex digits.
    #[error("bad request length {0:?}")]
    BadLength(String),
    /// A length of zero: there is nothing to serve.
    #[error("empty request")]
    Empty,
    /// Longer than [`MAX_REQUEST`].
    #[error("request of {0} bytes is longer than {MAX_REQUEST}")]
    TooLong(usize),
    /// Service names are text.
    #[error("request is not UTF-8")]
    NotUtf8,
}

/// The length a request's four-byte prefix announces: hex digits of either
/// case, as AOSP's `unhex` reads them, 1 to [`MAX_REQUEST`].
pub fn request_length(prefix: [u8; 4]) -> Result<usize, RequestError> {
    let length = hex_length(prefix)
        .ok_or_else(|| RequestError::BadLength(String::from_utf8_lossy(&prefix).into_owned()))?;
    match length {
        0 => Err(RequestError::Empty),
        n if n > MAX_REQUEST => Err(RequestError::TooLong(n)),
        n => Ok(n),
    }
}

/// A request's text from its body (the bytes after the prefix).
pub fn request_text(body: Vec<u8>) -> Result<String, RequestError> {
    String::from_utf8(body).map_err(|_| RequestError::NotUtf8)
}

/// Takes one whole request from the front of `input`: `Ok(None)` while
/// more bytes are needed, else the request and how many bytes it used
/// (what follows belongs to the service it opens).
pub fn decode_request(input: &[u8]) -> Result<Option<(String, usize)>, RequestError> {
    let Some(prefix) = input.get(..4) else {
        return Ok(None);
    };
    let length = request_length(prefix.try_into().expect("four bytes"))?;
    let Some(body) = input.get(4..4 + length) else {
        return Ok(None);
    };
    Ok(Some((request_text(body.to_vec())?, 4 + length)))
}

/// A request as a client sends it.
pub fn encode_request(text: &str) -> Result<Vec<u8>, RequestError> {
    match text.len() {
        0 => Err(RequestError::Empty),
        n if n > MAX_MESSAGE => Err(RequestError::TooLong(n)),
        n => {
            let mut out = format!("{n:04x}").into_bytes();
            out.extend_from_slice(text.as_bytes());
            Ok(out)
        }
    }
}

/// A length-prefixed message: four lowercase hex digits, then the text.
/// Text longer than [`MAX_MESSAGE`] is cut there (on a character
/// boundary), as four digits can say no more.
pub fn message(text: &str) -> Vec<u8> {
    let mut end = text.len().min(MAX_MESSAGE);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(4 + end);
    let _ = write!(out, "{end:04x}");
    out.push_str(&text[..end]);
    out.into_bytes()
}

/// A length-prefixed binary message (a protobuf, which cannot be cut):
/// `None` when longer than [`MAX_MESSAGE`].
pub fn binary_message(bytes: &[u8]) -> Option<Vec<u8>> {
    if bytes.len() > MAX_MESSAGE {
        return None;
    }
    let mut out = format!("{:04x}", bytes.len()).into_bytes();
    out.extend_from_slice(bytes);
    Some(out)
}

/// `OKAY` followed by a message (`host:version`, `host:devices`, ...).
pub fn okay_message(text: &str) -> Vec<u8> {
    let mut out = OKAY.to_vec();
    out.extend_from_slice(&message(text));
    out
}

/// `FAIL` followed by why; adb prints it as `error: TEXT`.
pub fn fail(text: &str) -> Vec<u8> {
    let mut out = FAIL.to_vec();
    out.extend_from_slice(&message(text));
    out
}

/// A reply's first four bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Okay,
    Fail,
}

impl Status {
    /// `None` for anything but `OKAY` and `FAIL`.
    pub fn parse(bytes: [u8; 4]) -> Option<Status> {
        match &bytes {
            OKAY => Some(Status::Okay),
            FAIL => Some(Status::Fail),
            _ => None,
        }
    }
}

/// Takes one length-prefixed message from the front of `input`: `Ok(None)`
/// while more bytes are needed, else its bytes and how many bytes it used.
pub fn decode_message(input: &[u8]) -> Result<Option<(&[u8], usize)>, RequestError> {
    let Some(prefix) = input.get(..4) else {
        return Ok(None);
    };
    let prefix: [u8; 4] = prefix.try_into().expect("four bytes");
    let length = hex_length(prefix)
        .ok_or_else(|| RequestError::BadLength(String::from_utf8_lossy(&prefix).into_owned()))?;
    Ok(input.get(4..4 + length).map(|body| (body, 4 + length)))
}

fn hex_length(prefix: [u8; 4]) -> Option<usize> {
    prefix.iter().try_fold(0usize, |length, &digit| {
        let value = (digit as char).to_digit(16)?;
        Some(length << 4 | value as usize)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_framed_by_four_hex_digits() {
        assert_eq!(
            decode_request(b"000chost:version"),
            Ok(Some(("host:version".to_string(), 16)))
        );
        // What follows a request stays for the service it opens.
        assert_eq!(
            decode_request(b"0005sync:STAT"),
            Ok(Some(("sync:".to_string(), 9)))
        );
        // Either case of hex digit, as AOSP's unhex.
        assert_eq!(request_length(*b"00aB"), Ok(0xab));
        assert_eq!(request_length(*b"0001"), Ok(1));
        assert_eq!(encode_request("host:version").unwrap(), b"000chost:version");
    }

    #[test]
    fn partial_requests_wait_for_more() {
        let whole = b"000chost:version";
        for cut in 0..whole.len() {
            assert_eq!(decode_request(&whole[..cut]), Ok(None), "cut at {cut}");
        }
    }

    #[test]
    fn bad_lengths_are_refused() {
        assert_eq!(
            request_length(*b"00g1"),
            Err(RequestError::BadLength("00g1".into()))
        );
        assert_eq!(
            request_length(*b" 001"),
            Err(RequestError::BadLength(" 001".into()))
        );
        assert_eq!(
            request_length(*b"+001"),
            Err(RequestError::BadLength("+001".into()))
        );
        assert_eq!(request_length(*b"0000"), Err(RequestError::Empty));
        assert_eq!(decode_request(b"0000"), Err(RequestError::Empty));
        assert_eq!(
            decode_request(b"zzzz"),
            Err(RequestError::BadLength("zzzz".into()))
        );
        assert_eq!(decode_request(b"0002\xff\xfe"), Err(RequestError::NotUtf8));
        assert_eq!(encode_request(""), Err(RequestError::Empty));
        assert!(matches!(
            encode_request(&"x".repeat(MAX_MESSAGE + 1)),
            Err(RequestError::TooLong(_))
        ));
        // Four hex digits cannot exceed MAX_REQUEST, but the rule stands on
        // its own should MAX_REQUEST shrink.
        assert_eq!(request_length(*b"ffff"), Ok(0xffff));
    }

    #[test]
    fn replies() {
        assert_eq!(okay_message("0029"), b"OKAY00040029");
        assert_eq!(
            fail("device 'x' not found"),
            b"FAIL0014device 'x' not found"
        );
        assert_eq!(message(""), b"0000");
        assert_eq!(Status::parse(*b"OKAY"), Some(Status::Okay));
        assert_eq!(Status::parse(*b"FAIL"), Some(Status::Fail));
        assert_eq!(Status::parse(*b"okay"), None);
        assert_eq!(decode_message(b"0003abcdef"), Ok(Some((&b"abc"[..], 7))));
        assert_eq!(decode_message(b"0003ab"), Ok(None));
        assert_eq!(decode_message(b"00"), Ok(None));
        assert!(decode_message(b"x003abc").is_err());
    }

    #[test]
    fn long_messages_are_cut_to_what_four_digits_say() {
        let long = "é".repeat(MAX_MESSAGE);
        let framed = message(&long);
        let (body, used) = decode_message(&framed).unwrap().unwrap();
        assert_eq!(used, framed.len());
        assert!(body.len() <= MAX_MESSAGE && body.len() >= MAX_MESSAGE - 1);
        assert!(std::str::from_utf8(body).is_ok());
    }
}
