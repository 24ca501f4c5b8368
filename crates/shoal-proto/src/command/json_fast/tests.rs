//! The fast path against serde: Java's headers take it, everything else falls back, and
//! both agree on every header (property tests over generated and damaged headers).

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
    let header = format!(r#"{{"code":1,"extFields":{{"k":"{value}","n":7,"t":true}},"flag":0}}"#);
    let mut c = handled(&header);
    let ext = c.ext_fields.as_mut().expect("extFields");
    assert_eq!(ext.get("k"), Some(value.as_str()));
    assert_eq!(ext.get("n"), Some("7"));
    assert_eq!(ext.get("t"), Some("true"));
    assert_eq!(ext.raw_text().len(), 0);
    // Only the strings with escapes are decoded into the map's text; a null drops its key
    // (and any text decoded for it).
    let header = r#"{"extFields":{"a":"x\u0001y","b":"plain","c\n":"z","d\u0041":null,"e":"1"}}"#;
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
