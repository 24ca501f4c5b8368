//! Body compression selected by the sysFlag (spec §4.2): ZLIB, LZ4 frame and ZSTD.
//!
//! Decompression is always bounded: output larger than the given limit is an error
//! ([`ProtoError::Compression`]), so a "zip bomb" cannot exhaust memory.

use std::io::{Read, Write};

use super::sys_flag::{COMPRESSED_FLAG, COMPRESSION_TYPE_MASK};
use crate::{ProtoError, Result};

/// Java's default compression level (`rocketmq.message.compressLevel`).
pub const DEFAULT_COMPRESS_LEVEL: i32 = 5;
/// Java producer default: bodies of at least this many bytes are compressed (non-batch).
pub const DEFAULT_COMPRESS_BODY_OVER: usize = 4096;
/// The broker's default maximum message size (4 MiB).
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 4 * 1024 * 1024;
/// Default bound on a decompressed body: 8 × [`DEFAULT_MAX_MESSAGE_SIZE`] (32 MiB).
pub const DEFAULT_MAX_DECOMPRESSED_SIZE: usize = 8 * DEFAULT_MAX_MESSAGE_SIZE;

/// A body compression algorithm, as encoded in sysFlag bits 8–10.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompressionType {
    /// zlib-wrapped deflate (Java `Deflater`/`Inflater`); type value 3, or 0 (legacy).
    Zlib,
    /// LZ4 frame format; type value 1.
    Lz4,
    /// Zstandard frame; type value 2.
    Zstd,
}

impl CompressionType {
    /// The type value stored in sysFlag bits 8–10 (ZLIB 3, LZ4 1, ZSTD 2).
    pub fn type_value(self) -> i32 {
        match self {
            CompressionType::Lz4 => 1,
            CompressionType::Zstd => 2,
            CompressionType::Zlib => 3,
        }
    }

    /// The compression type for a type value (0 and 3 are ZLIB); `None` for 4..=7 and others.
    pub fn from_type_value(value: i32) -> Option<Self> {
        match value {
            0 | 3 => Some(CompressionType::Zlib),
            1 => Some(CompressionType::Lz4),
            2 => Some(CompressionType::Zstd),
            _ => None,
        }
    }

    /// The compression type named by a sysFlag's bits 8–10 (whether or not the
    /// [`COMPRESSED_FLAG`] bit is set). Errors on an unknown type value.
    pub fn from_sys_flag(sys_flag: i32) -> Result<Self> {
        let value = (sys_flag & COMPRESSION_TYPE_MASK) >> 8;
        Self::from_type_value(value).ok_or_else(|| {
            ProtoError::Compression(format!("unknown compression type value {value} in sysFlag"))
        })
    }

    /// The sysFlag bits a body compressed with this type carries:
    /// [`COMPRESSED_FLAG`] | type value << 8 (ZLIB ⇒ `0x301`).
    pub fn sys_flag_bits(self) -> i32 {
        COMPRESSED_FLAG | (self.type_value() << 8)
    }

    /// Compresses `data`. `level` is the zlib level (clamped to 0..=9) or the zstd level
    /// (clamped to 1..=22); LZ4 ignores it.
    pub fn compress(self, data: &[u8], level: i32) -> Result<Vec<u8>> {
        let err = |e: std::io::Error| ProtoError::Compression(format!("{self:?} compress: {e}"));
        match self {
            CompressionType::Zlib => {
                let level = level.clamp(0, 9) as u32;
                let mut enc = flate2::write::ZlibEncoder::new(
                    Vec::with_capacity(data.len() / 2 + 16),
                    flate2::Compression::new(level),
                );
                enc.write_all(data).map_err(err)?;
                enc.finish().map_err(err)
            }
            CompressionType::Lz4 => {
                let mut enc =
                    lz4_flex::frame::FrameEncoder::new(Vec::with_capacity(data.len() / 2 + 32));
                enc.write_all(data).map_err(err)?;
                enc.finish()
                    .map_err(|e| ProtoError::Compression(format!("Lz4 compress: {e}")))
            }
            CompressionType::Zstd => zstd::bulk::compress(data, level.clamp(1, 22)).map_err(err),
        }
    }

    /// Decompresses `data`, refusing output longer than `limit` bytes.
    pub fn decompress(self, data: &[u8], limit: usize) -> Result<Vec<u8>> {
        let err = |e: std::io::Error| ProtoError::Compression(format!("{self:?} decompress: {e}"));
        match self {
            CompressionType::Zlib => read_bounded(
                flate2::read::ZlibDecoder::new(data),
                limit,
                self,
                data.len(),
            ),
            CompressionType::Lz4 => read_bounded(
                lz4_flex::frame::FrameDecoder::new(data),
                limit,
                self,
                data.len(),
            ),
            CompressionType::Zstd => {
                let mut dec = zstd::stream::read::Decoder::with_buffer(data).map_err(err)?;
                // Refuse frames that ask for a window larger than the output may be.
                dec.window_log_max(window_log_for(limit)).map_err(err)?;
                read_bounded(dec.single_frame(), limit, self, data.len())
            }
        }
    }
}

/// The zstd window log allowing windows up to `limit` (at least 2^20, at most 2^27).
fn window_log_for(limit: usize) -> u32 {
    let bits = usize::BITS - limit.saturating_sub(1).leading_zeros();
    bits.clamp(20, 27)
}

/// Reads the whole decoder output, failing once more than `limit` bytes come out.
fn read_bounded<R: Read>(
    reader: R,
    limit: usize,
    ty: CompressionType,
    input_len: usize,
) -> Result<Vec<u8>> {
    let cap = limit.min(input_len.saturating_mul(4).max(64));
    let mut out = Vec::with_capacity(cap);
    let bound = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    reader
        .take(bound)
        .read_to_end(&mut out)
        .map_err(|e| ProtoError::Compression(format!("{ty:?} decompress: {e}")))?;
    if out.len() > limit {
        return Err(ProtoError::Compression(format!(
            "{ty:?} body decompresses to more than the limit of {limit} bytes"
        )));
    }
    Ok(out)
}

/// Compresses a body with `ty` at `level`, returning the compressed bytes and the sysFlag bits
/// to OR into the message's sysFlag ([`CompressionType::sys_flag_bits`]).
pub fn compress_body(body: &[u8], ty: CompressionType, level: i32) -> Result<(Vec<u8>, i32)> {
    Ok((ty.compress(body, level)?, ty.sys_flag_bits()))
}

/// The Java producer's rule for a single (non-batch) message: compress the body with `ty` at
/// `level` if it is at least `compress_over` bytes ([`DEFAULT_COMPRESS_BODY_OVER`] = 4096 by
/// default). Returns `None` for a body left as is, else the compressed body and the sysFlag
/// bits to OR in.
pub fn compress_for_send(
    body: &[u8],
    compress_over: usize,
    ty: CompressionType,
    level: i32,
) -> Result<Option<(Vec<u8>, i32)>> {
    if body.len() < compress_over {
        return Ok(None);
    }
    compress_body(body, ty, level).map(Some)
}

/// Decompresses a body according to `sys_flag`: returns `None` if the [`COMPRESSED_FLAG`] bit
/// is clear, else the decompressed body (at most `limit` bytes).
pub fn decompress_body(sys_flag: i32, body: &[u8], limit: usize) -> Result<Option<Vec<u8>>> {
    if sys_flag & COMPRESSED_FLAG == 0 {
        return Ok(None);
    }
    CompressionType::from_sys_flag(sys_flag)?
        .decompress(body, limit)
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [CompressionType; 3] = [
        CompressionType::Zlib,
        CompressionType::Lz4,
        CompressionType::Zstd,
    ];

    #[test]
    fn type_values_and_flags() {
        assert_eq!(CompressionType::Zlib.sys_flag_bits(), 0x301);
        assert_eq!(CompressionType::Lz4.sys_flag_bits(), 0x101);
        assert_eq!(CompressionType::Zstd.sys_flag_bits(), 0x201);
        assert_eq!(
            CompressionType::from_sys_flag(0x1).unwrap(),
            CompressionType::Zlib
        );
        for ty in ALL {
            assert_eq!(
                CompressionType::from_sys_flag(ty.sys_flag_bits()).unwrap(),
                ty
            );
        }
        for v in 4..8 {
            assert!(CompressionType::from_sys_flag(0x1 | (v << 8)).is_err());
        }
    }

    #[test]
    fn round_trips_and_zlib_header() {
        let data: Vec<u8> = (0..20_000u32)
            .flat_map(|i| (i % 251).to_be_bytes())
            .collect();
        for ty in ALL {
            let c = ty.compress(&data, DEFAULT_COMPRESS_LEVEL).unwrap();
            assert!(c.len() < data.len(), "{ty:?}");
            assert_eq!(ty.decompress(&c, data.len()).unwrap(), data, "{ty:?}");
            assert!(ty.decompress(&c, data.len() - 1).is_err(), "{ty:?}");
        }
        // zlib stream header (CMF 0x78) as java.util.zip.Deflater writes.
        let z = CompressionType::Zlib.compress(b"hello", 5).unwrap();
        assert_eq!(z[0], 0x78);
        // LZ4 frame magic 0x184D2204 (little-endian).
        let l = CompressionType::Lz4.compress(b"hello", 5).unwrap();
        assert_eq!(&l[..4], &[0x04, 0x22, 0x4d, 0x18]);
        assert_eq!(decompress_body(0, b"raw", 10).unwrap(), None);
        assert_eq!(
            compress_for_send(
                &data[..4095],
                DEFAULT_COMPRESS_BODY_OVER,
                CompressionType::Zlib,
                5
            )
            .unwrap(),
            None
        );
        let (c, flag) = compress_for_send(
            &data[..4096],
            DEFAULT_COMPRESS_BODY_OVER,
            CompressionType::Zlib,
            5,
        )
        .unwrap()
        .unwrap();
        assert_eq!(flag, 0x301);
        assert_eq!(
            decompress_body(flag, &c, 4096).unwrap().unwrap(),
            &data[..4096]
        );
        assert_eq!(
            decompress_body(0x301, &z, 10).unwrap().as_deref(),
            Some(&b"hello"[..])
        );
    }

    #[test]
    fn zip_bomb_is_refused() {
        let zeros = vec![0u8; 8 * 1024 * 1024];
        for ty in ALL {
            let c = ty.compress(&zeros, 9).unwrap();
            assert!(c.len() < 100_000, "{ty:?} {}", c.len());
            let err = ty.decompress(&c, 1024 * 1024).unwrap_err();
            assert!(matches!(err, ProtoError::Compression(_)), "{ty:?}");
        }
    }

    #[test]
    fn garbage_is_an_error() {
        for ty in ALL {
            assert!(ty
                .decompress(b"definitely not compressed", 1 << 20)
                .is_err());
            assert!(ty.decompress(b"", 1 << 20).is_err() || ty == CompressionType::Lz4);
        }
    }
}
