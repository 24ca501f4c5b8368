//! [`RemotingCommand`]: one frame of the remoting protocol (spec section 1).
//!
//! The struct here is the contract every plane shares. Encoding and decoding of whole frames
//! (length prefix, JSON and ROCKETMQ binary headers) live next to it in this module.

use bytes::Bytes;
use indexmap::IndexMap;

/// The "custom header" of a command: string keys to string values, in insertion order
/// (order matters only for byte-exact output; receivers look fields up by name).
pub type ExtFields = IndexMap<String, String>;

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
        Self::ALL.iter().find(|(_, n)| *n == name).map(|(l, _)| *l)
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
        self.ext_fields.as_ref()?.get(key).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn language_codes_round_trip() {
        for code in 0..14u8 {
            let l = LanguageCode::from_code(code).unwrap();
            assert_eq!(l.code(), code);
            assert_eq!(LanguageCode::from_name(l.name()), Some(l));
        }
        assert_eq!(LanguageCode::from_code(14), None);
        assert_eq!(LanguageCode::from_name("COBOL"), None);
        assert_eq!(LanguageCode::Rust.code(), 12);
        assert_eq!(LanguageCode::NodeJs.name(), "NODE_JS");
    }

    #[test]
    fn response_to_copies_opaque_and_sets_flag() {
        let req = RemotingCommand::request(10).with_opaque(42);
        let resp = RemotingCommand::response_to(&req, 0, None);
        assert!(resp.is_response());
        assert!(!resp.is_oneway());
        assert_eq!(resp.opaque, 42);
    }
}
