//! Decoding JSON headers: the single-pass fast path (`json_fast.rs`) for the shape every
//! client sends, serde for everything else (it defines what every other input means, and
//! every error).

use super::json_fast;
use super::{ExtFields, LanguageCode, RemotingCommand, SerializeType, UNKNOWN_LANGUAGE};
use crate::{ProtoError, Result};
use bytes::Bytes;
use bytestring::ByteString;

#[derive(serde::Deserialize)]
struct JsonHeaderIn {
    code: Option<JsonInt>,
    language: Option<JsonLanguage>,
    version: Option<JsonInt>,
    opaque: Option<JsonInt>,
    flag: Option<JsonInt>,
    remark: Option<String>,
    #[serde(rename = "extFields")]
    ext_fields: Option<JsonExtFields>,
}

/// A JSON header given as a slice (copied once, then as [`decode_json_header_shared`]).
pub(super) fn decode_json_header(header: &[u8]) -> Result<RemotingCommand> {
    decode_json_header_shared(Bytes::copy_from_slice(header))
}

/// A JSON header: the single-pass decoder for the common shape (whose extFields share
/// `header`), else serde (which defines the meaning of every other input, and every error).
#[inline]
pub(super) fn decode_json_header_shared(header: Bytes) -> Result<RemotingCommand> {
    let text = ByteString::try_from(header).map_err(|_| ProtoError::Utf8("JSON header"))?;
    match json_fast::decode(&text) {
        Some(cmd) => Ok(cmd),
        None => decode_json_header_serde(&text),
    }
}

/// The fast path of JSON header decoding alone, for differential tests and fuzzing: `None`
/// when it leaves the header to the serde decoder. Not an API.
#[doc(hidden)]
pub fn decode_json_header_fast(header: &[u8]) -> Option<RemotingCommand> {
    json_fast::decode(&ByteString::try_from(header).ok()?)
}

/// JSON header decoding by serde alone (what the fast path must agree with), for
/// differential tests and fuzzing. Not an API.
///
/// # Errors
/// As [`RemotingCommand::decode_header`].
#[doc(hidden)]
pub fn decode_json_header_reference(header: &[u8]) -> Result<RemotingCommand> {
    let text = std::str::from_utf8(header).map_err(|_| ProtoError::Utf8("JSON header"))?;
    decode_json_header_serde(text)
}

fn decode_json_header_serde(text: &str) -> Result<RemotingCommand> {
    let h: JsonHeaderIn = serde_json::from_str(text).map_err(|e| ProtoError::Json {
        what: "remoting command header",
        reason: e.to_string(),
    })?;
    let int = |v: Option<JsonInt>| v.map_or(0, |JsonInt(i)| i);
    Ok(RemotingCommand {
        code: int(h.code),
        language: h.language.map_or(LanguageCode::Java, |JsonLanguage(l)| l),
        version: int(h.version),
        opaque: int(h.opaque),
        flag: int(h.flag),
        remark: h.remark,
        ext_fields: h.ext_fields.map(|JsonExtFields(m)| m),
        ext_fields_raw: None,
        serialize_type: SerializeType::Json,
        body: None,
    })
}

/// An `int` header field: a JSON integer in `i32` range, or a string holding one.
struct JsonInt(i32);

impl<'de> serde::Deserialize<'de> for JsonInt {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = JsonInt;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a 32-bit integer")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<JsonInt, E> {
                i32::try_from(v)
                    .map(JsonInt)
                    .map_err(|_| E::custom(format!("integer {v} out of int32 range")))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<JsonInt, E> {
                i32::try_from(v)
                    .map(JsonInt)
                    .map_err(|_| E::custom(format!("integer {v} out of int32 range")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<JsonInt, E> {
                v.trim()
                    .parse::<i32>()
                    .map(JsonInt)
                    .map_err(|_| E::custom(format!("{v:?} is not a 32-bit integer")))
            }
        }
        d.deserialize_any(V)
    }
}

/// The `language` field: an enum name, or (leniently) its numeric code.
struct JsonLanguage(LanguageCode);

impl<'de> serde::Deserialize<'de> for JsonLanguage {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = JsonLanguage;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a language name")
            }
            fn visit_str<E: serde::de::Error>(
                self,
                v: &str,
            ) -> std::result::Result<Self::Value, E> {
                Ok(JsonLanguage(
                    LanguageCode::from_name(v).unwrap_or(UNKNOWN_LANGUAGE),
                ))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<Self::Value, E> {
                Ok(JsonLanguage(
                    u8::try_from(v)
                        .ok()
                        .and_then(LanguageCode::from_code)
                        .unwrap_or(UNKNOWN_LANGUAGE),
                ))
            }
            fn visit_i64<E: serde::de::Error>(
                self,
                _v: i64,
            ) -> std::result::Result<Self::Value, E> {
                Ok(JsonLanguage(UNKNOWN_LANGUAGE))
            }
            fn visit_bool<E: serde::de::Error>(
                self,
                _v: bool,
            ) -> std::result::Result<Self::Value, E> {
                Ok(JsonLanguage(UNKNOWN_LANGUAGE))
            }
            fn visit_f64<E: serde::de::Error>(
                self,
                _v: f64,
            ) -> std::result::Result<Self::Value, E> {
                Ok(JsonLanguage(UNKNOWN_LANGUAGE))
            }
        }
        d.deserialize_any(V)
    }
}

/// The `extFields` object: scalar values become their string form, `null` values are dropped,
/// nested objects and arrays become their JSON text (as Java's coercion does). Keys and values
/// are written straight into the map's one text buffer.
struct JsonExtFields(ExtFields);

impl<'de> serde::Deserialize<'de> for JsonExtFields {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = JsonExtFields;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object of string values")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut out = ExtFields::with_capacity(map.size_hint().unwrap_or(16).min(64));
                loop {
                    let key_start = out.raw_text().len();
                    if map.next_key_seed(AppendStr(out.raw_text()))?.is_none() {
                        break;
                    }
                    let value_start = out.raw_text().len();
                    if map.next_value_seed(AppendScalar(out.raw_text()))? {
                        out.commit_raw(key_start, value_start);
                    } else {
                        out.truncate_raw(key_start);
                    }
                }
                Ok(JsonExtFields(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// Appends a JSON string (an extFields key) to the buffer.
struct AppendStr<'a>(&'a mut String);

impl<'de> serde::de::DeserializeSeed<'de> for AppendStr<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        struct V<'a>(&'a mut String);
        impl serde::de::Visitor<'_> for V<'_> {
            type Value = ();
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string key")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<(), E> {
                self.0.push_str(v);
                Ok(())
            }
        }
        d.deserialize_str(V(self.0))
    }
}

/// Appends one extFields value in string form to the buffer; `false` for `null` (nothing
/// appended).
struct AppendScalar<'a>(&'a mut String);

impl<'de> serde::de::DeserializeSeed<'de> for AppendScalar<'_> {
    type Value = bool;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<bool, D::Error> {
        struct V<'a>(&'a mut String);
        impl V<'_> {
            fn display<E>(self, v: impl std::fmt::Display) -> std::result::Result<bool, E> {
                use std::fmt::Write;
                // Writing to a String cannot fail.
                let _ = write!(self.0, "{v}");
                Ok(true)
            }
        }
        impl<'de> serde::de::Visitor<'de> for V<'_> {
            type Value = bool;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<bool, E> {
                self.0.push_str(v);
                Ok(true)
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> std::result::Result<bool, E> {
                self.display(v)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<bool, E> {
                self.display(v)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<bool, E> {
                self.display(v)
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> std::result::Result<bool, E> {
                self.display(v)
            }
            fn visit_unit<E: serde::de::Error>(self) -> std::result::Result<bool, E> {
                Ok(false)
            }
            fn visit_none<E: serde::de::Error>(self) -> std::result::Result<bool, E> {
                Ok(false)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> std::result::Result<bool, A::Error> {
                let v: serde_json::Value = serde::Deserialize::deserialize(
                    serde::de::value::MapAccessDeserializer::new(map),
                )?;
                self.display(v)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> std::result::Result<bool, A::Error> {
                let v: serde_json::Value = serde::Deserialize::deserialize(
                    serde::de::value::SeqAccessDeserializer::new(seq),
                )?;
                self.display(v)
            }
        }
        d.deserialize_any(V(self.0))
    }
}
