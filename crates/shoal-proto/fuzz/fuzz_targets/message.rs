//! Fuzz target: decode a run of stored message records (a pull body) from arbitrary bytes,
//! through every decoding entry point. Nothing may panic; what decodes must be consistent.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use shoal_proto::message::{
    body_crc, decode_batch, decode_records, iter_records, DecodeOptions, RecordView,
};

fuzz_target!(|data: &[u8]| {
    let bytes = Bytes::copy_from_slice(data);
    let opts = DecodeOptions {
        verify_crc: true,
        decompress_body: true,
        max_decompressed_size: 1 << 20,
    };
    let run = decode_records(&bytes, &opts);
    assert!(run.consumed <= data.len());
    assert_eq!(run.consumed == data.len(), run.error.is_none());
    for m in &run.messages {
        // Re-encoding what was decoded must work or fail cleanly.
        let _ = m.to_bytes();
        let _ = m.msg_id();
    }

    let mut it = iter_records(data);
    for view in it.by_ref().flatten() {
        assert_eq!(view.len(), view.total_size() as usize);
        assert!(view.body_range().end <= view.len());
        let _ = view.properties();
        let _ = view.tags_code();
        if view.verify_crc().is_ok() {
            assert_eq!(body_crc(view.body()), view.body_crc());
        }
    }
    assert!(it.consumed() <= data.len());
    if let Ok(view) = RecordView::parse(data) {
        assert!(view.len() <= data.len());
    }
    let _ = decode_batch(&bytes);
});
