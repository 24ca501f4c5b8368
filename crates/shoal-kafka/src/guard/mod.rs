//! Declared lengths checked before a request body reaches `kafka-protocol`'s decoder.
//!
//! kafka-protocol 0.18 reserves `Vec` capacity for an array's declared element count before it
//! reads a single element (`Vec::with_capacity(n)` in `Array`/`CompactArray`), so a frame of a
//! few bytes declaring a 2^31-element array makes the process reserve hundreds of GiB (and
//! abort where the allocation fails). Every element of a Kafka array takes at least one byte,
//! so a declared count larger than the bytes left cannot be a real request. [`check_request`]
//! walks a body by the layout of its message ([`shapes`]: fields and the versions they appear
//! in, as kafka-protocol decodes them) and refuses such a count, and any string, byte or
//! tagged-field length past the end, before the decoder runs. The walk allocates nothing.
//!
//! Record batches inside Produce are checked separately ([`crate::records`]).

mod shapes;

pub(crate) use shapes::request_shape;

use std::fmt;

/// Field sizes and kinds of a message layout.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ty {
    /// A fixed-size value (int8/bool 1, int16 2, int32 4, int64/float64 8, uuid 16 bytes).
    Fixed(usize),
    /// A string: int16 length (-1 null) or, in flexible versions, unsigned varint length + 1.
    Str,
    /// Bytes: int32 length (-1 null) or, in flexible versions, unsigned varint length + 1.
    Bytes,
    /// An array: int32 count (-1 null) or, in flexible versions, unsigned varint count + 1.
    Array(&'static Ty),
    /// A nested structure.
    Struct(&'static Shape),
}

/// One field: the versions it is present in and its kind.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Field {
    lo: i16,
    hi: i16,
    ty: Ty,
}

/// A tagged field kafka-protocol decodes by its content (not skipped by size) from `lo` on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tagged {
    tag: u32,
    lo: i16,
    ty: Ty,
}

/// The layout of one message structure.
#[derive(Debug)]
pub(crate) struct Shape {
    fields: &'static [Field],
    tagged: &'static [Tagged],
}

/// Versions without an upper bound.
const MAX: i16 = i16::MAX;
/// "Never flexible" (SaslHandshake).
const NEVER: i16 = i16::MAX;

const fn f(lo: i16, hi: i16, ty: Ty) -> Field {
    Field { lo, hi, ty }
}

const fn t(tag: u32, lo: i16, ty: Ty) -> Tagged {
    Tagged { tag, lo, ty }
}

/// Why a request body was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    /// Byte offset in the body where the bad length starts.
    pub at: usize,
    /// What was wrong.
    pub what: String,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (at body byte {})", self.what, self.at)
    }
}

struct Walker<'a> {
    buf: &'a [u8],
    pos: usize,
    version: i16,
    flexible: bool,
}

impl Walker<'_> {
    fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn refuse<T>(&self, at: usize, what: String) -> Result<T, Refused> {
        Err(Refused { at, what })
    }

    fn take(&mut self, n: usize, what: &str) -> Result<(), Refused> {
        if n > self.left() {
            return self.refuse(
                self.pos,
                format!(
                    "{what} of {n} bytes declared with {} bytes left",
                    self.left()
                ),
            );
        }
        self.pos += n;
        Ok(())
    }

    fn int(&mut self, width: usize) -> Result<i64, Refused> {
        let at = self.pos;
        self.take(width, "length")?;
        let b = &self.buf[at..at + width];
        Ok(match width {
            2 => i64::from(i16::from_be_bytes([b[0], b[1]])),
            _ => i64::from(i32::from_be_bytes([b[0], b[1], b[2], b[3]])),
        })
    }

    fn uvarint(&mut self) -> Result<u64, Refused> {
        let at = self.pos;
        let mut v: u64 = 0;
        for i in 0..5 {
            let Some(&b) = self.buf.get(self.pos) else {
                return self.refuse(at, "varint past the end of the request".into());
            };
            self.pos += 1;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        self.refuse(at, "varint longer than 5 bytes".into())
    }

    /// A length prefix: `Some(n)` or `None` for null. Flexible versions use varint n+1.
    fn length(&mut self, width: usize) -> Result<Option<u64>, Refused> {
        let at = self.pos;
        if self.flexible {
            let n = self.uvarint()?;
            return Ok(n.checked_sub(1));
        }
        match self.int(width)? {
            -1 => Ok(None),
            n if n < 0 => self.refuse(at, format!("negative length {n}")),
            n => Ok(Some(n as u64)),
        }
    }

    fn value(&mut self, ty: Ty) -> Result<(), Refused> {
        match ty {
            Ty::Fixed(n) => self.take(n, "field"),
            Ty::Str | Ty::Bytes => {
                let width = if matches!(ty, Ty::Str) { 2 } else { 4 };
                if let Some(n) = self.length(width)? {
                    let n = usize::try_from(n).unwrap_or(usize::MAX);
                    self.take(n, if width == 2 { "string" } else { "bytes" })?;
                }
                Ok(())
            }
            Ty::Array(elem) => {
                let at = self.pos;
                let Some(n) = self.length(4)? else {
                    return Ok(());
                };
                if n > self.left() as u64 {
                    return self.refuse(
                        at,
                        format!(
                            "array of {n} elements declared with {} bytes left",
                            self.left()
                        ),
                    );
                }
                for _ in 0..n {
                    self.value(*elem)?;
                }
                Ok(())
            }
            Ty::Struct(shape) => self.shape(shape),
        }
    }

    fn shape(&mut self, shape: &Shape) -> Result<(), Refused> {
        let v = self.version;
        for field in shape.fields {
            if field.lo <= v && v <= field.hi {
                self.value(field.ty)?;
            }
        }
        if !self.flexible {
            return Ok(());
        }
        let at = self.pos;
        let count = self.uvarint()?;
        if count > self.left() as u64 {
            return self.refuse(
                at,
                format!(
                    "{count} tagged fields declared with {} bytes left",
                    self.left()
                ),
            );
        }
        for _ in 0..count {
            let tag = self.uvarint()?;
            let size = self.uvarint()?;
            // kafka-protocol reads a known tag by its content and skips an unknown one by
            // its size: walk the same way so both see the same bytes next.
            match shape.tagged.iter().find(|t| u64::from(t.tag) == tag) {
                Some(known) if known.lo <= v => self.value(known.ty)?,
                _ => self.take(usize::try_from(size).unwrap_or(usize::MAX), "tagged field")?,
            }
        }
        Ok(())
    }
}

/// Checks a request body (after the request header) of `key` at `version`: every declared
/// array count fits the bytes left, and every string, bytes and tagged-field length ends
/// inside the body. `Ok` for APIs without a layout here (the decoder's own checks apply).
pub(crate) fn check_request(
    key: kafka_protocol::messages::ApiKey,
    version: i16,
    body: &[u8],
) -> Result<(), Refused> {
    let Some((shape, flexible_from)) = request_shape(key) else {
        return Ok(());
    };
    let mut w = Walker {
        buf: body,
        pos: 0,
        version,
        flexible: version >= flexible_from,
    };
    w.shape(shape)
}

#[cfg(test)]
mod tests;
