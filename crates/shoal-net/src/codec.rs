//! [`RemotingCodec`]: a `tokio_util::codec` Decoder/Encoder for whole remoting frames.

use crate::NetError;
use bytes::{Buf, Bytes, BytesMut};
use shoal_proto::command::MAX_FRAME_LEN;
use shoal_proto::{ProtoError, RemotingCommand};
use tokio_util::codec::{Decoder, Encoder};

/// Frames [`RemotingCommand`]s on a byte stream: `int32 length | int32 (type<<24)|hdrLen |
/// header | body`, decoding JSON and ROCKETMQ headers and encoding each command with its own
/// [`RemotingCommand::serialize_type`].
///
/// `max_frame_len` counts the 4-byte length field, as Java's `frameMaxLength` does. A frame over
/// the limit, in either direction, is an error ([`ProtoError::FrameTooLarge`]); on the decoding
/// side the stream is then out of sync and the connection must be closed (the
/// [`Connection`](crate::Connection) does so).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemotingCodec {
    max_frame_len: usize,
}

impl RemotingCodec {
    /// A codec with the given frame limit (bytes, including the length field).
    pub fn new(max_frame_len: usize) -> Self {
        Self { max_frame_len }
    }

    /// The frame limit in bytes, including the length field.
    pub fn max_frame_len(&self) -> usize {
        self.max_frame_len
    }

    /// Encodes `cmd` as one frame into new bytes, refusing frames over the limit.
    ///
    /// # Errors
    /// [`NetError::Protocol`] when the command cannot be encoded or its frame is over the limit.
    pub fn encode_frame(&self, cmd: &RemotingCommand) -> Result<Bytes, NetError> {
        let mut dst = BytesMut::new();
        self.encode_into(cmd, &mut dst)?;
        Ok(dst.freeze())
    }

    /// Appends `cmd` as one frame to `dst`, refusing frames over the limit (nothing is
    /// appended on error).
    ///
    /// # Errors
    /// As [`RemotingCodec::encode_frame`].
    pub fn encode_into(&self, cmd: &RemotingCommand, dst: &mut BytesMut) -> Result<(), NetError> {
        let start = dst.len();
        cmd.encode(dst)?;
        let len = dst.len() - start;
        if len > self.max_frame_len {
            dst.truncate(start);
            return Err(ProtoError::FrameTooLarge {
                len,
                max: self.max_frame_len,
            }
            .into());
        }
        Ok(())
    }
}

impl Default for RemotingCodec {
    /// The Java default limit, [`MAX_FRAME_LEN`] (16 MiB).
    fn default() -> Self {
        Self::new(MAX_FRAME_LEN)
    }
}

impl Decoder for RemotingCodec {
    type Item = RemotingCommand;
    type Error = NetError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<RemotingCommand>, NetError> {
        let Some(len) = src.get(..4) else {
            return Ok(None);
        };
        let declared = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
        let body_len = check_frame_length(declared, self.max_frame_len)?;
        // No room is reserved for the declared length: the buffer grows as bytes arrive.
        if src.len() < 4 + body_len {
            return Ok(None);
        }
        src.advance(4);
        let frame = src.split_to(body_len).freeze();
        Ok(Some(RemotingCommand::decode(frame)?))
    }
}

/// Validates the frame length field `declared` (which excludes its own 4 bytes) against the
/// limit (which includes them), before any buffer is set aside for the frame; returns the
/// bytes that follow the length field.
pub(crate) fn check_frame_length(declared: i32, max_frame_len: usize) -> Result<usize, ProtoError> {
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

impl Encoder<&RemotingCommand> for RemotingCodec {
    type Error = NetError;

    fn encode(&mut self, cmd: &RemotingCommand, dst: &mut BytesMut) -> Result<(), NetError> {
        self.encode_into(cmd, dst)
    }
}

impl Encoder<RemotingCommand> for RemotingCodec {
    type Error = NetError;

    fn encode(&mut self, cmd: RemotingCommand, dst: &mut BytesMut) -> Result<(), NetError> {
        self.encode_into(&cmd, dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_frames_split_anywhere_and_back_to_back() {
        let mut codec = RemotingCodec::default();
        let a = RemotingCommand::request(10)
            .with_opaque(1)
            .with_body(&b"x"[..]);
        let mut b = RemotingCommand::response(0, Some("ok".into())).with_opaque(1);
        b.serialize_type = shoal_proto::SerializeType::RocketMq;
        let mut wire = BytesMut::new();
        codec.encode(&a, &mut wire).unwrap();
        codec.encode(b.clone(), &mut wire).unwrap();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for byte in wire.iter() {
            buf.extend_from_slice(&[*byte]);
            while let Some(cmd) = codec.decode(&mut buf).unwrap() {
                out.push(cmd);
            }
        }
        assert_eq!(out, vec![a, b]);
        assert!(buf.is_empty());
    }

    #[test]
    fn a_declared_length_reserves_nothing() {
        let mut codec = RemotingCodec::default();
        let mut buf = BytesMut::with_capacity(64);
        buf.extend_from_slice(&(15i32 << 20).to_be_bytes());
        buf.extend_from_slice(&[0u8; 10]);
        assert!(codec.decode(&mut buf).unwrap().is_none());
        assert!(buf.capacity() < 1024, "capacity {}", buf.capacity());
    }

    #[test]
    fn limits_apply_both_ways() {
        let mut codec = RemotingCodec::new(64);
        let big = RemotingCommand::request(10).with_body(vec![0u8; 100]);
        let mut dst = BytesMut::from(&b"prefix"[..]);
        let err = codec.encode(&big, &mut dst).unwrap_err();
        assert!(matches!(
            err,
            NetError::Protocol(ProtoError::FrameTooLarge { max: 64, .. })
        ));
        assert_eq!(&dst[..], b"prefix");
        let wire = RemotingCodec::default().encode_frame(&big).unwrap();
        let err = codec.decode(&mut BytesMut::from(&wire[..])).unwrap_err();
        assert!(matches!(
            err,
            NetError::Protocol(ProtoError::FrameTooLarge { max: 64, .. })
        ));
    }
}
