//! A client's bytes to an adb host server (crates/wire/src/smart_socket.rs,
//! read as crates/wire/src/service.rs's HostService).
//!
//! Input: the bytes of a client connection. Requests are taken from the
//! front one at a time, as a server reads them: a whole request re-encodes
//! to the bytes it came from (hex digits in either case) and never uses more than it was given; a cut
//! one asks for more at every cut; a refused one is refused whatever
//! follows it. Each request's text is read as a host service: one that
//! parses writes itself back and parses to the same value, and its reply
//! frames (`OKAY`/`FAIL` and a message) decode to the text they carry.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oxadb_wire::service::HostService;
use oxadb_wire::smart_socket::{
    decode_message, decode_request, encode_request, fail, message, okay_message,
};

fuzz_target!(|data: &[u8]| {
    let mut input = data;
    while !input.is_empty() {
        match decode_request(input) {
            Ok(Some((text, used))) => {
                assert!(used <= input.len() && used == 4 + text.len());
                // Hex digits may come in either case; the text is the body.
                let encoded = encode_request(&text).expect("a decoded request re-encodes");
                assert!(encoded[..4].eq_ignore_ascii_case(&input[..4]));
                assert_eq!(&encoded[4..], &input[4..used]);
                for cut in 0..used {
                    assert_eq!(decode_request(&input[..cut]), Ok(None), "cut at {cut}");
                }
                check_host(&text);
                input = &input[used..];
            }
            Ok(None) => break,
            Err(error) => {
                let mut longer = input.to_vec();
                longer.extend_from_slice(b"0004host");
                assert_eq!(decode_request(&longer), Err(error));
                break;
            }
        }
    }
});

fn check_host(text: &str) {
    if let Ok(service) = HostService::parse(text) {
        let written = service.to_string();
        assert_eq!(HostService::parse(&written).as_ref(), Ok(&service));
    }
    for framed in [okay_message(text), fail(text)] {
        let (body, used) = decode_message(&framed[4..]).unwrap().unwrap();
        assert_eq!(used, framed.len() - 4);
        assert!(text.as_bytes().starts_with(body));
    }
    assert_eq!(
        decode_message(&message(text)).unwrap().unwrap().1,
        message(text).len()
    );
}
