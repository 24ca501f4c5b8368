//! Message `sysFlag` bits (spec §4.2, Java `MessageSysFlag`).

/// The body is compressed (compression type in [`COMPRESSION_TYPE_MASK`]).
pub const COMPRESSED_FLAG: i32 = 0x1;
/// The topic filter type is MULTI_TAG.
pub const MULTI_TAGS_FLAG: i32 = 0x2;
/// Not a transactional message (transaction value 0).
pub const TRANSACTION_NOT_TYPE: i32 = 0;
/// Transactional half (prepared) message.
pub const TRANSACTION_PREPARED_TYPE: i32 = 0x4;
/// Transaction committed.
pub const TRANSACTION_COMMIT_TYPE: i32 = 0x8;
/// Transaction rolled back; also the mask of the transaction value.
pub const TRANSACTION_ROLLBACK_TYPE: i32 = 0xC;
/// Mask of the transaction value bits.
pub const TRANSACTION_TYPE_MASK: i32 = 0xC;
/// BORNHOST is an IPv6 address (16 bytes instead of 4).
pub const BORNHOST_V6_FLAG: i32 = 0x10;
/// STOREHOST is an IPv6 address (16 bytes instead of 4).
pub const STOREHOST_V6_FLAG: i32 = 0x20;
/// The message must be unwrapped (inner batch).
pub const NEED_UNWRAP_FLAG: i32 = 0x40;
/// The message is an inner batch.
pub const INNER_BATCH_FLAG: i32 = 0x80;
/// Compression type LZ4 (type value 1 in bits 8–10).
pub const COMPRESSION_LZ4_TYPE: i32 = 0x100;
/// Compression type ZSTD (type value 2 in bits 8–10).
pub const COMPRESSION_ZSTD_TYPE: i32 = 0x200;
/// Compression type ZLIB (type value 3 in bits 8–10; 0 also means ZLIB, the legacy encoding).
pub const COMPRESSION_ZLIB_TYPE: i32 = 0x300;
/// Mask of the compression type bits 8–10.
pub const COMPRESSION_TYPE_MASK: i32 = 0x700;

/// The transaction value of a sysFlag: one of [`TRANSACTION_NOT_TYPE`],
/// [`TRANSACTION_PREPARED_TYPE`], [`TRANSACTION_COMMIT_TYPE`], [`TRANSACTION_ROLLBACK_TYPE`].
pub fn transaction_value(sys_flag: i32) -> i32 {
    sys_flag & TRANSACTION_TYPE_MASK
}

/// `sys_flag` with its transaction value replaced by `value` (masked to the transaction bits).
pub fn reset_transaction_value(sys_flag: i32, value: i32) -> i32 {
    (sys_flag & !TRANSACTION_TYPE_MASK) | (value & TRANSACTION_TYPE_MASK)
}

/// Whether the body is compressed.
pub fn is_compressed(sys_flag: i32) -> bool {
    sys_flag & COMPRESSED_FLAG != 0
}

/// `sys_flag` without the [`COMPRESSED_FLAG`] bit (what the client does after decompressing).
pub fn clear_compressed_flag(sys_flag: i32) -> i32 {
    sys_flag & !COMPRESSED_FLAG
}

/// Whether the BORNHOST field is IPv6.
pub fn is_born_host_v6(sys_flag: i32) -> bool {
    sys_flag & BORNHOST_V6_FLAG != 0
}

/// Whether the STOREHOST field is IPv6.
pub fn is_store_host_v6(sys_flag: i32) -> bool {
    sys_flag & STOREHOST_V6_FLAG != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transaction_value_round_trip() {
        let f = COMPRESSED_FLAG | BORNHOST_V6_FLAG | TRANSACTION_PREPARED_TYPE;
        assert_eq!(transaction_value(f), TRANSACTION_PREPARED_TYPE);
        let g = reset_transaction_value(f, TRANSACTION_COMMIT_TYPE);
        assert_eq!(transaction_value(g), TRANSACTION_COMMIT_TYPE);
        assert_eq!(
            g & !TRANSACTION_TYPE_MASK,
            COMPRESSED_FLAG | BORNHOST_V6_FLAG
        );
        assert!(is_compressed(f) && !is_compressed(clear_compressed_flag(f)));
        assert!(is_born_host_v6(f) && !is_store_host_v6(f));
    }
}
