//! Fuzz target `frame`: arbitrary bytes as a connection's byte stream.
//!
//! Splits frames off the input with the 16 MiB limit and decodes each; also decodes the whole
//! input as one frame body and as a bare JSON and binary header. Nothing may panic. Every
//! command that decodes must encode again (with its own header type) and decode back to itself
//! (up to the one documented binary quirk: an extFields area whose entries were all empty
//! decodes as an empty map but re-encodes as no map).
//!
//! Run: `cargo +nightly fuzz run frame` from `crates/shoal-proto` (see `docs/fuzzing.md`).
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use shoal_proto::command::{split_frame, MAX_FRAME_LEN};
use shoal_proto::{RemotingCommand, SerializeType};

/// Re-encodes a decoded command and checks that it decodes back to itself.
fn check_round_trip(mut cmd: RemotingCommand) {
    if cmd.serialize_type == SerializeType::RocketMq
        && cmd.ext_fields.as_ref().is_some_and(|m| m.is_empty())
    {
        cmd.ext_fields = None;
    }
    let frame = cmd.to_frame().expect("a decoded command encodes again");
    let mut buf = BytesMut::from(&frame[..]);
    let inner = split_frame(&mut buf, usize::MAX)
        .expect("own frame has a valid length")
        .expect("own frame is whole");
    assert!(buf.is_empty());
    let again = RemotingCommand::decode(inner).expect("own frame decodes");
    assert_eq!(again, cmd);
}

fuzz_target!(|data: &[u8]| {
    let mut stream = BytesMut::from(data);
    while let Ok(Some(frame)) = split_frame(&mut stream, MAX_FRAME_LEN) {
        if let Ok(cmd) = RemotingCommand::decode(frame) {
            check_round_trip(cmd);
        }
    }
    if let Ok(cmd) = RemotingCommand::decode(Bytes::copy_from_slice(data)) {
        check_round_trip(cmd);
    }
    for st in [SerializeType::Json, SerializeType::RocketMq] {
        if let Ok(cmd) = RemotingCommand::decode_header(st, data) {
            check_round_trip(cmd);
        }
    }
});
