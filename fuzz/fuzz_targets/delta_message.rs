//! The host's bytes on an `oxadb-delta:` stream, as oxadbd decodes them.
//! Input: one byte giving the size of the pieces the stream arrives in
//! (1 to 256), then the stream's bytes.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use oxadb_delta::wire::{encode, Decoder, WireError, MAX_BODY};

fuzz_target!(|data: &[u8]| {
    let Some((&piece, stream)) = data.split_first() else {
        return;
    };
    let piece = usize::from(piece) + 1;
    let mut decoder = Decoder::new();
    for bytes in stream.chunks(piece) {
        decoder.feed(bytes);
        loop {
            match decoder.next_message() {
                Ok(Some(message)) => {
                    // What was decoded encodes to bytes that decode to it
                    // again (REPLACE data may compress differently).
                    let mut out = BytesMut::new();
                    encode(&message, &mut out);
                    let mut again = Decoder::new();
                    again.feed(&out);
                    assert_eq!(again.next_message(), Ok(Some(message)));
                    assert_eq!(again.pending(), 0);
                }
                Ok(None) => break,
                Err(WireError::TooLarge(len)) => {
                    assert!(len > MAX_BODY);
                    return;
                }
                // The stream is over for this peer.
                Err(_) => return,
            }
        }
        // Never more than one frame waits, and no frame is over the limit.
        assert!(decoder.pending() <= 4 + MAX_BODY);
    }
});
