//! JSON bodies (spec sections 3 and 8) as serde types.
//!
//! Writing gives what fastjson writes, in standard JSON: keys in alphabetical order (struct
//! fields are declared in that order and maps are `BTreeMap`s), nulls omitted, enums by name,
//! non-ASCII raw, and maps keyed by [`MessageQueue`] written with the queue's JSON as a string
//! key (which fastjson accepts). Reading also accepts fastjson's own non-standard forms (bare
//! numeric keys, object keys, see [`normalize_fastjson`]), enums by name or ordinal, and
//! missing fields (defaults).
//!
//! Use the one generic pair [`to_json_bytes`] / [`from_json_slice`], or the command helpers
//! [`RemotingCommand::with_json_body`] / [`RemotingCommand::decode_json_body`]:
//!
//! ```
//! use shoal_proto::body::{from_json_slice, to_json_bytes, GetConsumerListByGroupResponseBody};
//!
//! let body = GetConsumerListByGroupResponseBody { consumer_id_list: vec!["c1".into()] };
//! let bytes = to_json_bytes(&body).unwrap();
//! assert_eq!(bytes, br#"{"consumerIdList":["c1"]}"#);
//! let back: GetConsumerListByGroupResponseBody = from_json_slice(&bytes).unwrap();
//! assert_eq!(back, body);
//! ```

mod consumer;
mod enums;
mod heartbeat;
mod normalize;
mod route;
mod topic;

pub use consumer::*;
pub use enums::*;
pub use heartbeat::*;
pub use normalize::{normalize_fastjson, MAX_DEPTH};
pub use route::*;
pub use topic::*;

use crate::{MessageQueue, ProtoError, RemotingCommand, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Serialises a body to JSON bytes exactly as Shoal sends it.
pub fn to_json_bytes<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| ProtoError::Json {
        what: std::any::type_name::<T>(),
        reason: e.to_string(),
    })
}

/// Parses a body from JSON bytes, standard or fastjson-flavoured (bare numeric keys, object
/// keys). Standard JSON is parsed directly; anything else goes through
/// [`normalize_fastjson`] first.
pub fn from_json_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    match serde_json::from_slice(bytes) {
        Ok(v) => Ok(v),
        Err(first) => {
            let json_error = |reason: String| ProtoError::Json {
                what: std::any::type_name::<T>(),
                reason,
            };
            // A syntax error may be a fastjson form; a data error (wrong shape) is final.
            if !first.is_syntax() && !first.is_eof() {
                return Err(json_error(first.to_string()));
            }
            // Input that is not even fastjson-shaped reports the parser's first error.
            let normalised =
                normalize_fastjson(bytes).map_err(|_| json_error(first.to_string()))?;
            serde_json::from_slice(&normalised).map_err(|e| json_error(e.to_string()))
        }
    }
}

impl RemotingCommand {
    /// Sets the body to `value`'s JSON.
    pub fn with_json_body<T: Serialize>(self, value: &T) -> Result<Self> {
        Ok(self.with_body(to_json_bytes(value)?))
    }

    /// Parses the body as JSON of type `T`; a missing body is an error.
    pub fn decode_json_body<T: DeserializeOwned>(&self) -> Result<T> {
        match &self.body {
            Some(body) => from_json_slice(body),
            None => Err(ProtoError::Json {
                what: std::any::type_name::<T>(),
                reason: "the command has no body".to_owned(),
            }),
        }
    }
}

/// Serde adapter for `BTreeMap<MessageQueue, V>`: written with the queue's JSON as a string
/// key, read from such string keys (fastjson object keys are turned into them by
/// [`normalize_fastjson`]). Use with `#[serde(with = "mq_key_map")]`.
pub mod mq_key_map {
    use super::MessageQueue;
    use serde::de::{DeserializeOwned, Error as _};
    use serde::ser::{Error as _, SerializeMap};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;

    /// Serialises the map with stringified queue keys.
    pub fn serialize<S: Serializer, V: Serialize>(
        map: &BTreeMap<MessageQueue, V>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let mut out = serializer.serialize_map(Some(map.len()))?;
        for (mq, value) in map {
            let key = serde_json::to_string(mq).map_err(S::Error::custom)?;
            out.serialize_entry(&key, value)?;
        }
        out.end()
    }

    /// Deserialises a map whose keys are strings holding a queue's JSON.
    pub fn deserialize<'de, D: Deserializer<'de>, V: DeserializeOwned>(
        deserializer: D,
    ) -> Result<BTreeMap<MessageQueue, V>, D::Error> {
        let raw: Vec<(String, V)> = BTreeMap::<String, V>::deserialize(deserializer)?
            .into_iter()
            .collect();
        raw.into_iter()
            .map(|(key, value)| {
                let mq: MessageQueue = serde_json::from_str(&key).map_err(|e| {
                    D::Error::custom(format!("map key {key:?} is not a MessageQueue: {e}"))
                })?;
                Ok((mq, value))
            })
            .collect()
    }
}

/// Lenient readers for values the C++ client writes with another JSON type.
pub(crate) mod lenient {
    use serde::de::{Error, Unexpected, Visitor};
    use serde::{Deserialize, Deserializer};
    use std::collections::BTreeMap;
    use std::fmt;

    /// A string map whose values may arrive as any JSON scalar (numbers and booleans are
    /// turned into their text, `null` entries are dropped); nested values are an error.
    pub(crate) fn string_map<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<String, String>, D::Error> {
        let raw = BTreeMap::<String, serde_json::Value>::deserialize(d)?;
        let mut out = BTreeMap::new();
        for (k, v) in raw {
            let s = match v {
                serde_json::Value::Null => continue,
                serde_json::Value::String(s) => s,
                serde_json::Value::Bool(b) => b.to_string(),
                serde_json::Value::Number(n) => n.to_string(),
                other => {
                    return Err(D::Error::custom(format!(
                        "value of {k:?} must be a scalar, got {other}"
                    )))
                }
            };
            out.insert(k, s);
        }
        Ok(out)
    }

    /// An `i64` written as a JSON number or as a string of digits.
    pub(crate) fn i64_or_string<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = i64;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer or a string holding one")
            }
            fn visit_i64<E: Error>(self, v: i64) -> Result<i64, E> {
                Ok(v)
            }
            fn visit_u64<E: Error>(self, v: u64) -> Result<i64, E> {
                i64::try_from(v).map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &self))
            }
            fn visit_str<E: Error>(self, v: &str) -> Result<i64, E> {
                v.trim()
                    .parse()
                    .map_err(|_| E::invalid_value(Unexpected::Str(v), &self))
            }
        }
        d.deserialize_any(V)
    }

    /// An `i32` written as a JSON number or as a string of digits.
    pub(crate) fn i32_or_string<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
        let v = i64_or_string(d)?;
        i32::try_from(v).map_err(|_| D::Error::invalid_value(Unexpected::Signed(v), &"an i32"))
    }

    /// A set of `i32`s, each a JSON number or a string of digits (the Go client writes tag hash
    /// codes as strings); `null` or absent is `None`.
    pub(crate) fn opt_i32_set<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<std::collections::BTreeSet<i32>>, D::Error> {
        #[derive(Deserialize)]
        struct Item(#[serde(deserialize_with = "i32_or_string")] i32);
        let items = Option::<Vec<Item>>::deserialize(d)?;
        Ok(items.map(|v| v.into_iter().map(|Item(i)| i).collect()))
    }

    /// An `f64` written as a JSON number or as a string holding one.
    pub(crate) fn f64_or_string<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = f64;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number or a string holding one")
            }
            fn visit_f64<E: Error>(self, v: f64) -> Result<f64, E> {
                Ok(v)
            }
            fn visit_i64<E: Error>(self, v: i64) -> Result<f64, E> {
                Ok(v as f64)
            }
            fn visit_u64<E: Error>(self, v: u64) -> Result<f64, E> {
                Ok(v as f64)
            }
            fn visit_str<E: Error>(self, v: &str) -> Result<f64, E> {
                v.trim()
                    .parse()
                    .map_err(|_| E::invalid_value(Unexpected::Str(v), &self))
            }
        }
        d.deserialize_any(V)
    }

    /// A `bool` written as a JSON boolean or as the string `"true"` / `"false"`.
    pub(crate) fn bool_or_string<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = bool;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a boolean or a string holding one")
            }
            fn visit_bool<E: Error>(self, v: bool) -> Result<bool, E> {
                Ok(v)
            }
            fn visit_str<E: Error>(self, v: &str) -> Result<bool, E> {
                match v.trim() {
                    "true" => Ok(true),
                    "false" => Ok(false),
                    _ => Err(E::invalid_value(Unexpected::Str(v), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests;
