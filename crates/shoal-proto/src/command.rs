//! [`RemotingCommand`]: one frame of the remoting protocol (spec section 1).
//!
//! The struct here is the contract every plane shares. Encoding and decoding of whole frames
//! (length prefix, JSON and ROCKETMQ binary headers) live next to it in this module: writing
//! frames and headers in `encode.rs`, splitting and decoding frames in `decode.rs`, the two
//! header forms' decoders in `json_header.rs` (with its single-pass fast path,
//! `json_fast.rs`) and `rocketmq_header.rs`.

mod decode;
mod encode;
mod json_fast;
mod json_header;
mod rocketmq_header;
#[cfg(test)]
mod tests;

pub use decode::split_frame;
pub(crate) use encode::push_json_str_contents;
pub use encode::{
    push_binary_decimal, push_binary_entry, push_binary_entry_with, push_decimal, push_json_str,
};
pub use json_header::{decode_json_header_fast, decode_json_header_reference};
pub(crate) use rocketmq_header::rocketmq_entry_at;

use bytes::Bytes;
use bytestring::ByteString;

pub use crate::ext_fields::ExtFields;

/// Bit 0 of `flag`: this command is a response.
pub const FLAG_RESPONSE: i32 = 1;
/// Bit 1 of `flag`: this request is oneway; no response may be sent.
pub const FLAG_ONEWAY: i32 = 2;
/// The `version` Shoal sends in every command: the ordinal of RocketMQ V5_3_3 (spec 1.6).
pub const CURRENT_VERSION: i32 = 479;
/// Default maximum frame size, including the 4-byte length field (spec 1.1).
pub const MAX_FRAME_LEN: usize = 16 * 1024 * 1024;

/// How a command's header is (or will be) serialised: the high byte of the frame's second word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SerializeType {
    /// Type 0: a UTF-8 JSON object.
    #[default]
    Json,
    /// Type 1: RocketMQ's own binary layout.
    RocketMq,
}

impl SerializeType {
    /// The byte written in the frame.
    pub fn code(self) -> u8 {
        match self {
            SerializeType::Json => 0,
            SerializeType::RocketMq => 1,
        }
    }

    /// Parses the frame byte.
    pub fn from_code(code: u8) -> crate::Result<Self> {
        match code {
            0 => Ok(SerializeType::Json),
            1 => Ok(SerializeType::RocketMq),
            other => Err(crate::ProtoError::UnknownSerializeType(other)),
        }
    }

    /// The encoding a request with `code` can be sent in: ROCKETMQ binary headers carry the
    /// code as a 16-bit short, so codes above 32767 (the POP family) always go as JSON.
    pub fn for_request_code(self, code: i32) -> Self {
        if code > i32::from(i16::MAX) || code < i32::from(i16::MIN) {
            SerializeType::Json
        } else {
            self
        }
    }

    /// RocketMQ's name of the encoding (`rocketmq.serialize.type`): `JSON` or `ROCKETMQ`.
    pub fn name(self) -> &'static str {
        match self {
            SerializeType::Json => "JSON",
            SerializeType::RocketMq => "ROCKETMQ",
        }
    }
}

impl std::str::FromStr for SerializeType {
    type Err = String;

    /// `json` or `rocketmq` (any case), RocketMQ's `rocketmq.serialize.type` values.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s.eq_ignore_ascii_case("json") {
            Ok(SerializeType::Json)
        } else if s.eq_ignore_ascii_case("rocketmq") {
            Ok(SerializeType::RocketMq)
        } else {
            Err(format!(
                "unknown header encoding {s:?}: use json or rocketmq"
            ))
        }
    }
}

/// The sender's language (Java's `LanguageCode`), sent by name in JSON and by code in binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LanguageCode {
    /// 0
    #[default]
    Java,
    /// 1
    Cpp,
    /// 2
    Dotnet,
    /// 3
    Python,
    /// 4
    Delphi,
    /// 5
    Erlang,
    /// 6
    Ruby,
    /// 7
    Other,
    /// 8
    Http,
    /// 9
    Go,
    /// 10
    Php,
    /// 11
    Oms,
    /// 12 (known to peers from 4.9.4)
    Rust,
    /// 13
    NodeJs,
}

impl LanguageCode {
    const ALL: [(LanguageCode, &'static str); 14] = [
        (LanguageCode::Java, "JAVA"),
        (LanguageCode::Cpp, "CPP"),
        (LanguageCode::Dotnet, "DOTNET"),
        (LanguageCode::Python, "PYTHON"),
        (LanguageCode::Delphi, "DELPHI"),
        (LanguageCode::Erlang, "ERLANG"),
        (LanguageCode::Ruby, "RUBY"),
        (LanguageCode::Other, "OTHER"),
        (LanguageCode::Http, "HTTP"),
        (LanguageCode::Go, "GO"),
        (LanguageCode::Php, "PHP"),
        (LanguageCode::Oms, "OMS"),
        (LanguageCode::Rust, "RUST"),
        (LanguageCode::NodeJs, "NODE_JS"),
    ];

    /// The numeric code used in binary headers.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The enum name used in JSON headers.
    pub fn name(self) -> &'static str {
        Self::ALL[self as usize].1
    }

    /// Looks a binary code up; unknown codes give `None`.
    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.get(code as usize).map(|(l, _)| *l)
    }

    /// Looks a JSON name up; unknown names give `None` (Java turns them into null).
    pub fn from_name(name: &str) -> Option<Self> {
        // A match compiles to a length switch and one comparison (the list scan compared
        // up to 13 names: RUST, what Shoal's servers answer with, is 13th).
        Some(match name {
            "JAVA" => LanguageCode::Java,
            "CPP" => LanguageCode::Cpp,
            "DOTNET" => LanguageCode::Dotnet,
            "PYTHON" => LanguageCode::Python,
            "DELPHI" => LanguageCode::Delphi,
            "ERLANG" => LanguageCode::Erlang,
            "RUBY" => LanguageCode::Ruby,
            "OTHER" => LanguageCode::Other,
            "HTTP" => LanguageCode::Http,
            "GO" => LanguageCode::Go,
            "PHP" => LanguageCode::Php,
            "OMS" => LanguageCode::Oms,
            "RUST" => LanguageCode::Rust,
            "NODE_JS" => LanguageCode::NodeJs,
            _ => return None,
        })
    }
}

/// A command's custom header already encoded ([`RemotingCommand::ext_fields_raw`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawExtFields {
    /// A JSON object (`{"key":"value",...}`), for a JSON header; no escape scan of strings
    /// known not to need one.
    Json(String),
    /// A ROCKETMQ binary header's extFields area: `int16 keyLen | key | int32 valueLen |
    /// value` per entry (see [`push_binary_entry`]), for a binary header.
    Binary(Vec<u8>),
    /// A binary extFields area as it came, a slice of its frame, kept by
    /// [`RemotingCommand::decode_with`] for a command its caller reads with a reader of its
    /// own (a request by its code, an answer by the request it answers; no map built): well
    /// formed, every key and value non-empty, every length field ASCII and the whole area
    /// UTF-8, so that each key and value is UTF-8 by itself. Encoded as
    /// [`RawExtFields::Binary`] is.
    BinaryArea(ByteString),
}

impl RawExtFields {
    /// The area of a binary form (`Binary` or `BinaryArea`).
    fn binary_area(&self) -> Option<&[u8]> {
        match self {
            RawExtFields::Binary(area) => Some(area),
            RawExtFields::BinaryArea(area) => Some(area.as_bytes()),
            RawExtFields::Json(_) => None,
        }
    }

    /// The entries of a binary form, in order (none for JSON).
    pub fn binary_entries(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        let area = self.binary_area().unwrap_or(&[]);
        let mut at = 0;
        std::iter::from_fn(move || {
            let ((k, kl), (v, vl)) = rocketmq_entry_at(area, &mut at).ok()??;
            Some((&area[k..k + kl], &area[v..v + vl]))
        })
    }
}

/// One remoting command: a request or a response, with its header and optional body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemotingCommand {
    /// Request code (requests) or response code (responses).
    pub code: i32,
    /// Sender language.
    pub language: LanguageCode,
    /// Sender's `MQVersion` ordinal.
    pub version: i32,
    /// Request id; a response echoes its request's value.
    pub opaque: i32,
    /// [`FLAG_RESPONSE`] and [`FLAG_ONEWAY`] bits.
    pub flag: i32,
    /// Human-readable text, mostly on errors.
    pub remark: Option<String>,
    /// The custom header. `None` means absent (Java omits it when there is no header object);
    /// `Some(empty)` is written as `{}`.
    pub ext_fields: Option<ExtFields>,
    /// The custom header already encoded for the wire, for a request or an answer built on a
    /// hot path: the encoder writes it as is in place of [`RemotingCommand::ext_fields`]
    /// (which should then be `None`), with no map built. It must be in the command's
    /// [`RemotingCommand::serialize_type`] (encoding it in the other is an error). Decoders
    /// set it only when asked ([`RemotingCommand::decode_with`], then as
    /// [`RawExtFields::BinaryArea`]). See
    /// [`send_response_json`](crate::header::send_response_json).
    pub ext_fields_raw: Option<RawExtFields>,
    /// How the header was decoded, or how it is to be encoded.
    pub serialize_type: SerializeType,
    /// The body, if any.
    pub body: Option<Bytes>,
}

impl RemotingCommand {
    /// A new request with the given code, Shoal's language and version, opaque 0, no header.
    pub fn request(code: i32) -> Self {
        Self {
            code,
            language: LanguageCode::Rust,
            version: CURRENT_VERSION,
            opaque: 0,
            flag: 0,
            remark: None,
            ext_fields: None,
            ext_fields_raw: None,
            serialize_type: SerializeType::Json,
            body: None,
        }
    }

    /// A new response with the given code and remark (opaque to be set from the request).
    pub fn response(code: i32, remark: Option<String>) -> Self {
        Self {
            flag: FLAG_RESPONSE,
            remark,
            ..Self::request(code)
        }
    }

    /// A response to `request`: same opaque, response flag set.
    pub fn response_to(request: &RemotingCommand, code: i32, remark: Option<String>) -> Self {
        Self {
            opaque: request.opaque,
            ..Self::response(code, remark)
        }
    }

    /// True when the response flag is set.
    pub fn is_response(&self) -> bool {
        self.flag & FLAG_RESPONSE != 0
    }

    /// True when the oneway flag is set (no response may be sent).
    pub fn is_oneway(&self) -> bool {
        self.flag & FLAG_ONEWAY != 0
    }

    /// Marks this request oneway.
    pub fn set_oneway(&mut self) {
        self.flag |= FLAG_ONEWAY;
    }

    /// Sets the body.
    pub fn with_body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = Some(body.into());
        self
    }

    /// Sets the custom header.
    pub fn with_ext_fields(mut self, ext: ExtFields) -> Self {
        self.ext_fields = Some(ext);
        self
    }

    /// Sets the opaque.
    pub fn with_opaque(mut self, opaque: i32) -> Self {
        self.opaque = opaque;
        self
    }

    /// Looks an extFields value up.
    pub fn ext(&self, key: &str) -> Option<&str> {
        self.ext_fields.as_ref()?.get(key)
    }
}

/// Bytes of the fixed part of a ROCKETMQ binary header: code (2), language (1), version (2),
/// opaque (4), flag (4), remark length (4) and extFields length (4).
pub const ROCKETMQ_HEADER_FIXED_LEN: usize = 21;

/// Largest header length the 24 low bits of a frame's second word can carry.
pub const MAX_HEADER_LEN: usize = 0x00FF_FFFF;

/// The `language` a decoded header gets when the peer sent a name or code Shoal does not know.
///
/// Java turns such a value into `null`; Shoal keeps [`LanguageCode::Other`] instead so that the
/// command stays encodable and the peer is still reported as "not one of ours".
pub const UNKNOWN_LANGUAGE: LanguageCode = LanguageCode::Other;
