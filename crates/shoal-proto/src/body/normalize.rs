//! Rewrites fastjson's non-standard JSON into standard JSON (spec section 3.1).
//!
//! fastjson writes `Map<Long,…>` with bare numeric keys (`{0:"addr"}`) and `Map<MessageQueue,…>`
//! with a JSON object as the key (`{{"brokerName":"b","queueId":0,"topic":"T"}:5}`). This module
//! turns every object key that is not a string into a string: bare tokens are quoted as they
//! are (`0` → `"0"`), object or array keys become a string holding their (normalised) JSON text
//! (`{…}` → `"{\"brokerName\":…}"`), which is also what fastjson accepts and what Shoal writes.
//! Everything else (strings, values, whitespace) is copied unchanged, so standard JSON comes
//! out byte for byte as it went in.
//!
//! The scanner only tracks structure; it does not validate numbers or literals (the JSON parser
//! that reads the output does). Malformed structure (unterminated strings, missing `:`,
//! unbalanced brackets, nesting deeper than [`MAX_DEPTH`]) is an error, never a panic.

use crate::{ProtoError, Result};

/// Maximum nesting of objects and arrays accepted (serde_json's own limit is 128).
pub const MAX_DEPTH: usize = 128;

/// Normalises fastjson output into standard JSON. See the module documentation.
pub fn normalize_fastjson(input: &[u8]) -> Result<Vec<u8>> {
    let mut scanner = Scanner { input, pos: 0 };
    let mut out = Vec::with_capacity(input.len() + 16);
    scanner.copy_ws(&mut out);
    scanner.value(&mut out, 0)?;
    scanner.copy_ws(&mut out);
    if scanner.pos != input.len() {
        return Err(scanner.error("trailing characters after the JSON value"));
    }
    Ok(out)
}

struct Scanner<'a> {
    input: &'a [u8],
    pos: usize,
}

impl Scanner<'_> {
    fn error(&self, what: &str) -> ProtoError {
        ProtoError::Json {
            what: "fastjson normaliser",
            reason: format!("{what} at byte {}", self.pos),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    fn copy_ws(&mut self, out: &mut Vec<u8>) {
        while let Some(b) = self.peek() {
            if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
                out.push(b);
                self.pos += 1;
            } else {
                break;
            }
        }
    }

    fn expect(&mut self, out: &mut Vec<u8>, byte: u8) -> Result<()> {
        if self.peek() == Some(byte) {
            out.push(byte);
            self.pos += 1;
            Ok(())
        } else {
            Err(self.error(&format!("expected `{}`", byte as char)))
        }
    }

    fn value(&mut self, out: &mut Vec<u8>, depth: usize) -> Result<()> {
        match self.peek() {
            Some(b'{') => self.object(out, depth + 1),
            Some(b'[') => self.array(out, depth + 1),
            Some(b'"') => self.string(out),
            Some(_) => self.token(out),
            None => Err(self.error("unexpected end of input")),
        }
    }

    /// A bare scalar (number, `true`, `null`, …): everything up to a delimiter.
    fn token(&mut self, out: &mut Vec<u8>) -> Result<()> {
        let start = self.pos;
        while let Some(b) = self.peek() {
            if matches!(
                b,
                b',' | b':' | b'{' | b'}' | b'[' | b']' | b'"' | b' ' | b'\t' | b'\n' | b'\r'
            ) {
                break;
            }
            self.pos += 1;
        }
        if self.pos == start {
            return Err(self.error("expected a value"));
        }
        out.extend_from_slice(&self.input[start..self.pos]);
        Ok(())
    }

    /// A string literal, copied verbatim including its quotes and escapes.
    fn string(&mut self, out: &mut Vec<u8>) -> Result<()> {
        let start = self.pos;
        self.pos += 1; // opening quote
        loop {
            match self.peek() {
                None => return Err(self.error("unterminated string")),
                Some(b'\\') => self.pos += 2,
                Some(b'"') => {
                    self.pos += 1;
                    break;
                }
                Some(_) => self.pos += 1,
            }
        }
        let end = self.pos.min(self.input.len());
        out.extend_from_slice(&self.input[start..end]);
        Ok(())
    }

    fn array(&mut self, out: &mut Vec<u8>, depth: usize) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(self.error("nesting too deep"));
        }
        self.expect(out, b'[')?;
        self.copy_ws(out);
        if self.peek() == Some(b']') {
            return self.expect(out, b']');
        }
        loop {
            self.value(out, depth)?;
            self.copy_ws(out);
            match self.peek() {
                Some(b',') => {
                    self.expect(out, b',')?;
                    self.copy_ws(out);
                }
                Some(b']') => return self.expect(out, b']'),
                _ => return Err(self.error("expected `,` or `]` in array")),
            }
        }
    }

    fn object(&mut self, out: &mut Vec<u8>, depth: usize) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(self.error("nesting too deep"));
        }
        self.expect(out, b'{')?;
        self.copy_ws(out);
        if self.peek() == Some(b'}') {
            return self.expect(out, b'}');
        }
        loop {
            self.key(out, depth)?;
            self.copy_ws(out);
            self.expect(out, b':')?;
            self.copy_ws(out);
            self.value(out, depth)?;
            self.copy_ws(out);
            match self.peek() {
                Some(b',') => {
                    self.expect(out, b',')?;
                    self.copy_ws(out);
                }
                Some(b'}') => return self.expect(out, b'}'),
                _ => return Err(self.error("expected `,` or `}` in object")),
            }
        }
    }

    /// An object key: strings are copied, anything else becomes a string of its JSON text.
    fn key(&mut self, out: &mut Vec<u8>, depth: usize) -> Result<()> {
        match self.peek() {
            Some(b'"') => self.string(out),
            Some(b'{') | Some(b'[') => {
                let mut inner = Vec::new();
                self.value(&mut inner, depth)?;
                push_json_string(out, &inner);
                Ok(())
            }
            Some(_) => {
                let mut inner = Vec::new();
                self.token(&mut inner)?;
                push_json_string(out, &inner);
                Ok(())
            }
            None => Err(self.error("unexpected end of input in object key")),
        }
    }
}

/// Appends `raw` as a JSON string literal (quotes added, `"` `\` and control bytes escaped).
/// Non-ASCII UTF-8 bytes are copied as they are.
fn push_json_string(out: &mut Vec<u8>, raw: &[u8]) {
    out.push(b'"');
    for &b in raw {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0..=0x1f => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MessageQueue;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn norm(s: &str) -> String {
        String::from_utf8(normalize_fastjson(s.as_bytes()).unwrap()).unwrap()
    }

    #[test]
    fn bare_numeric_keys_are_quoted() {
        assert_eq!(
            norm(r#"{"brokerAddrs":{0:"192.168.0.1:10911",1:"192.168.0.3:10911"}}"#),
            r#"{"brokerAddrs":{"0":"192.168.0.1:10911","1":"192.168.0.3:10911"}}"#
        );
        assert_eq!(norm(r#"{-1:2, 3 : 4}"#), r#"{"-1":2, "3" : 4}"#);
    }

    #[test]
    fn object_keys_become_strings() {
        let input = r#"{"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:5}}"#;
        let expected =
            r#"{"offsetTable":{"{\"brokerName\":\"broker-a\",\"queueId\":0,\"topic\":\"T\"}":5}}"#;
        assert_eq!(norm(input), expected);
        let v: serde_json::Value = serde_json::from_str(expected).unwrap();
        let key = v["offsetTable"]
            .as_object()
            .unwrap()
            .keys()
            .next()
            .unwrap()
            .clone();
        let mq: MessageQueue = serde_json::from_str(&key).unwrap();
        assert_eq!(mq, MessageQueue::new("T", "broker-a", 0));
    }

    #[test]
    fn strings_with_braces_colons_and_escapes_are_untouched() {
        let s = r#"{"a":"{0:1}","b\"{":"x\\\":{","c":["}",":{",1],"d":"\u0001"}"#;
        assert_eq!(norm(s), s);
        // A key object whose strings contain quotes, braces and escapes.
        let input = r#"{{"topic":"a\"}:{","queueId":1,"brokerName":"b\\"}:true}"#;
        let out = norm(input);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let key = v.as_object().unwrap().keys().next().unwrap().clone();
        let mq: MessageQueue = serde_json::from_str(&key).unwrap();
        assert_eq!(mq, MessageQueue::new("a\"}:{", "b\\", 1));
    }

    #[test]
    fn standard_json_is_unchanged() {
        for s in [
            "{}",
            "[]",
            " { \"a\" : [ 1 , 2.5e3 , -3 , true , null , \"x\" ] } ",
            r#"{"brokerDatas":[{"brokerAddrs":{"0":"a"}}],"filterServerTable":{}}"#,
            "\"just a string\"",
            "42",
        ] {
            assert_eq!(norm(s), s);
        }
    }

    #[test]
    fn malformed_structure_is_an_error() {
        for bad in [
            "",
            "{",
            "{\"a\"",
            "{\"a\":}",
            "{\"a\" 1}",
            "[1,",
            "[1 2]",
            "{\"a\":\"unterminated}",
            "{\"a\":1}}",
            "{{\"a\":1}}",
            "{:1}",
            "\"\\",
        ] {
            assert!(normalize_fastjson(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let deep = "[".repeat(100_000);
        assert!(normalize_fastjson(deep.as_bytes()).is_err());
        let deep_keys = "{".repeat(100_000);
        assert!(normalize_fastjson(deep_keys.as_bytes()).is_err());
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(normalize_fastjson(ok.as_bytes()).is_ok());
    }

    /// Writes a map the way fastjson does: bare numeric keys, object keys.
    fn fastjson_map(nums: &BTreeMap<i64, String>, mqs: &BTreeMap<MessageQueue, i64>) -> String {
        let nums: Vec<String> = nums
            .iter()
            .map(|(k, v)| format!("{k}:{}", serde_json::to_string(v).unwrap()))
            .collect();
        let mqs: Vec<String> = mqs
            .iter()
            .map(|(k, v)| format!("{}:{v}", serde_json::to_string(k).unwrap()))
            .collect();
        format!(
            "{{\"nums\":{{{}}},\"mqs\":{{{}}}}}",
            nums.join(","),
            mqs.join(",")
        )
    }

    fn mq_strategy() -> impl Strategy<Value = MessageQueue> {
        ("\\PC{0,8}", "[{}:,\"\\\\a-z]{0,8}", any::<i32>())
            .prop_map(|(t, b, q)| MessageQueue::new(t, b, q))
    }

    proptest! {
        #[test]
        fn normalised_fastjson_maps_parse_back(
            nums in proptest::collection::btree_map(any::<i64>(), "\\PC{0,10}", 0..6),
            mqs in proptest::collection::btree_map(mq_strategy(), any::<i64>(), 0..6),
        ) {
            let text = fastjson_map(&nums, &mqs);
            let out = normalize_fastjson(text.as_bytes()).unwrap();
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            let got_nums: BTreeMap<i64, String> =
                serde_json::from_value(v["nums"].clone()).unwrap();
            prop_assert_eq!(got_nums, nums);
            let mut got_mqs = BTreeMap::new();
            for (k, val) in v["mqs"].as_object().unwrap() {
                let mq: MessageQueue = serde_json::from_str(k).unwrap();
                got_mqs.insert(mq, val.as_i64().unwrap());
            }
            prop_assert_eq!(got_mqs, mqs);
        }

        #[test]
        fn standard_json_round_trips_unchanged(
            m in proptest::collection::btree_map("\\PC{0,6}", "\\PC{0,6}", 0..6)
        ) {
            let text = serde_json::to_string(&m).unwrap();
            let out = normalize_fastjson(text.as_bytes()).unwrap();
            prop_assert_eq!(out, text.into_bytes());
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = normalize_fastjson(&bytes);
        }

        #[test]
        fn json_like_text_never_panics(s in "[{}\\[\\]:,\"\\\\0-9a ]{0,40}") {
            let _ = normalize_fastjson(s.as_bytes());
        }
    }
}
