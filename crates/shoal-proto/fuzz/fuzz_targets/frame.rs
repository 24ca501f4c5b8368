//! Fuzz target: split frames off an arbitrary byte stream and decode each one.
//! (Minimal version; the `net` engineer owns and extends this target.)
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use shoal_proto::command::split_frame;
use shoal_proto::RemotingCommand;

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    while let Ok(Some(frame)) = split_frame(&mut buf, 1 << 20) {
        let _ = RemotingCommand::decode(frame);
    }
});
