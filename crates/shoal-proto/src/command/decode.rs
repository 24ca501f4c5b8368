//! Reading commands: splitting frames off a stream and decoding them (the header by its form,
//! see `json_header.rs` and `rocketmq_header.rs`; the body as a slice of the frame).

use super::json_header::{decode_json_header, decode_json_header_shared};
use super::rocketmq_header::{
    decode_rocketmq_ext_fields, decode_rocketmq_fixed, decode_rocketmq_header, keepable_area,
};
use super::{RawExtFields, RemotingCommand, SerializeType, MAX_HEADER_LEN};
use crate::{ProtoError, Result};
use bytes::{Buf, Bytes, BytesMut};

#[cfg(doc)]
use super::{ExtFields, MAX_FRAME_LEN, UNKNOWN_LANGUAGE};

/// Splits one frame off the front of a stream buffer, as a length-delimited decoder does.
///
/// `src` holds bytes read from a connection, starting at a frame boundary. When it holds a
/// whole frame, the frame's 4-byte length field is consumed and the bytes after it (header-length
/// word, header and body) are returned, ready for [`RemotingCommand::decode`]. When more bytes
/// are needed, `Ok(None)` is returned and `src` is left as it was (with room reserved for the
/// rest of the frame).
///
/// `max_frame_len` counts the length field itself, as Java's `frameMaxLength` does
/// ([`MAX_FRAME_LEN`] = 16 MiB by default).
///
/// # Errors
/// A negative length, a length shorter than the header-length word (4), or a frame larger than
/// `max_frame_len`. After an error the stream is out of sync: close the connection.
pub fn split_frame(src: &mut BytesMut, max_frame_len: usize) -> Result<Option<Bytes>> {
    let Some(len_bytes) = src.get(..4) else {
        return Ok(None);
    };
    let declared = i32::from_be_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]);
    let body_len = check_frame_length(declared, max_frame_len)?;
    let total = body_len + 4;
    if src.len() < total {
        src.reserve(total - src.len());
        return Ok(None);
    }
    src.advance(4);
    Ok(Some(src.split_to(body_len).freeze()))
}

/// Validates the frame length field `declared` (which excludes its own 4 bytes) against the
/// limit and returns it as a `usize`.
fn check_frame_length(declared: i32, max_frame_len: usize) -> Result<usize> {
    if declared < 0 {
        return Err(ProtoError::BadLength(format!(
            "negative frame length {declared}"
        )));
    }
    let len = declared as usize;
    if len < 4 {
        return Err(ProtoError::BadLength(format!(
            "frame length {len} is shorter than the 4-byte header-length field"
        )));
    }
    if len + 4 > max_frame_len {
        return Err(ProtoError::FrameTooLarge {
            len: len + 4,
            max: max_frame_len,
        });
    }
    Ok(len)
}

impl RemotingCommand {
    /// Decodes one frame given the bytes after its length field (what [`split_frame`] or a
    /// length-delimited codec hands over): `int32 (type<<24)|hdrLen | header | body`.
    ///
    /// The body is a zero-copy slice of `frame`; an empty body decodes as `None`.
    ///
    /// # Errors
    /// A frame shorter than 4 bytes, a header length beyond the frame, an unknown serialize
    /// type, and any error of [`RemotingCommand::decode_header`].
    pub fn decode(frame: Bytes) -> Result<RemotingCommand> {
        Self::decode_with(frame, |_| false)
    }

    /// [`RemotingCommand::decode`], keeping the binary extFields area of a command that
    /// `keep_area` accepts as [`RawExtFields::BinaryArea`] in
    /// [`RemotingCommand::ext_fields_raw`] (no [`ExtFields`] built; `ext_fields` is `None`),
    /// when the area qualifies (see the variant); otherwise, and for JSON headers, the
    /// command is the one `decode` gives. `keep_area` is asked at most once, for a binary
    /// header with extFields, with the command's fixed fields (code, flag, opaque, ...;
    /// no extFields or body yet), so that a request can be told by its code and an answer
    /// by its opaque. A caller that keeps areas reads those commands' headers from either
    /// form.
    ///
    /// # Errors
    /// As [`RemotingCommand::decode`] (a kept area is one `decode` accepts).
    pub fn decode_with(
        frame: Bytes,
        keep_area: impl FnOnce(&RemotingCommand) -> bool,
    ) -> Result<RemotingCommand> {
        let Some(word) = frame.get(..4) else {
            return Err(ProtoError::Truncated {
                what: "frame header-length word",
                need: 4,
                have: frame.len(),
            });
        };
        let word = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        let serialize_type = SerializeType::from_code((word >> 24) as u8)?;
        let header_len = (word & MAX_HEADER_LEN as u32) as usize;
        let available = frame.len() - 4;
        if header_len > available {
            return Err(ProtoError::BadLength(format!(
                "header length {header_len} exceeds the {available} bytes left in the frame"
            )));
        }
        let mut cmd = match serialize_type {
            // The extFields share the frame's header bytes (see `ExtFields`).
            SerializeType::Json => decode_json_header_shared(frame.slice(4..4 + header_len))?,
            SerializeType::RocketMq => {
                let header = &frame[4..4 + header_len];
                let (mut cmd, area) = decode_rocketmq_fixed(header)?;
                let kept = (!area.is_empty() && keep_area(&cmd))
                    .then(|| keepable_area(&frame, area))
                    .flatten();
                match kept {
                    Some(area) => cmd.ext_fields_raw = Some(RawExtFields::BinaryArea(area)),
                    None if area.is_empty() => {}
                    None => cmd.ext_fields = decode_rocketmq_ext_fields(area)?,
                }
                cmd
            }
        };
        if frame.len() > 4 + header_len {
            cmd.body = Some(frame.slice(4 + header_len..));
        }
        Ok(cmd)
    }

    /// Decodes a header alone (the `hdrLen` bytes of a frame) of the given type. The result has
    /// no body.
    ///
    /// JSON (what Java's fastjson accepts): keys in any order, unknown keys ignored, every key
    /// optional (code/version/opaque/flag 0, language JAVA, no remark, no extFields), `null`
    /// treated as absent, integers also accepted as numeric strings, whitespace (e.g. a trailing
    /// newline) around the object allowed, extFields scalar values (numbers, booleans) turned
    /// into their string form and `null` values dropped, `language` by name or number with
    /// unknown values mapped to [`UNKNOWN_LANGUAGE`].
    ///
    /// ROCKETMQ binary: signed 16-bit code and version, zero-length remark/keys/values decode as
    /// absent (so an empty extFields decodes as `None`), bytes after the extFields area ignored
    /// (as Java does), unknown language codes mapped to [`UNKNOWN_LANGUAGE`].
    ///
    /// # Errors
    /// Invalid UTF-8, invalid JSON or JSON of the wrong shape, integers out of range, negative
    /// or overlong lengths in a binary header.
    pub fn decode_header(serialize_type: SerializeType, header: &[u8]) -> Result<RemotingCommand> {
        match serialize_type {
            SerializeType::Json => decode_json_header(header),
            SerializeType::RocketMq => decode_rocketmq_header(header),
        }
    }
}
