//! The single-pass decoder for the JSON headers peers actually send, tried before serde.
//!
//! It reads the shape every RocketMQ client writes: one object whose keys are `code`,
//! `language`, `version`, `opaque`, `flag`, `remark`, `extFields` and others with scalar values
//! (`serializeTypeCurrentRPC`), `extFields` an object of strings, integers, booleans and `null`s.
//! Keys and values without escapes are not copied: the map refers to the header's bytes
//! (shared with the frame), and only strings with escapes are decoded into its own text.
//!
//! Whenever the input leaves that shape, or could be read in more than one way, [`decode`]
//! answers `None` and the caller runs the serde decoder, which stays the definition of what a
//! header means (and of every error). So the fast path only has to be exact on what it accepts:
//! a `Some` it returns is what the serde decoder returns for the same text. Everything else
//! (floats, exponents, `-0`, integers of 19 digits or more, nested values, lone surrogates,
//! invalid escapes, control characters, a duplicated known key, an unknown or numeric
//! `language`, an integer field out of `i32` range, trailing text) falls back.

use super::{ExtFields, LanguageCode, RemotingCommand, SerializeType};
use crate::ext_fields::Span;
use bytestring::ByteString;

/// Most bytes reserved at once for the decoded text of extFields strings with escapes (the
/// rest of the header bounds it; a larger map grows as it is read).
const EXT_TEXT_RESERVE_MAX: usize = 64 * 1024;

/// Most digits of an integer the fast path reads: any such integer fits `i64` and `u64`, so
/// serde_json reports it as one (and extFields shows it as written).
const MAX_DIGITS: usize = 18;

/// Decodes `header` when it has the common shape; `None` means "not handled here" (use
/// serde). The extFields decoded share `header`'s bytes.
pub(super) fn decode(header: &ByteString) -> Option<RemotingCommand> {
    let text: &str = header;
    let mut p = Parser {
        text,
        bytes: text.as_bytes(),
        pos: 0,
    };
    let mut cmd = RemotingCommand {
        code: 0,
        language: LanguageCode::Java,
        version: 0,
        opaque: 0,
        flag: 0,
        remark: None,
        ext_fields: None,
        ext_fields_raw: None,
        serialize_type: SerializeType::Json,
        body: None,
    };
    // Known keys met so far: serde refuses a duplicated one ("duplicate field"), so the fast
    // path leaves that error to it.
    let mut seen = 0u8;
    let mut scratch = String::new();
    p.ws();
    p.expect(b'{')?;
    p.ws();
    if p.peek() == Some(b'}') {
        p.pos += 1;
    } else {
        loop {
            p.expect(b'"')?;
            let field = match p.known_key() {
                Some(field) => field,
                None => match p.string(&mut scratch)? {
                    "code" => Field::Code,
                    "extFields" => Field::ExtFields,
                    "flag" => Field::Flag,
                    "language" => Field::Language,
                    "opaque" => Field::Opaque,
                    "remark" => Field::Remark,
                    "version" => Field::Version,
                    _ => Field::Other,
                },
            };
            p.ws();
            p.expect(b':')?;
            p.ws();
            let bit = field.bit();
            if seen & bit != 0 {
                return None;
            }
            seen |= bit;
            match field {
                Field::Code => p.int_field(&mut cmd.code, &mut scratch)?,
                Field::Version => p.int_field(&mut cmd.version, &mut scratch)?,
                Field::Opaque => p.int_field(&mut cmd.opaque, &mut scratch)?,
                Field::Flag => p.int_field(&mut cmd.flag, &mut scratch)?,
                Field::Language => {
                    if !p.null() {
                        p.expect(b'"')?;
                        cmd.language = LanguageCode::from_name(p.string(&mut scratch)?)?;
                    }
                }
                Field::Remark => {
                    if !p.null() {
                        p.expect(b'"')?;
                        cmd.remark = Some(p.string(&mut scratch)?.to_owned());
                    }
                }
                Field::ExtFields => {
                    if !p.null() {
                        cmd.ext_fields = Some(p.ext_fields(header)?);
                    }
                }
                Field::Other => p.skip_scalar(&mut scratch)?,
            }
            p.ws();
            match p.next()? {
                b',' => p.ws(),
                b'}' => break,
                _ => return None,
            }
        }
    }
    p.ws();
    (p.pos == p.bytes.len()).then_some(cmd)
}

#[derive(Clone, Copy)]
enum Field {
    Code,
    ExtFields,
    Flag,
    Language,
    Opaque,
    Remark,
    Version,
    Other,
}

impl Field {
    /// The field's bit among those seen (0 for keys serde ignores, which may repeat).
    fn bit(self) -> u8 {
        match self {
            Field::Code => 1,
            Field::ExtFields => 2,
            Field::Flag => 4,
            Field::Language => 8,
            Field::Opaque => 16,
            Field::Remark => 32,
            Field::Version => 64,
            Field::Other => 0,
        }
    }
}

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.pos += 1;
        Some(b)
    }

    fn expect(&mut self, b: u8) -> Option<()> {
        (self.next()? == b).then_some(())
    }

    /// Skips JSON whitespace (space, tab, line feed, carriage return).
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    /// Consumes `lit` when the input continues with it. The length is a constant, so the
    /// comparison is a few loads, not a call to `memcmp`.
    #[inline(always)]
    fn literal<const N: usize>(&mut self, lit: &[u8; N]) -> bool {
        let found = self
            .bytes
            .get(self.pos..self.pos + N)
            .is_some_and(|b| b == lit);
        if found {
            self.pos += lit.len();
        }
        found
    }

    /// A key every client writes, as written (no escapes), with its closing quote: consumed
    /// and named by its first byte and one comparison. `None` leaves the key to be read as any
    /// string.
    #[inline]
    fn known_key(&mut self) -> Option<Field> {
        let (found, field) = match self.peek()? {
            b'c' => (self.literal(b"code\""), Field::Code),
            b'e' => (self.literal(b"extFields\""), Field::ExtFields),
            b'f' => (self.literal(b"flag\""), Field::Flag),
            b'l' => (self.literal(b"language\""), Field::Language),
            b'o' => (self.literal(b"opaque\""), Field::Opaque),
            b'r' => (self.literal(b"remark\""), Field::Remark),
            b's' => (self.literal(b"serializeTypeCurrentRPC\""), Field::Other),
            b'v' => (self.literal(b"version\""), Field::Version),
            _ => return None,
        };
        found.then_some(field)
    }

    /// Consumes a `null` when there is one.
    fn null(&mut self) -> bool {
        self.literal(b"null")
    }

    /// An integer as serde_json reads one into `u64`/`i64`: optional minus, no leading zeros,
    /// no fraction or exponent, at most [`MAX_DIGITS`] digits, not `-0` (a float to serde_json).
    /// Consumed only when it is one.
    #[inline]
    fn integer(&mut self) -> Option<i64> {
        let bytes = self.bytes;
        let negative = bytes.get(self.pos) == Some(&b'-');
        let digits = self.pos + usize::from(negative);
        let mut i = digits;
        let mut value: i64 = 0;
        while let Some(&b) = bytes.get(i) {
            let d = b.wrapping_sub(b'0');
            if d > 9 {
                break;
            }
            if i - digits == MAX_DIGITS {
                return None;
            }
            value = value * 10 + i64::from(d);
            i += 1;
        }
        let len = i - digits;
        if len == 0 || (len > 1 && bytes[digits] == b'0') || (negative && value == 0) {
            return None;
        }
        if let Some(b'.' | b'e' | b'E') = bytes.get(i) {
            return None;
        }
        self.pos = i;
        Some(if negative { -value } else { value })
    }

    /// An `int` header field (as `JsonInt` reads it): `null` leaves `out` as it is, a JSON
    /// integer or a string holding one sets it.
    fn int_field(&mut self, out: &mut i32, scratch: &mut String) -> Option<()> {
        match self.peek()? {
            b'n' => self.null().then_some(()),
            b'"' => {
                self.pos += 1;
                *out = self.string(scratch)?.trim().parse::<i32>().ok()?;
                Some(())
            }
            _ => {
                let v = self.integer()?;
                *out = i32::try_from(v).ok()?;
                Some(())
            }
        }
    }

    /// The value of a key serde ignores: a string, an integer, `true`, `false` or `null`.
    fn skip_scalar(&mut self, scratch: &mut String) -> Option<()> {
        match self.peek()? {
            b'"' => {
                self.pos += 1;
                self.string(scratch).map(drop)
            }
            b'-' | b'0'..=b'9' => self.integer().map(drop),
            _ => (self.literal(b"true") || self.literal(b"false") || self.null()).then_some(()),
        }
    }

    /// The extFields object (at its `{`): string, integer and boolean values as text, `null`s
    /// dropped (keeping an earlier value of the same key), a repeated key's value replacing the
    /// earlier one in place, as `ExtFields::commit_raw` does for the serde decoder too. Keys
    /// and values without escapes stay in `header` (the map shares it); only strings with
    /// escapes are decoded into the map's own text.
    ///
    /// The shape every client writes (`"key":"value"` pairs without whitespace or escapes) is
    /// read by the first branch of each step; anything else by the general one.
    fn ext_fields(&mut self, header: &ByteString) -> Option<ExtFields> {
        self.expect(b'{')?;
        self.ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Some(ExtFields::new());
        }
        // About 16 bytes of header per entry.
        let entries = (self.bytes.len() - self.pos).div_ceil(16).min(64);
        let mut out = ExtFields::decoding(header.clone(), entries);
        loop {
            self.expect(b'"')?;
            let mark = out.raw_text().len();
            let key_start = self.pos;
            // A one-letter key with its colon (SEND_MESSAGE_V2's `"a":` to `"n":`) is taken as
            // it is, without a search for its closing quote.
            let (key, plain_key, key_end) = match self.bytes.get(key_start..key_start + 3) {
                Some(&[k, b'"', b':']) if !is_special(k) => {
                    self.pos += 3;
                    let key_end = key_start + 1;
                    (ExtFields::shared_span(key_start..key_end), true, key_end)
                }
                _ => {
                    let (key, plain_key) = match self.plain_string() {
                        Some(end) => (ExtFields::shared_span(key_start..end), true),
                        None => (self.string_span(&mut out)?, false),
                    };
                    let key_end = self.pos - 1;
                    if self.peek() == Some(b':') {
                        self.pos += 1;
                    } else {
                        self.ws();
                        self.expect(b':')?;
                    }
                    (key, plain_key, key_end)
                }
            };
            self.ws();
            let start = self.pos;
            let value = match self.peek()? {
                b'"' => {
                    self.pos += 1;
                    match self.plain_string() {
                        Some(end) => Some(ExtFields::shared_span(start + 1..end)),
                        None => Some(self.string_span(&mut out)?),
                    }
                }
                b'-' | b'0'..=b'9' => {
                    self.integer()?;
                    Some(ExtFields::shared_span(start..self.pos))
                }
                _ if self.literal(b"true") || self.literal(b"false") => {
                    Some(ExtFields::shared_span(start..self.pos))
                }
                _ if self.null() => None,
                _ => return None,
            };
            match value {
                Some(value) if plain_key => {
                    out.record_decoded(key, &self.bytes[key_start..key_end], value);
                }
                Some(value) => out.commit_spans(key, value),
                None => out.truncate_raw(mark),
            }
            match self.next()? {
                b',' => {}
                b'}' => return Some(out),
                b' ' | b'\n' | b'\t' | b'\r' => {
                    self.ws();
                    match self.next()? {
                        b',' => {}
                        b'}' => return Some(out),
                        _ => return None,
                    }
                }
                _ => return None,
            }
            self.ws();
        }
    }

    /// A string without escapes (the opening quote consumed): consumed, and the index of its
    /// closing quote returned. `None` (nothing consumed) when it has an escape or a control
    /// character, or does not end.
    #[inline(always)]
    fn plain_string(&mut self) -> Option<usize> {
        let end = find_special(self.bytes, self.pos);
        if self.bytes.get(end) == Some(&b'"') {
            self.pos = end + 1;
            Some(end)
        } else {
            None
        }
    }

    /// A string (the opening quote consumed) as a span of the map: of the header when it has
    /// no escapes, else of the map's own text, where it is decoded.
    #[inline]
    fn string_span(&mut self, out: &mut ExtFields) -> Option<Span> {
        let start = self.pos;
        let end = find_special(self.bytes, start);
        if self.bytes.get(end) == Some(&b'"') {
            self.pos = end + 1;
            return Some(ExtFields::shared_span(start..end));
        }
        let text = out.raw_text();
        if text.capacity() == 0 {
            // The first string with escapes: what is decoded from here on is never longer than
            // the rest of the header, so that is reserved (up to a cap) once.
            text.reserve((self.bytes.len() - start).min(EXT_TEXT_RESERVE_MAX));
        }
        let owned = text.len();
        self.string_into(text)?;
        Some(out.owned_span(owned))
    }

    /// A string's contents (the opening quote consumed): borrowed from the input when it has
    /// no escapes, else decoded into `scratch`.
    fn string<'s>(&mut self, scratch: &'s mut String) -> Option<&'s str>
    where
        'a: 's,
    {
        let start = self.pos;
        let end = find_special(self.bytes, start);
        if self.bytes.get(end) == Some(&b'"') {
            self.pos = end + 1;
            let text: &'a str = self.text;
            return text.get(start..end);
        }
        scratch.clear();
        self.string_into(scratch)?;
        Some(scratch.as_str())
    }

    /// Appends a string's decoded contents (the opening quote consumed) to `out`.
    #[inline]
    fn string_into(&mut self, out: &mut String) -> Option<()> {
        let start = self.pos;
        let end = find_special(self.bytes, start);
        // `end` is at an ASCII byte or the end, so always at a character boundary.
        out.push_str(self.text.get(start..end)?);
        self.pos = end + 1;
        match self.bytes.get(end)? {
            b'"' => Some(()),
            b'\\' => self.string_rest_into(out),
            _ => None, // a control character
        }
    }

    /// The rest of a string from just after a backslash, for [`Parser::string_into`]: kept out
    /// of line, so that the common string without escapes stays short.
    #[cold]
    #[inline(never)]
    fn string_rest_into(&mut self, out: &mut String) -> Option<()> {
        loop {
            // `\u00XX` below 0x80 (RocketMQ's property separators are `\u0001` and `\u0002`)
            // is one byte; the other escapes take the general path.
            match self.bytes.get(self.pos..self.pos + 5) {
                Some(&[b'u', b'0', b'0', high, low])
                    if HEX[usize::from(high)] < 8 && HEX[usize::from(low)] < 16 =>
                {
                    out.push(char::from(
                        HEX[usize::from(high)] * 16 + HEX[usize::from(low)],
                    ));
                    self.pos += 5;
                }
                _ => out.push(self.escape()?),
            }
            let start = self.pos;
            let end = find_special(self.bytes, start);
            if end > start {
                out.push_str(self.text.get(start..end)?);
            }
            self.pos = end + 1;
            match self.bytes.get(end)? {
                b'"' => return Some(()),
                b'\\' => {}
                _ => return None,
            }
        }
    }

    /// The character an escape (after its backslash) stands for, as serde_json decodes it for
    /// a `str`: the short forms, and `\uXXXX` with surrogates only as a high-low pair.
    fn escape(&mut self) -> Option<char> {
        Some(match self.next()? {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let n = self.hex4()?;
                match n {
                    0xD800..=0xDBFF => {
                        if !self.literal(b"\\u") {
                            return None;
                        }
                        let low = self.hex4()?;
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return None;
                        }
                        char::from_u32(0x1_0000 + ((n - 0xD800) << 10) + (low - 0xDC00))?
                    }
                    _ => char::from_u32(n)?, // None for a lone low surrogate
                }
            }
            _ => return None,
        })
    }

    /// Four hex digits (either case).
    fn hex4(&mut self) -> Option<u32> {
        let digits = self.bytes.get(self.pos..self.pos + 4)?;
        let mut n = 0;
        for &d in digits {
            let v = HEX[usize::from(d)];
            if v > 15 {
                return None;
            }
            n = n * 16 + u32::from(v);
        }
        self.pos += 4;
        Some(n)
    }
}

/// Per byte, its value as a hex digit (either case), or 255.
const HEX: [u8; 256] = {
    let mut table = [255u8; 256];
    let mut d = 0;
    while d < 10 {
        table[b'0' as usize + d] = d as u8;
        d += 1;
    }
    let mut d = 0;
    while d < 6 {
        table[b'a' as usize + d] = 10 + d as u8;
        table[b'A' as usize + d] = 10 + d as u8;
        d += 1;
    }
    table
};

/// Per byte, how a JSON string writes it: 0 as itself, else the letter after the backslash of
/// its escape (`u` for `\u00XX`). The bytes with an escape are `"`, `\` and control characters.
pub(super) const ESCAPE: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = b'u';
        b += 1;
    }
    table[0x08] = b'b';
    table[0x0c] = b'f';
    table[b'\n' as usize] = b'n';
    table[b'\r' as usize] = b'r';
    table[b'\t' as usize] = b't';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

/// A byte that cannot stand for itself inside a JSON string: `"`, `\` or a control character.
#[inline]
pub(super) fn is_special(b: u8) -> bool {
    ESCAPE[usize::from(b)] != 0
}

/// The index of the first byte at or after `from` for which [`is_special`] holds, or
/// `bytes.len()`. Looks at eight bytes at a time.
#[inline]
pub(super) fn find_special(bytes: &[u8], from: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH_BITS: u64 = 0x8080_8080_8080_8080;
    let mut i = from;
    while let Some(chunk) = bytes.get(i..i + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let w = u64::from_le_bytes(word);
        let quote = w ^ (ONES * u64::from(b'"'));
        let backslash = w ^ (ONES * u64::from(b'\\'));
        // Per byte: the high bit is set in (x - n) & !x when x < n (n <= 128). Borrows only
        // run upwards from a byte that matches, so the lowest flagged byte is the first match.
        let found = ((w.wrapping_sub(ONES * 0x20) & !w)
            | (quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash))
            & HIGH_BITS;
        if found != 0 {
            return i + (found.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while let Some(&b) = bytes.get(i) {
        if is_special(b) {
            break;
        }
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests;
