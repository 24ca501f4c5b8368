//! Decodes one JSON header N times, for counting instructions per decode under callgrind:
//! `req` is a SEND_MESSAGE_V2 request as Shoal's producer writes it (decoded, then read as
//! `SendHeaderRef`), `resp` the broker's answer to it (read as `SendResponseRef`), `bare` the
//! request decoded alone.
//!
//! ```text
//! cargo build --release -p shoal-proto --example header_instr
//! for n in 0 20000; do valgrind --tool=callgrind --callgrind-out-file=/tmp/hi.$n \
//!     target/release/examples/header_instr req $n; done
//! # instructions per decode: (totals of /tmp/hi.20000 - totals of /tmp/hi.0) / 20000
//! ```
//!
//! Instruction counts repeat to a fraction of a percent, unlike times on a shared machine
//! (see benches/peers/README.md).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a tool for measurement; a failed unwrap ends the run"
)]

use bytes::{BufMut, Bytes, BytesMut};
use shoal_proto::command::{ExtFields, LanguageCode, RemotingCommand, SerializeType};
use shoal_proto::header::{SendHeaderRef, SendResponseRef};
use std::hint::black_box;

fn command(code: i32, flag: i32, pairs: &[(&str, &str)]) -> RemotingCommand {
    RemotingCommand {
        code,
        language: LanguageCode::Java,
        version: 479,
        opaque: 1_048_576,
        flag,
        remark: None,
        ext_fields: Some(pairs.iter().copied().collect::<ExtFields>()),
        ext_fields_raw: None,
        serialize_type: SerializeType::Json,
        body: None,
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "req".into());
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let cmd = match which.as_str() {
        "resp" => command(
            0,
            1,
            &[
                ("msgId", "7F00000100002A9F00000000000A3C2E"),
                ("queueId", "3"),
                ("queueOffset", "123456"),
                ("MSG_REGION", "DefaultRegion"),
                ("TRACE_ON", "true"),
            ],
        ),
        _ => command(
            310,
            0,
            &[
                ("a", "please_rename_unique_group_name"),
                ("b", "TopicTest"),
                ("c", "TBW102"),
                ("d", "4"),
                ("e", "3"),
                ("f", "0"),
                ("g", "1700000000123"),
                ("h", "0"),
                (
                    "i",
                    "UNIQ_KEY\u{1}7F0000010C6318B4AAC2191FD5F80000\u{2}WAIT\u{1}true\u{2}TAGS\u{1}TagA\u{2}",
                ),
                ("j", "0"),
                ("k", "false"),
                ("l", "16"),
                ("m", "false"),
            ],
        ),
    };
    let mut header = BytesMut::new();
    cmd.encode_header(&mut header).expect("the sample encodes");
    // A frame as the codec hands it over: the header-length word, then the header.
    let mut frame = BytesMut::with_capacity(4 + header.len());
    frame.put_u32(header.len() as u32);
    frame.extend_from_slice(&header);
    let frame: Bytes = frame.freeze();
    let mut sum = 0i64;
    for _ in 0..n {
        let d = RemotingCommand::decode(black_box(frame.clone())).expect("the sample decodes");
        sum += match which.as_str() {
            "req" => {
                let ext = d.ext_fields.as_ref().expect("extFields");
                SendHeaderRef::decode(ext, true)
                    .expect("a send header")
                    .born_timestamp
            }
            "resp" => {
                SendResponseRef::decode(d.ext_fields.as_ref())
                    .expect("a send answer")
                    .queue_offset
            }
            _ => i64::from(d.opaque),
        };
        black_box(&d);
    }
    println!("{sum}");
}
