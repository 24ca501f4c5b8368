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
mod tests {
    use super::super::json_header::{decode_json_header, decode_json_header_reference};
    use super::*;
    use crate::ProtoError;
    use proptest::prelude::*;

    fn entries(cmd: &RemotingCommand) -> Option<Vec<(String, String)>> {
        cmd.ext_fields.as_ref().map(|m| {
            m.iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        })
    }

    /// Equal commands with their extFields in the same order.
    fn identical(a: &RemotingCommand, b: &RemotingCommand) -> bool {
        a == b && entries(a) == entries(b)
    }

    /// The full decoder and serde alone give the same answer for `header`, and the fast path,
    /// when it answers, gives that answer too. Returns the fast path's answer.
    fn check(header: &[u8]) -> std::result::Result<Option<RemotingCommand>, String> {
        let reference = decode_json_header_reference(header);
        let fast = super::super::decode_json_header_fast(header);
        if let Some(f) = &fast {
            match &reference {
                Ok(r) if identical(f, r) => {}
                Ok(r) => return Err(format!("fast path {f:?}\nserde {r:?}")),
                Err(e) => return Err(format!("fast path accepted {f:?}, serde refused: {e}")),
            }
        }
        match (decode_json_header(header), &reference) {
            (Ok(a), Ok(b)) if identical(&a, b) => Ok(fast),
            (Err(a), Err(b)) if a == *b => Ok(fast),
            (a, b) => Err(format!("decoder {a:?}\nserde {b:?}")),
        }
    }

    fn fast(header: &str) -> Option<RemotingCommand> {
        check(header.as_bytes()).unwrap_or_else(|e| panic!("{header:?}: {e}"))
    }

    #[track_caller]
    fn handled(header: &str) -> RemotingCommand {
        fast(header).unwrap_or_else(|| panic!("fast path left {header:?} to serde"))
    }

    #[track_caller]
    fn falls_back(header: &str) {
        assert!(fast(header).is_none(), "fast path took {header:?}");
    }

    fn serde_error(header: &str) -> String {
        match decode_json_header(header.as_bytes()) {
            Err(ProtoError::Json { reason, .. }) => reason,
            other => panic!("{header:?}: {other:?}"),
        }
    }

    fn ext_of(header: &str) -> Vec<(String, String)> {
        entries(&handled(header)).expect("extFields present")
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn one_letter_keys_are_read_as_any_key() {
        // The shortcut for `"x":` must not take a quote, a backslash or a multi-byte character
        // for a key, nor miss a key followed by whitespace.
        assert_eq!(
            ext_of(
                r#"{"extFields":{"a":"1","é":"2","b" :"3","c":4,"d":null,"\\":"5","\"":"6","e":"7"}}"#
            ),
            pairs(&[
                ("a", "1"),
                ("é", "2"),
                ("b", "3"),
                ("c", "4"),
                ("\\", "5"),
                ("\"", "6"),
                ("e", "7")
            ])
        );
        assert_eq!(
            ext_of(r#"{"extFields":{"a":"1","a":"2","":"3"}}"#),
            pairs(&[("a", "2"), ("", "3")])
        );
        falls_back(r#"{"extFields":{"a":"1",""#);
    }

    #[test]
    fn java_headers_take_the_fast_path() {
        let send = handled(
            r#"{"code":310,"extFields":{"a":"PG","b":"T","c":"TBW102","d":"4","e":"1","f":"0","g":"1700000000000","h":"0","i":"UNIQ_KEY\u0001ABC\u0002WAIT\u0001true\u0002TAGS\u0001tagA\u0002","j":"0","k":"false","m":"false","n":"broker-a"},"flag":0,"language":"JAVA","opaque":7,"serializeTypeCurrentRPC":"JSON","version":479}"#,
        );
        assert_eq!(
            (send.code, send.flag, send.opaque, send.version),
            (310, 0, 7, 479)
        );
        assert_eq!(send.language, LanguageCode::Java);
        assert_eq!(send.remark, None);
        assert_eq!(
            send.ext("i"),
            Some("UNIQ_KEY\u{1}ABC\u{2}WAIT\u{1}true\u{2}TAGS\u{1}tagA\u{2}")
        );
        assert_eq!(send.ext_fields.as_ref().map(ExtFields::len), Some(13));
        let answer = handled(
            r#"{"code":0,"extFields":{"msgId":"7F00000100002A9F0000000000000000","queueId":"1","queueOffset":"0"},"flag":1,"language":"JAVA","opaque":7,"remark":"ok","serializeTypeCurrentRPC":"JSON","version":479}"#,
        );
        assert_eq!(answer.remark.as_deref(), Some("ok"));
        assert_eq!(answer.ext("queueOffset"), Some("0"));
        // Defaults, empty objects, whitespace around every token.
        let empty = handled("{}");
        assert_eq!(
            (empty.code, empty.language, empty.ext_fields),
            (0, LanguageCode::Java, None)
        );
        assert_eq!(handled(" \r\n\t{ } \n").code, 0);
        assert_eq!(
            handled(r#"{"extFields":{ }}"#).ext_fields,
            Some(ExtFields::new())
        );
        let spaced = handled(
            " {\n \"code\" :\t1 ,\r\"extFields\" : { \"a\" : \"b\" ,\"c\":2\n} , \"remark\" :\"r\" }\n\n",
        );
        assert_eq!(spaced.code, 1);
        assert_eq!(spaced.remark.as_deref(), Some("r"));
        assert_eq!(entries(&spaced), Some(pairs(&[("a", "b"), ("c", "2")])));
    }

    #[test]
    fn int_fields_as_json_and_as_strings() {
        assert_eq!(handled(r#"{"code":-2147483648}"#).code, i32::MIN);
        assert_eq!(handled(r#"{"code":2147483647}"#).code, i32::MAX);
        assert_eq!(handled(r#"{"code":0,"flag":null}"#).flag, 0);
        // As JsonInt reads a string: trimmed (Unicode whitespace too), sign, leading zeros.
        for (text, want) in [
            (r#""310""#, 310),
            (r#"" 310 \n""#, 310),
            (r#""+5""#, 5),
            (r#""-0""#, 0),
            (r#""007""#, 7),
            (r#""\u0031\u0032""#, 12),
            (r#""\u00a0\u30009""#, 9),
            (r#""-2147483648""#, i32::MIN),
        ] {
            assert_eq!(
                handled(&format!(r#"{{"opaque":{text}}}"#)).opaque,
                want,
                "{text}"
            );
        }
        for bad in [
            "2147483648",
            "-2147483649",
            "1.0",
            "1e2",
            "1E2",
            "-0",
            "01",
            "-",
            "+1",
            "1234567890123456789",
            "true",
            "[]",
            "{}",
            r#""x""#,
            r#""""#,
            r#""2147483648""#,
            r#""1_0""#,
            "nul",
        ] {
            falls_back(&format!(r#"{{"version":{bad}}}"#));
        }
    }

    #[test]
    fn language_by_known_name_only() {
        assert_eq!(
            handled(r#"{"language":"NODE_JS"}"#).language,
            LanguageCode::NodeJs
        );
        assert_eq!(
            handled(r#"{"language":"R\u0055ST"}"#).language,
            LanguageCode::Rust
        );
        assert_eq!(handled(r#"{"language":null}"#).language, LanguageCode::Java);
        for odd in [r#""COBOL""#, r#""java""#, "12", "-1", "true", "1.5", "[]"] {
            falls_back(&format!(r#"{{"language":{odd}}}"#));
        }
    }

    #[test]
    fn remarks_and_string_escapes() {
        let r = handled(
            r#"{"remark":"a\"b\\c\/d\b\f\n\r\t\u0000\u001F\u00e9\u00E9\uD83D\uDE00\ud83d\ude00é😀"}"#,
        );
        assert_eq!(
            r.remark.as_deref(),
            Some("a\"b\\c/d\u{8}\u{c}\n\r\t\u{0}\u{1f}éé😀😀é😀")
        );
        assert_eq!(handled(r#"{"remark":null}"#).remark, None);
        assert_eq!(handled(r#"{"remark":""}"#).remark.as_deref(), Some(""));
        for bad in [
            r#""\ud800""#,
            r#""\udc00""#,
            r#""\ud800\u0041""#,
            r#""\ud800\ud800""#,
            r#""\ud800x""#,
            r#""\ud800\n""#,
            r#""\x""#,
            r#""\u12""#,
            r#""\u12G4""#,
            r#""\'""#,
            "\"a\u{1}b\"",
            "\"a\tb\"",
            "\"a\u{1f}\"",
            r#""unterminated"#,
            "5",
            "true",
        ] {
            falls_back(&format!(r#"{{"remark":{bad}}}"#));
        }
        // Non-ASCII and U+007F pass through as is; long runs cross the eight-byte scan.
        let long = "ab\u{7f}cdéfghijklmnop😀qrstuvwxyz0123456789".repeat(5);
        assert_eq!(
            handled(&format!(r#"{{"remark":"{long}"}}"#)).remark,
            Some(long)
        );
    }

    #[test]
    fn ext_field_values() {
        assert_eq!(
            ext_of(
                r#"{"extFields":{"s":"x\u0001y","i":-3,"z":0,"big":123456789012345678,"t":true,"f":false,"n":null,"e":""}}"#
            ),
            pairs(&[
                ("s", "x\u{1}y"),
                ("i", "-3"),
                ("z", "0"),
                ("big", "123456789012345678"),
                ("t", "true"),
                ("f", "false"),
                ("e", ""),
            ])
        );
        // Keys with escapes; a repeated key replaces the value in place; a later null keeps
        // the earlier value.
        assert_eq!(
            ext_of(r#"{"extFields":{"k\"\u00e9":"1","a":"2","k\"é":"3","a":null,"b":null}}"#),
            pairs(&[("k\"é", "3"), ("a", "2")])
        );
        assert_eq!(
            handled(r#"{"extFields":{"only":null}}"#).ext_fields,
            Some(ExtFields::new())
        );
        assert_eq!(handled(r#"{"extFields":null}"#).ext_fields, None);
        for bad in [
            "1234567890123456789",
            "-1234567890123456789",
            "18446744073709551616",
            "-0",
            "01",
            "1.5",
            "1e5",
            "-1E5",
            r#"{"k":1}"#,
            "[1]",
            "[]",
            "{}",
            "tru",
            "nulll",
            "True",
            r#""\ud800""#,
        ] {
            falls_back(&format!(r#"{{"extFields":{{"a":"1","b":{bad}}}}}"#));
        }
        for bad in [
            r#"[1]"#,
            r#""x""#,
            "5",
            "true",
            r#"{"a":"b",}"#,
            r#"{"a" "b"}"#,
            r#"{a:"b"}"#,
            r#"{"a":"b""#,
            r#"{,}"#,
        ] {
            falls_back(&format!(r#"{{"extFields":{bad}}}"#));
        }
    }

    #[test]
    fn other_keys_are_skipped_when_scalar() {
        let c = handled(
            r#"{"serializeTypeCurrentRPC":"JSON","x":1,"y":-2,"z":true,"w":false,"v":null,"u":"\n","serializeTypeCurrentRPC":"ROCKETMQ","code":5}"#,
        );
        assert_eq!(c.code, 5);
        // A key that spells a field through escapes is that field.
        assert_eq!(handled(r#"{"c\u006fde":7}"#).code, 7);
        for value in ["1.5", "-0", "[1]", r#"{"a":1}"#, r#""\ud800""#, "1e3", "01"] {
            falls_back(&format!(r#"{{"other":{value},"code":1}}"#));
        }
    }

    #[test]
    fn repeated_fields_are_left_to_serde() {
        for field in [
            "code",
            "language",
            "version",
            "opaque",
            "flag",
            "remark",
            "extFields",
        ] {
            let header = format!(r#"{{"{field}":null,"{field}":null}}"#);
            falls_back(&header);
            let reason = serde_error(&header);
            assert!(reason.contains("duplicate field"), "{reason}");
        }
    }

    #[test]
    fn anything_else_is_left_to_serde() {
        for bad in [
            "",
            " ",
            "[]",
            "null",
            "{",
            "}",
            "{}x",
            "{} {}",
            "{},",
            "\u{feff}{}",
            "{}\u{a0}",
            "{\u{b}}",
            r#"{"code":1,}"#,
            r#"{"code":1 "flag":0}"#,
            r#"{"code"}"#,
            r#"{"code":}"#,
            r#"{1:2}"#,
            r#"{"code":1}}"#,
            r#"{'code':1}"#,
            "{\"co\nde\":1}",
        ] {
            falls_back(bad);
        }
        // Invalid UTF-8 is refused before either decoder.
        assert_eq!(
            super::super::decode_json_header_fast(b"{\"remark\":\"\xff\"}"),
            None
        );
        assert!(matches!(check(b"{\"remark\":\"\xc3\"}"), Ok(None)));
        assert!(matches!(
            decode_json_header(b"{\"remark\":\"\xc3\"}"),
            Err(ProtoError::Utf8(_))
        ));
    }

    #[test]
    fn plain_strings_are_shared_with_the_header_and_escaped_ones_decoded() {
        // Keys and values without escapes (and numbers, booleans) are not copied: the map's
        // own text stays empty.
        let value = "v".repeat(5000);
        let header =
            format!(r#"{{"code":1,"extFields":{{"k":"{value}","n":7,"t":true}},"flag":0}}"#);
        let mut c = handled(&header);
        let ext = c.ext_fields.as_mut().expect("extFields");
        assert_eq!(ext.get("k"), Some(value.as_str()));
        assert_eq!(ext.get("n"), Some("7"));
        assert_eq!(ext.get("t"), Some("true"));
        assert_eq!(ext.raw_text().len(), 0);
        // Only the strings with escapes are decoded into the map's text; a null drops its key
        // (and any text decoded for it).
        let header =
            r#"{"extFields":{"a":"x\u0001y","b":"plain","c\n":"z","d\u0041":null,"e":"1"}}"#;
        let mut c = handled(header);
        let ext = c.ext_fields.as_mut().expect("extFields");
        let got: Vec<(&str, &str)> = ext.iter().collect();
        assert_eq!(
            got,
            [("a", "x\u{1}y"), ("b", "plain"), ("c\n", "z"), ("e", "1")]
        );
        assert_eq!(ext.raw_text().as_str(), "x\u{1}yc\n");
        // The map outlives the header text it was decoded from, and changes like any other.
        let mut owned = ext.clone();
        drop(c);
        owned.insert("b", "changed");
        owned.remove("a");
        assert_eq!(owned.get("b"), Some("changed"));
        assert_eq!(owned.get("e"), Some("1"));
        assert_eq!(owned.len(), 3);
    }

    #[test]
    fn special_bytes_are_found_in_every_position() {
        for len in 0..40 {
            for at in 0..=len {
                for special in [b'"', b'\\', 0u8, 0x1f, b'\n'] {
                    let mut bytes = vec![b'a'; len];
                    // Bytes that are close to the special ones but plain.
                    for (i, b) in bytes.iter_mut().enumerate() {
                        *b = [
                            b'a', 0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0xa2, 0xdc, 0xff,
                        ][i % 11];
                    }
                    if at < len {
                        bytes[at] = special;
                    }
                    for from in 0..=at {
                        assert_eq!(find_special(&bytes, from), at, "{bytes:?} from {from}");
                    }
                }
            }
        }
        for b in 0..=255u8 {
            assert_eq!(is_special(b), b == b'"' || b == b'\\' || b < 0x20, "{b}");
            let bytes = [b; 9];
            let want = if is_special(b) { 0 } else { 9 };
            assert_eq!(find_special(&bytes, 0), want, "{b}");
        }
    }

    // --- differential property tests -----------------------------------------------------

    /// A string as JSON text, each character written raw or escaped by the choices given;
    /// `oddity` may add something serde refuses (or that is rarely seen).
    fn render_string(s: &str, choices: &[u8], oddity: u8) -> String {
        let mut out = String::from("\"");
        for (i, c) in s.chars().enumerate() {
            let choice = choices.get(i % choices.len().max(1)).copied().unwrap_or(0);
            let hex = |out: &mut String, unit: u32| {
                if choice & 16 == 0 {
                    out.push_str(&format!("\\u{unit:04x}"));
                } else {
                    out.push_str(&format!("\\u{unit:04X}"));
                }
            };
            let as_unicode = choice % 8 == 0;
            match c {
                _ if as_unicode => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        hex(&mut out, u32::from(*unit));
                    }
                }
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '/' if choice % 2 == 0 => out.push_str("\\/"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => hex(&mut out, c as u32),
                c => out.push(c),
            }
        }
        out.push_str(match oddity {
            0 => "\\ud800",
            1 => "\\udc00",
            2 => "\\ud800\\u0041",
            3 => "\\ud800\\ud800",
            4 => "\\ud83d\\ude00",
            5 => "\\uDBFF\\uDFFF",
            6 => "\\x",
            7 => "\\u12",
            8 => "\u{1}",
            9 => "\\u0000",
            10 => "\t",
            _ => "",
        });
        out.push('"');
        out
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            3 => "[a-zA-Z0-9_ ]{0,12}",
            2 => "[ -~\u{0}-\u{1f}\u{7f}é\u{2028}\u{ffff}😀]{0,16}",
            1 => any::<String>(),
        ]
    }

    fn json_string() -> impl Strategy<Value = String> {
        (
            text(),
            proptest::collection::vec(any::<u8>(), 1..8),
            prop_oneof![60 => Just(255u8), 1 => 0u8..11],
        )
            .prop_map(|(s, choices, oddity)| render_string(&s, &choices, oddity))
    }

    /// Scalar and other values as JSON text, most of them ones the fast path takes.
    fn number() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => any::<i32>().prop_map(|v| v.to_string()),
            2 => any::<i64>().prop_map(|v| v.to_string()),
            1 => any::<u64>().prop_map(|v| v.to_string()),
            1 => "-?[0-9]{1,22}",
            1 => prop::sample::select(vec!["-0", "1.5", "-2.0", "1e5", "3E-2", "0.0", "1e400"])
                .prop_map(String::from),
        ]
    }

    fn odd_value() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            "[]",
            "{}",
            r#"{"k":[1,"v"]}"#,
            "[1,2]",
            "nul",
            "True",
            "\"unterminated",
            "",
        ])
        .prop_map(String::from)
    }

    fn int_value() -> impl Strategy<Value = String> {
        prop_oneof![
            40 => any::<i32>().prop_map(|v| v.to_string()),
            8 => (any::<i32>(), r"( |\\t|\+){0,2}", r"( |\\n|\\u00a0){0,2}")
                .prop_map(|(v, pre, post)| format!("\"{pre}{v}{post}\"")),
            3 => Just("null".to_string()),
            2 => number(),
            1 => json_string(),
            1 => prop::sample::select(vec!["true", "false", r#""\u0031""#, r#""007""#, r#""-0""#])
                .prop_map(String::from),
            1 => odd_value(),
        ]
    }

    fn language_value() -> impl Strategy<Value = String> {
        prop_oneof![
            40 => (0u8..14).prop_map(|c| {
                let name = LanguageCode::from_code(c).map_or("JAVA", LanguageCode::name);
                format!("\"{name}\"")
            }),
            3 => Just("null".to_string()),
            1 => prop::sample::select(vec![r#""COBOL""#, r#""java""#, "12", "-1", "99", "true", "1.5"])
                .prop_map(String::from),
            1 => odd_value(),
        ]
    }

    fn remark_value() -> impl Strategy<Value = String> {
        prop_oneof![
            30 => json_string(),
            3 => Just("null".to_string()),
            1 => number(),
            1 => odd_value(),
        ]
    }

    fn ext_value() -> impl Strategy<Value = String> {
        prop_oneof![
            60 => json_string(),
            8 => number(),
            3 => Just("true".to_string()),
            3 => Just("false".to_string()),
            6 => Just("null".to_string()),
            1 => odd_value(),
        ]
    }

    fn ext_key() -> impl Strategy<Value = String> {
        prop_oneof![
            // Few distinct keys, so that some repeat.
            3 => prop::sample::select(vec!["a", "b", "c", "queueId"])
                .prop_map(|k| format!("\"{k}\"")),
            3 => json_string(),
        ]
    }

    /// A value token or an object of `(key, value)` pairs, to be laid out with whitespace.
    #[derive(Debug, Clone)]
    enum Json {
        Token(String),
        Object(Vec<(String, Json)>),
    }

    fn ext_object() -> impl Strategy<Value = Json> {
        prop_oneof![
            40 => proptest::collection::vec((ext_key(), ext_value().prop_map(Json::Token)), 0..10)
                .prop_map(Json::Object),
            2 => Just(Json::Token("null".into())),
            1 => odd_value().prop_map(Json::Token),
            1 => json_string().prop_map(Json::Token),
        ]
    }

    fn header() -> impl Strategy<Value = Json> {
        let field = |name: &'static str, value: BoxedStrategy<Json>| {
            proptest::option::weighted(0.8, value.prop_map(move |v| (format!("\"{name}\""), v)))
        };
        let token = |s: BoxedStrategy<String>| s.prop_map(Json::Token).boxed();
        (
            (
                field("code", token(int_value().boxed())),
                field("language", token(language_value().boxed())),
                field("version", token(int_value().boxed())),
                field("opaque", token(int_value().boxed())),
                field("flag", token(int_value().boxed())),
                field("remark", token(remark_value().boxed())),
                field("extFields", ext_object().boxed()),
            ),
            proptest::collection::vec(
                prop_oneof![
                    12 => Just(("\"serializeTypeCurrentRPC\"".to_string(), Json::Token("\"JSON\"".into()))),
                    4 => (json_string(), ext_value().prop_map(Json::Token)),
                    1 => (json_string(), odd_value().prop_map(Json::Token)),
                    // A known field twice (serde's "duplicate field").
                    1 => (
                        prop::sample::select(vec!["\"code\"", "\"remark\"", "\"extFields\"", "\"c\\u006fde\""]),
                        Just(Json::Token("null".into())),
                    ).prop_map(|(k, v)| (k.to_string(), v)),
                ],
                0..3,
            ),
        )
            .prop_map(|((a, b, c, d, e, f, g), others)| {
                [a, b, c, d, e, f, g]
                    .into_iter()
                    .flatten()
                    .chain(others)
                    .collect::<Vec<_>>()
            })
            .prop_shuffle()
            .prop_map(Json::Object)
    }

    /// Lays `json` out, taking the whitespace before each token from `ws` in turn.
    fn lay_out(json: &Json, ws: &mut impl Iterator<Item = String>, out: &mut String) {
        fn space(ws: &mut impl Iterator<Item = String>, out: &mut String) {
            out.push_str(&ws.next().unwrap_or_default());
        }
        match json {
            Json::Token(t) => out.push_str(t),
            Json::Object(entries) => {
                out.push('{');
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        space(ws, out);
                        out.push(',');
                    }
                    space(ws, out);
                    out.push_str(k);
                    space(ws, out);
                    out.push(':');
                    space(ws, out);
                    lay_out(v, ws, out);
                }
                space(ws, out);
                out.push('}');
            }
        }
    }

    fn whitespace() -> impl Strategy<Value = String> {
        prop_oneof![
            2 => Just(String::new()),
            1 => "[ \t\n\r]{1,3}",
        ]
    }

    /// Something to insert at a random place, which may break the header.
    fn blemish() -> impl Strategy<Value = Option<(prop::sample::Index, &'static str)>> {
        prop_oneof![
            15 => Just(None),
            1 => (
                any::<prop::sample::Index>(),
                prop::sample::select(vec!["\u{a0}", "\u{b}", "\u{c}", "x", "\u{feff}", ",", ":", "\\"]),
            )
                .prop_map(Some),
        ]
    }

    /// A char boundary of `s` picked by `at`.
    fn boundary(s: &str, at: prop::sample::Index) -> usize {
        let ends: Vec<usize> = s.char_indices().map(|(i, _)| i).chain([s.len()]).collect();
        ends[at.index(ends.len())]
    }

    fn header_text() -> impl Strategy<Value = String> {
        (
            header(),
            proptest::collection::vec(whitespace(), 1..32),
            prop_oneof![60 => Just(""), 1 => Just("x"), 1 => Just(","), 1 => Just("}"), 1 => Just("{}")],
            prop_oneof![40 => Just(None), 1 => any::<prop::sample::Index>().prop_map(Some)],
            blemish(),
        )
            .prop_map(|(json, ws, trailer, cut, blemish)| {
                let mut ws = ws.into_iter().cycle();
                let mut out = ws.next().unwrap_or_default();
                lay_out(&json, &mut ws, &mut out);
                out.push_str(&ws.next().unwrap_or_default());
                out.push_str(trailer);
                if let Some((at, text)) = blemish {
                    out.insert_str(boundary(&out, at), text);
                }
                if let Some(cut) = cut {
                    out.truncate(boundary(&out, cut));
                }
                out
            })
    }

    prop_compose! {
        /// A command as Shoal (and Java) would send it.
        fn sendable()(
            code in any::<i32>(),
            language in 0u8..14,
            version in any::<i32>(),
            opaque in any::<i32>(),
            flag in any::<i32>(),
            remark in proptest::option::of(text()),
            ext in proptest::option::of(proptest::collection::vec((text(), text()), 0..16)),
        ) -> RemotingCommand {
            RemotingCommand {
                code,
                language: LanguageCode::from_code(language).unwrap_or_default(),
                version,
                opaque,
                flag,
                remark,
                ext_fields: ext.map(|e| e.into_iter().collect()),
                ext_fields_raw: None,
                serialize_type: SerializeType::Json,
                body: None,
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// On random headers (mostly well formed, some not), the decoder answers exactly as
        /// serde alone, and so does the fast path whenever it answers.
        #[test]
        fn fast_path_agrees_with_serde(text in header_text()) {
            if let Err(e) = check(text.as_bytes()) {
                return Err(TestCaseError::fail(format!("{text:?}: {e}")));
            }
        }

        /// Every header Shoal encodes takes the fast path.
        #[test]
        fn encoded_headers_take_the_fast_path(cmd in sendable()) {
            let mut h = bytes::BytesMut::new();
            cmd.encode_header(&mut h).expect("JSON encodes");
            let fast = check(&h).map_err(TestCaseError::fail)?;
            let Some(fast) = fast else {
                return Err(TestCaseError::fail(format!("left to serde: {:?}", String::from_utf8_lossy(&h))));
            };
            prop_assert!(identical(&fast, &cmd), "{:?}", fast);
        }

        /// Damaged headers (bytes changed, inserted, removed; UTF-8 broken) never make the two
        /// disagree, and never panic.
        #[test]
        fn damaged_headers_agree(
            cmd in sendable(),
            edits in proptest::collection::vec(
                (any::<prop::sample::Index>(), 0u8..3, prop::sample::select(
                    b"\"\\{}[],:01-.eEtfnu \n\x01\xc3\xa9\xff".to_vec())),
                1..5,
            ),
        ) {
            let mut h = bytes::BytesMut::new();
            cmd.encode_header(&mut h).expect("JSON encodes");
            let mut h = h.to_vec();
            for (at, kind, byte) in edits {
                let at = at.index(h.len() + 1);
                match kind {
                    0 if at < h.len() => h[at] = byte,
                    1 => h.insert(at, byte),
                    _ if at < h.len() => { h.remove(at); }
                    _ => {}
                }
            }
            if let Err(e) = check(&h) {
                return Err(TestCaseError::fail(format!("{:?}: {e}", String::from_utf8_lossy(&h))));
            }
        }
    }
}
