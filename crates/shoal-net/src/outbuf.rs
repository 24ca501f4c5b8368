//! [`OutBuf`]: encoded frames waiting to be written on one connection, kept so that everything
//! ready at one moment goes out in one vectored write.
//!
//! Small frames are encoded back to back into one growing buffer (reused once written); a large
//! body (a pull answer's stored records) is not copied but kept as its own chunk after its
//! frame's header.

use crate::NetError;
use bytes::{BufMut, Bytes, BytesMut};
use shoal_proto::command::MAX_HEADER_LEN;
use shoal_proto::{ProtoError, RemotingCommand};
use std::collections::VecDeque;
use std::io::IoSlice;

/// Bodies at least this long are written from their own bytes instead of being copied.
const ZERO_COPY_BODY: usize = 16 * 1024;

/// Initial size of the buffer small frames are encoded into.
const TAIL_CAPACITY: usize = 16 * 1024;

/// Most slices handed to one vectored write (Linux's IOV_MAX is 1024).
pub(crate) const MAX_IOV: usize = 64;

/// Frames waiting to be written, in order.
#[derive(Debug, Default)]
pub(crate) struct OutBuf {
    chunks: VecDeque<Bytes>,
    tail: BytesMut,
    len: usize,
}

impl OutBuf {
    /// Bytes waiting.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `cmd` as one frame, refusing frames over `max_frame_len` (nothing is appended
    /// then).
    pub(crate) fn push_command(
        &mut self,
        cmd: &RemotingCommand,
        max_frame_len: usize,
    ) -> Result<(), NetError> {
        if self.tail.capacity() - self.tail.len() < 512 {
            self.tail.reserve(TAIL_CAPACITY);
        }
        let start = self.tail.len();
        let body = cmd.body.as_ref().filter(|b| !b.is_empty());
        let body_len = body.map_or(0, Bytes::len);
        self.tail.put_u64(0); // length and header-length words, patched below
        if let Err(e) = cmd.encode_header(&mut self.tail) {
            self.tail.truncate(start);
            return Err(e.into());
        }
        let header_len = self.tail.len() - start - 8;
        let frame_len = 8 + header_len + body_len;
        let max = max_frame_len.min(i32::MAX as usize);
        if header_len > MAX_HEADER_LEN || frame_len > max {
            self.tail.truncate(start);
            return Err(ProtoError::FrameTooLarge {
                len: frame_len,
                max,
            }
            .into());
        }
        let word = (u32::from(cmd.serialize_type.code()) << 24) | header_len as u32;
        self.tail[start..start + 4].copy_from_slice(&((frame_len - 4) as u32).to_be_bytes());
        self.tail[start + 4..start + 8].copy_from_slice(&word.to_be_bytes());
        match body {
            Some(body) if body_len >= ZERO_COPY_BODY => {
                let head = self.tail.split().freeze();
                self.chunks.push_back(head);
                self.chunks.push_back(body.clone());
            }
            Some(body) => self.tail.extend_from_slice(body),
            None => {}
        }
        self.len += frame_len;
        Ok(())
    }

    /// Moves everything waiting to the end of `dst` (the writer's queue).
    pub(crate) fn take_into(&mut self, dst: &mut Writing) {
        dst.chunks.append(&mut self.chunks);
        if !self.tail.is_empty() {
            dst.chunks.push_back(self.tail.split().freeze());
        }
        dst.len += self.len;
        self.len = 0;
    }
}

/// What the connection's writer is writing now.
#[derive(Debug, Default)]
pub(crate) struct Writing {
    chunks: VecDeque<Bytes>,
    len: usize,
}

impl Writing {
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Fills `out` with up to [`MAX_IOV`] slices of what is left, in order; returns how many.
    pub(crate) fn fill<'a>(&'a self, out: &mut [IoSlice<'a>; MAX_IOV]) -> usize {
        let mut n = 0;
        for (slot, chunk) in out.iter_mut().zip(self.chunks.iter()) {
            *slot = IoSlice::new(chunk);
            n += 1;
        }
        n
    }

    /// Drops the first `n` bytes (written).
    pub(crate) fn advance(&mut self, mut n: usize) {
        self.len -= n.min(self.len);
        while n > 0 {
            let Some(front) = self.chunks.front_mut() else {
                return;
            };
            if n >= front.len() {
                n -= front.len();
                self.chunks.pop_front();
            } else {
                let _ = front.split_to(n);
                n = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RemotingCodec;
    use tokio_util::codec::Decoder;

    fn decode_all(w: &Writing) -> Vec<RemotingCommand> {
        let mut wire = BytesMut::new();
        for c in &w.chunks {
            wire.extend_from_slice(c);
        }
        let mut codec = RemotingCodec::default();
        let mut out = Vec::new();
        while let Some(cmd) = codec.decode(&mut wire).unwrap() {
            out.push(cmd);
        }
        assert!(wire.is_empty());
        out
    }

    #[test]
    fn frames_small_and_large_come_out_in_order_and_decode() {
        let mut buf = OutBuf::default();
        let a = RemotingCommand::request(10)
            .with_opaque(1)
            .with_body(&b"x"[..]);
        let big = RemotingCommand::response(0, Some("FOUND".into()))
            .with_opaque(2)
            .with_body(vec![7u8; 100_000]);
        let mut c = RemotingCommand::request(11).with_opaque(3);
        c.serialize_type = shoal_proto::SerializeType::RocketMq;
        for cmd in [&a, &big, &c] {
            buf.push_command(cmd, 1 << 24).unwrap();
        }
        let expected_len = [&a, &big, &c]
            .iter()
            .map(|c| c.to_frame().unwrap().len())
            .sum::<usize>();
        assert_eq!(buf.len(), expected_len);
        let mut w = Writing::default();
        buf.take_into(&mut w);
        assert!(buf.is_empty());
        assert_eq!(w.len(), expected_len);
        // The large body is its own chunk, not a copy.
        assert!(w.chunks.iter().any(|ch| ch.len() == 100_000));
        assert_eq!(decode_all(&w), vec![a, big, c]);
        // Written in odd pieces, the rest still decodes.
        let mut slices = [IoSlice::new(&[]); MAX_IOV];
        assert_eq!(w.fill(&mut slices), w.chunks.len());
        w.advance(3);
        w.advance(w.len());
        assert!(w.is_empty());
        assert!(w.chunks.is_empty());
    }

    #[test]
    fn frames_over_the_limit_are_refused_and_leave_nothing() {
        let mut buf = OutBuf::default();
        buf.push_command(&RemotingCommand::request(1), 1024)
            .unwrap();
        let before = buf.len();
        let big = RemotingCommand::request(2).with_body(vec![0u8; 2000]);
        let err = buf.push_command(&big, 1024).unwrap_err();
        assert!(matches!(
            err,
            NetError::Protocol(ProtoError::FrameTooLarge { max: 1024, .. })
        ));
        assert_eq!(buf.len(), before);
        let mut w = Writing::default();
        buf.take_into(&mut w);
        assert_eq!(decode_all(&w), vec![RemotingCommand::request(1)]);
    }
}
