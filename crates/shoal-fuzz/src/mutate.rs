//! Byte-level mutations of valid inputs, the way mutation fuzzers damage seeds: bit flips, byte
//! changes, insertions, deletions, truncation, duplication, and "interesting" integers (0, -1,
//! limits, powers of two) written over length fields in big-endian order.
//!
//! A mutation is data ([`Mutation`]) so that a property-testing driver can generate, record and
//! shrink it; positions are taken modulo the input's length, so every mutation applies to every
//! input.

/// 32-bit values that break length and count fields: zero, one, negative, the frame limits
/// and their neighbours, the extremes.
pub const INTERESTING_32: &[i32] = &[
    0,
    1,
    -1,
    3,
    4,
    5,
    16,
    127,
    128,
    255,
    256,
    0x7fff,
    0x8000,
    0xffff,
    0x1_0000,
    0x00ff_ffff,
    16 * 1024 * 1024 - 4,
    16 * 1024 * 1024,
    16 * 1024 * 1024 + 1,
    0x0100_0000, // serialize type 1 with header length 0
    0x0100_0010,
    i32::MAX - 3,
    i32::MAX,
    i32::MIN,
];

/// 16-bit values for short length fields (properties, keys).
pub const INTERESTING_16: &[i16] = &[0, 1, -1, 2, 127, 128, 255, 256, 0x7fff, i16::MIN];

/// One change to an input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mutation {
    /// Flip bit `bit % 8` of the byte at `at`.
    FlipBit {
        /// Position (modulo the length).
        at: usize,
        /// Bit number (modulo 8).
        bit: u8,
    },
    /// Replace the byte at `at`.
    SetByte {
        /// Position (modulo the length).
        at: usize,
        /// New value.
        byte: u8,
    },
    /// Insert bytes before `at`.
    Insert {
        /// Position (modulo the length + 1).
        at: usize,
        /// Bytes to insert.
        bytes: Vec<u8>,
    },
    /// Remove up to `len` bytes from `at`.
    Remove {
        /// Position (modulo the length).
        at: usize,
        /// Bytes to remove (fewer at the end).
        len: usize,
    },
    /// Cut the input at `at`.
    Truncate {
        /// New length (modulo the length + 1).
        at: usize,
    },
    /// Repeat the `len` bytes at `at` right after them.
    Duplicate {
        /// Position (modulo the length).
        at: usize,
        /// Bytes to repeat (fewer at the end; at most 4096).
        len: usize,
    },
    /// Write `INTERESTING_32[which]` big-endian over the 4 bytes at `at`.
    Int32 {
        /// Position (modulo the length).
        at: usize,
        /// Index into [`INTERESTING_32`] (modulo its length).
        which: usize,
    },
    /// Write `INTERESTING_16[which]` big-endian over the 2 bytes at `at`.
    Int16 {
        /// Position (modulo the length).
        at: usize,
        /// Index into [`INTERESTING_16`] (modulo its length).
        which: usize,
    },
}

fn overwrite(input: &mut [u8], at: usize, bytes: &[u8]) {
    for (i, b) in bytes.iter().enumerate() {
        if let Some(slot) = input.get_mut(at + i) {
            *slot = *b;
        }
    }
}

/// Applies `m` to `input` (a mutation of an empty input only inserts).
pub fn apply(input: &mut Vec<u8>, m: &Mutation) {
    let len = input.len();
    match m {
        Mutation::Insert { at, bytes } => {
            let at = at % (len + 1);
            input.splice(at..at, bytes.iter().copied());
        }
        Mutation::Truncate { at } => input.truncate(at % (len + 1)),
        _ if len == 0 => {}
        Mutation::FlipBit { at, bit } => input[at % len] ^= 1 << (bit % 8),
        Mutation::SetByte { at, byte } => input[at % len] = *byte,
        Mutation::Remove { at, len: n } => {
            let at = at % len;
            let end = at.saturating_add(*n).min(len);
            input.drain(at..end);
        }
        Mutation::Duplicate { at, len: n } => {
            let at = at % len;
            let end = at.saturating_add((*n).min(4096)).min(len);
            let copy = input[at..end].to_vec();
            input.splice(end..end, copy);
        }
        Mutation::Int32 { at, which } => {
            let v = INTERESTING_32[which % INTERESTING_32.len()];
            overwrite(input, at % len, &v.to_be_bytes());
        }
        Mutation::Int16 { at, which } => {
            let v = INTERESTING_16[which % INTERESTING_16.len()];
            overwrite(input, at % len, &v.to_be_bytes());
        }
    }
}

/// `seed` with every mutation of `mutations` applied in order.
pub fn mutated(seed: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut out = seed.to_vec();
    for m in mutations {
        apply(&mut out, m);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_change_what_they_say() {
        let seed = [0u8, 1, 2, 3, 4, 5];
        let m = |m: Mutation| mutated(&seed, &[m]);
        assert_eq!(m(Mutation::FlipBit { at: 7, bit: 9 }), [0, 3, 2, 3, 4, 5]);
        assert_eq!(m(Mutation::SetByte { at: 0, byte: 9 }), [9, 1, 2, 3, 4, 5]);
        assert_eq!(
            m(Mutation::Insert {
                at: 6,
                bytes: vec![7]
            }),
            [0, 1, 2, 3, 4, 5, 7]
        );
        assert_eq!(m(Mutation::Remove { at: 4, len: 9 }), [0, 1, 2, 3]);
        assert_eq!(m(Mutation::Truncate { at: 2 }), [0, 1]);
        assert_eq!(
            m(Mutation::Duplicate { at: 4, len: 2 }),
            [0, 1, 2, 3, 4, 5, 4, 5]
        );
        assert_eq!(
            m(Mutation::Int32 { at: 1, which: 2 }),
            [0, 255, 255, 255, 255, 5]
        );
        assert_eq!(
            m(Mutation::Int32 { at: 4, which: 2 }),
            [0, 1, 2, 3, 255, 255]
        );
        assert_eq!(m(Mutation::Int16 { at: 0, which: 1 }), [0, 1, 2, 3, 4, 5]);
        assert_eq!(
            mutated(&[], &[Mutation::SetByte { at: 3, byte: 1 }]),
            [0u8; 0]
        );
    }
}
