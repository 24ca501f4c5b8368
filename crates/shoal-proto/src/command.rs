//! [`RemotingCommand`]: one frame of the remoting protocol (spec section 1).
//!
//! The struct here is the contract every plane shares. Encoding and decoding of whole frames
//! (length prefix, JSON and ROCKETMQ binary headers) live next to it in this module.

use crate::ext_fields::{Span, INDEX_FROM};
use crate::{ProtoError, Result};
use bytes::{Buf, BufMut, Bytes, BytesMut};
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

/// Appends the decimal digits of `v` (and its sign) to `out`, as `i64::to_string` writes them.
pub fn push_decimal(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// Appends one entry of a ROCKETMQ binary extFields area to `out` whose value is `v` in
/// decimal ([`push_decimal`]'s text), with the entry's length fields and digits written in
/// one copy.
///
/// # Errors
/// A key longer than 32767 bytes (nothing appended).
#[inline]
pub fn push_binary_decimal(out: &mut Vec<u8>, key: &str, v: i64) -> Result<()> {
    push_binary_entry_parts(out, key, itoa::Buffer::new().format(v).as_bytes())
}

/// Appends one entry of a ROCKETMQ binary extFields area to `out` whose value `write`
/// appends (UTF-8 text, as every header value is): no copy of the value made first.
///
/// # Errors
/// A key longer than 32767 bytes or a value longer than `i32::MAX` bytes (nothing appended).
#[inline]
pub fn push_binary_entry_with(
    out: &mut Vec<u8>,
    key: &str,
    write: impl FnOnce(&mut Vec<u8>),
) -> Result<()> {
    let start = out.len();
    push_binary_entry(out, key, "")?;
    let value_at = out.len();
    write(out);
    match len_i32(out.len() - value_at, "extFields value") {
        Ok(n) => {
            out[value_at - 4..value_at].copy_from_slice(&n.to_be_bytes());
            Ok(())
        }
        Err(e) => {
            out.truncate(start);
            Err(e)
        }
    }
}

/// Appends one entry of a ROCKETMQ binary extFields area to `out`
/// ([`RawExtFields::Binary`]).
///
/// # Errors
/// A key longer than 32767 bytes or a value longer than `i32::MAX` bytes (nothing appended).
#[inline]
pub fn push_binary_entry(out: &mut Vec<u8>, key: &str, value: &str) -> Result<()> {
    push_binary_entry_parts(out, key, value.as_bytes())
}

/// [`push_binary_entry`] for a value given as (UTF-8) bytes. Always inlined, so that a
/// constant key is written with stores rather than copies.
#[inline(always)]
fn push_binary_entry_parts(out: &mut Vec<u8>, key: &str, value: &[u8]) -> Result<()> {
    let Ok(key_len) = i16::try_from(key.len()) else {
        return Err(long_binary_key(key));
    };
    let value_len = len_i32(value.len(), "extFields value")?;
    out.reserve(6 + key.len() + value.len());
    out.extend_from_slice(&key_len.to_be_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&value_len.to_be_bytes());
    out.extend_from_slice(value);
    Ok(())
}

/// The error for a key that does not fit a binary entry's 16-bit length (out of line: the
/// writers above are inlined).
#[cold]
fn long_binary_key(key: &str) -> ProtoError {
    ProtoError::InvalidField {
        field: "extFields",
        value: key.chars().take(64).collect(),
        reason: format!(
            "key of {} bytes exceeds the 32767-byte limit of a ROCKETMQ binary header",
            key.len()
        ),
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

// ---------------------------------------------------------------------------------------------
// Frame codec (spec 1.1, 1.3, 1.4, 9 and 10)
// ---------------------------------------------------------------------------------------------

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

/// Splits one frame off the front of a stream buffer, as a length-delimited decoder does.
///
/// `src` holds bytes read from a connection, starting at a frame boundary. When it holds a
/// whole frame, the frame's 4-byte length field is consumed and the bytes after it (header-length
/// word, header and body) are returned, ready for [`RemotingCommand::decode`]. When more bytes
/// are needed, `Ok(None)` is returned and `src` is left as it was (with room reserved for the
/// rest of the frame).
///
/// `max_frame_len` counts the length field itself, as Java's `frameMaxLength` does
/// ([`MAX_FRAME_LEN`] = 16 MiB by default).
///
/// # Errors
/// A negative length, a length shorter than the header-length word (4), or a frame larger than
/// `max_frame_len`. After an error the stream is out of sync: close the connection.
pub fn split_frame(src: &mut BytesMut, max_frame_len: usize) -> Result<Option<Bytes>> {
    let Some(len_bytes) = src.get(..4) else {
        return Ok(None);
    };
    let declared = i32::from_be_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]);
    let body_len = check_frame_length(declared, max_frame_len)?;
    let total = body_len + 4;
    if src.len() < total {
        src.reserve(total - src.len());
        return Ok(None);
    }
    src.advance(4);
    Ok(Some(src.split_to(body_len).freeze()))
}

/// Validates the frame length field `declared` (which excludes its own 4 bytes) against the
/// limit and returns it as a `usize`.
fn check_frame_length(declared: i32, max_frame_len: usize) -> Result<usize> {
    if declared < 0 {
        return Err(ProtoError::BadLength(format!(
            "negative frame length {declared}"
        )));
    }
    let len = declared as usize;
    if len < 4 {
        return Err(ProtoError::BadLength(format!(
            "frame length {len} is shorter than the 4-byte header-length field"
        )));
    }
    if len + 4 > max_frame_len {
        return Err(ProtoError::FrameTooLarge {
            len: len + 4,
            max: max_frame_len,
        });
    }
    Ok(len)
}

impl RemotingCommand {
    /// Appends this command as one whole frame to `dst`:
    /// `int32 length | int32 (type<<24)|hdrLen | header | body`.
    ///
    /// The header is JSON or ROCKETMQ binary according to [`RemotingCommand::serialize_type`].
    /// JSON is written exactly as Java's fastjson does (see [`RemotingCommand::encode_header`]).
    /// No frame-size limit is applied here beyond what the format can represent; a transport
    /// enforces its own limit. On error nothing is left appended to `dst`.
    ///
    /// # Errors
    /// With a binary header: a `code` or `version` outside the 16-bit range, or an extFields key
    /// longer than 32767 bytes. Any header over 16 MiB − 1 or a frame over `i32::MAX` bytes.
    pub fn encode(&self, dst: &mut BytesMut) -> Result<()> {
        let start = dst.len();
        let result = self.encode_inner(dst, start);
        if result.is_err() {
            dst.truncate(start);
        }
        result
    }

    fn encode_inner(&self, dst: &mut BytesMut, start: usize) -> Result<()> {
        let body_len = self.body.as_ref().map_or(0, Bytes::len);
        dst.reserve(8 + 256 + body_len);
        dst.put_u64(0); // length and header-length words, patched below
        self.encode_header(dst)?;
        let header_len = dst.len() - start - 8;
        if header_len > MAX_HEADER_LEN {
            return Err(ProtoError::FrameTooLarge {
                len: header_len,
                max: MAX_HEADER_LEN,
            });
        }
        let frame_len = 4 + header_len + body_len;
        let Ok(frame_len_i32) = i32::try_from(frame_len) else {
            return Err(ProtoError::FrameTooLarge {
                len: frame_len + 4,
                max: i32::MAX as usize,
            });
        };
        if let Some(body) = &self.body {
            dst.extend_from_slice(body);
        }
        let word = (u32::from(self.serialize_type.code()) << 24) | header_len as u32;
        dst[start..start + 4].copy_from_slice(&frame_len_i32.to_be_bytes());
        dst[start + 4..start + 8].copy_from_slice(&word.to_be_bytes());
        Ok(())
    }

    /// Encodes this command as one whole frame into new bytes (see [`RemotingCommand::encode`]).
    ///
    /// # Errors
    /// As [`RemotingCommand::encode`].
    pub fn to_frame(&self) -> Result<Bytes> {
        let mut dst = BytesMut::new();
        self.encode(&mut dst)?;
        Ok(dst.freeze())
    }

    /// Appends only the header (no length words, no body) to `dst`, in the format given by
    /// [`RemotingCommand::serialize_type`].
    ///
    /// JSON headers are what fastjson emits for Java's `RemotingCommand`: keys sorted (`code`,
    /// `extFields`, `flag`, `language`, `opaque`, `remark`, `serializeTypeCurrentRPC`,
    /// `version`), `null`s omitted (`extFields` when `None`, `remark` when `None`), `extFields`
    /// entries in map order, `serializeTypeCurrentRPC` always `"JSON"`, strings with standard
    /// JSON escaping (control characters as `\u0001`, no escaping of `/` or non-ASCII).
    ///
    /// # Errors
    /// As [`RemotingCommand::encode`] (only binary headers can fail).
    pub fn encode_header(&self, dst: &mut BytesMut) -> Result<()> {
        match self.serialize_type {
            SerializeType::Json => {
                self.encode_json_header(dst);
                Ok(())
            }
            SerializeType::RocketMq => self.encode_rocketmq_header(dst),
        }
    }

    fn encode_json_header(&self, dst: &mut BytesMut) {
        // Room for the whole header when no string needs escapes: the fixed text with four
        // 11-character integers and the longest language name (160 bytes), the remark and its
        // key, and per extFields entry its text (`text_len` counts it, and may count more)
        // with two pairs of quotes, a colon and a comma.
        let ext_len = self
            .ext_fields
            .as_ref()
            .map_or(0, |ext| ext.text_len() + 6 * ext.len());
        let remark_len = self.remark.as_ref().map_or(0, |r| r.len() + 12);
        let json_len = match &self.ext_fields_raw {
            Some(RawExtFields::Json(j)) => j.len() + 13,
            _ => 0,
        };
        dst.reserve(160 + ext_len + remark_len + json_len);
        dst.extend_from_slice(b"{\"code\":");
        put_decimal(dst, self.code);
        if let Some(RawExtFields::Json(json)) = &self.ext_fields_raw {
            debug_assert!(self.ext_fields.is_none(), "both extFields forms set");
            dst.extend_from_slice(b",\"extFields\":");
            dst.extend_from_slice(json.as_bytes());
        } else if let Some(ext) = &self.ext_fields {
            dst.extend_from_slice(b",\"extFields\":{");
            for (i, (k, v)) in ext.iter_bytes().enumerate() {
                if i > 0 {
                    dst.put_u8(b',');
                }
                put_json_str(dst, k);
                dst.put_u8(b':');
                put_json_str(dst, v);
            }
            dst.put_u8(b'}');
        } else if let Some(raw) = self
            .ext_fields_raw
            .as_ref()
            .filter(|r| r.binary_area().is_some())
        {
            // Written for a binary header, sent as JSON after all: the same entries (their
            // strings are UTF-8, see `push_binary_entry`).
            dst.extend_from_slice(b",\"extFields\":{");
            for (i, (k, v)) in raw.binary_entries().enumerate() {
                if i > 0 {
                    dst.put_u8(b',');
                }
                put_json_str(dst, k);
                dst.put_u8(b':');
                put_json_str(dst, v);
            }
            dst.put_u8(b'}');
        }
        dst.extend_from_slice(b",\"flag\":");
        put_decimal(dst, self.flag);
        dst.extend_from_slice(b",\"language\":\"");
        dst.extend_from_slice(self.language.name().as_bytes());
        dst.extend_from_slice(b"\",\"opaque\":");
        put_decimal(dst, self.opaque);
        if let Some(remark) = &self.remark {
            dst.extend_from_slice(b",\"remark\":");
            put_json_str(dst, remark.as_bytes());
        }
        dst.extend_from_slice(b",\"serializeTypeCurrentRPC\":\"JSON\",\"version\":");
        put_decimal(dst, self.version);
        dst.put_u8(b'}');
    }

    fn encode_rocketmq_header(&self, dst: &mut BytesMut) -> Result<()> {
        let code = i16::try_from(self.code).map_err(|_| ProtoError::InvalidField {
            field: "code",
            value: self.code.to_string(),
            reason: "does not fit the 16-bit code of a ROCKETMQ binary header; use JSON".into(),
        })?;
        let version = i16::try_from(self.version).map_err(|_| ProtoError::InvalidField {
            field: "version",
            value: self.version.to_string(),
            reason: "does not fit the 16-bit version of a ROCKETMQ binary header".into(),
        })?;
        if let Some(RawExtFields::Json(_)) = &self.ext_fields_raw {
            return Err(ProtoError::InvalidField {
                field: "extFields",
                value: String::new(),
                reason: "extFields written as JSON cannot go in a ROCKETMQ binary header".into(),
            });
        }
        let raw = self
            .ext_fields_raw
            .as_ref()
            .and_then(RawExtFields::binary_area);
        debug_assert!(
            raw.is_none() || self.ext_fields.is_none(),
            "both extFields forms set"
        );
        let remark = self.remark.as_deref().unwrap_or("");
        let remark_len = len_i32(remark.len(), "remark")?;
        // One pass over the entries: the area's length is written once they are.
        let ext_room = self
            .ext_fields
            .as_ref()
            .map_or(0, |ext| ext.text_len() + 6 * ext.len());
        let raw_len = raw.map_or(0, <[u8]>::len);
        dst.reserve(ROCKETMQ_HEADER_FIXED_LEN + remark.len() + ext_room + raw_len);
        let start = dst.len();
        dst.put_i16(code);
        dst.put_u8(self.language.code());
        dst.put_i16(version);
        dst.put_i32(self.opaque);
        dst.put_i32(self.flag);
        dst.put_i32(remark_len);
        dst.extend_from_slice(remark.as_bytes());
        let ext_at = dst.len();
        dst.put_i32(0);
        if let Some(area) = raw {
            dst.extend_from_slice(area);
        } else if let Some(ext) = &self.ext_fields {
            for (k, v) in ext.iter_bytes() {
                let Ok(key_len) = i16::try_from(k.len()) else {
                    dst.truncate(start);
                    return Err(ProtoError::InvalidField {
                        field: "extFields",
                        value: String::from_utf8_lossy(k).chars().take(64).collect(),
                        reason: format!(
                            "key of {} bytes exceeds the 32767-byte limit of a ROCKETMQ binary header",
                            k.len()
                        ),
                    });
                };
                let value_len = match len_i32(v.len(), "extFields value") {
                    Ok(n) => n,
                    Err(e) => {
                        dst.truncate(start);
                        return Err(e);
                    }
                };
                dst.put_i16(key_len);
                dst.extend_from_slice(k);
                dst.put_i32(value_len);
                dst.extend_from_slice(v);
            }
        }
        let ext_len = match len_i32(dst.len() - ext_at - 4, "extFields") {
            Ok(n) => n,
            Err(e) => {
                dst.truncate(start);
                return Err(e);
            }
        };
        dst[ext_at..ext_at + 4].copy_from_slice(&ext_len.to_be_bytes());
        Ok(())
    }

    /// Decodes one frame given the bytes after its length field (what [`split_frame`] or a
    /// length-delimited codec hands over): `int32 (type<<24)|hdrLen | header | body`.
    ///
    /// The body is a zero-copy slice of `frame`; an empty body decodes as `None`.
    ///
    /// # Errors
    /// A frame shorter than 4 bytes, a header length beyond the frame, an unknown serialize
    /// type, and any error of [`RemotingCommand::decode_header`].
    pub fn decode(frame: Bytes) -> Result<RemotingCommand> {
        Self::decode_with(frame, |_| false)
    }

    /// [`RemotingCommand::decode`], keeping the binary extFields area of a command that
    /// `keep_area` accepts as [`RawExtFields::BinaryArea`] in
    /// [`RemotingCommand::ext_fields_raw`] (no [`ExtFields`] built; `ext_fields` is `None`),
    /// when the area qualifies (see the variant); otherwise, and for JSON headers, the
    /// command is the one `decode` gives. `keep_area` is asked at most once, for a binary
    /// header with extFields, with the command's fixed fields (code, flag, opaque, ...;
    /// no extFields or body yet), so that a request can be told by its code and an answer
    /// by its opaque. A caller that keeps areas reads those commands' headers from either
    /// form.
    ///
    /// # Errors
    /// As [`RemotingCommand::decode`] (a kept area is one `decode` accepts).
    pub fn decode_with(
        frame: Bytes,
        keep_area: impl FnOnce(&RemotingCommand) -> bool,
    ) -> Result<RemotingCommand> {
        let Some(word) = frame.get(..4) else {
            return Err(ProtoError::Truncated {
                what: "frame header-length word",
                need: 4,
                have: frame.len(),
            });
        };
        let word = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        let serialize_type = SerializeType::from_code((word >> 24) as u8)?;
        let header_len = (word & MAX_HEADER_LEN as u32) as usize;
        let available = frame.len() - 4;
        if header_len > available {
            return Err(ProtoError::BadLength(format!(
                "header length {header_len} exceeds the {available} bytes left in the frame"
            )));
        }
        let mut cmd = match serialize_type {
            // The extFields share the frame's header bytes (see `ExtFields`).
            SerializeType::Json => decode_json_header_shared(frame.slice(4..4 + header_len))?,
            SerializeType::RocketMq => {
                let header = &frame[4..4 + header_len];
                let (mut cmd, area) = decode_rocketmq_fixed(header)?;
                let kept = (!area.is_empty() && keep_area(&cmd))
                    .then(|| keepable_area(&frame, area))
                    .flatten();
                match kept {
                    Some(area) => cmd.ext_fields_raw = Some(RawExtFields::BinaryArea(area)),
                    None if area.is_empty() => {}
                    None => cmd.ext_fields = decode_rocketmq_ext_fields(area)?,
                }
                cmd
            }
        };
        if frame.len() > 4 + header_len {
            cmd.body = Some(frame.slice(4 + header_len..));
        }
        Ok(cmd)
    }

    /// Decodes a header alone (the `hdrLen` bytes of a frame) of the given type. The result has
    /// no body.
    ///
    /// JSON (what Java's fastjson accepts): keys in any order, unknown keys ignored, every key
    /// optional (code/version/opaque/flag 0, language JAVA, no remark, no extFields), `null`
    /// treated as absent, integers also accepted as numeric strings, whitespace (e.g. a trailing
    /// newline) around the object allowed, extFields scalar values (numbers, booleans) turned
    /// into their string form and `null` values dropped, `language` by name or number with
    /// unknown values mapped to [`UNKNOWN_LANGUAGE`].
    ///
    /// ROCKETMQ binary: signed 16-bit code and version, zero-length remark/keys/values decode as
    /// absent (so an empty extFields decodes as `None`), bytes after the extFields area ignored
    /// (as Java does), unknown language codes mapped to [`UNKNOWN_LANGUAGE`].
    ///
    /// # Errors
    /// Invalid UTF-8, invalid JSON or JSON of the wrong shape, integers out of range, negative
    /// or overlong lengths in a binary header.
    pub fn decode_header(serialize_type: SerializeType, header: &[u8]) -> Result<RemotingCommand> {
        match serialize_type {
            SerializeType::Json => decode_json_header(header),
            SerializeType::RocketMq => decode_rocketmq_header(header),
        }
    }
}

/// `len` as a frame's int32 length field (inlined: a check on every header entry written; its
/// error is built out of line).
#[inline]
fn len_i32(len: usize, what: &'static str) -> Result<i32> {
    match i32::try_from(len) {
        Ok(n) => Ok(n),
        Err(_) => Err(too_long(len, what)),
    }
}

#[cold]
fn too_long(len: usize, what: &'static str) -> ProtoError {
    ProtoError::BadLength(format!(
        "{what} of {len} bytes does not fit an int32 length"
    ))
}

/// Writes `v` in decimal without going through `fmt`.
fn put_decimal(dst: &mut BytesMut, v: i32) {
    dst.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Writes `s` as a JSON string with standard escaping: `\"`, `\\`, `\b`, `\f`, `\n`, `\r`,
/// `\t`, other control characters as `\u00XX`, everything else (`/`, DEL, non-ASCII) as is.
/// Runs without escapes are found eight bytes at a time and copied whole.
fn put_json_str(dst: &mut BytesMut, bytes: &[u8]) {
    dst.reserve(bytes.len() + 2);
    dst.put_u8(b'"');
    let mut start = 0;
    loop {
        let i = json_fast::find_special(bytes, start);
        dst.extend_from_slice(&bytes[start..i]);
        let Some(&b) = bytes.get(i) else { break };
        match json_fast::ESCAPE[usize::from(b)] {
            b'u' => dst.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ]),
            short => dst.extend_from_slice(&[b'\\', short]),
        }
        start = i + 1;
    }
    dst.put_u8(b'"');
}

/// `\u00XX` for each control character (one `push_str` per escape: RocketMQ's property
/// separators 0x01 and 0x02 are escaped several times in every send's header).
const CONTROL_ESCAPES: [&str; 32] = [
    "\\u0000", "\\u0001", "\\u0002", "\\u0003", "\\u0004", "\\u0005", "\\u0006", "\\u0007",
    "\\u0008", "\\u0009", "\\u000a", "\\u000b", "\\u000c", "\\u000d", "\\u000e", "\\u000f",
    "\\u0010", "\\u0011", "\\u0012", "\\u0013", "\\u0014", "\\u0015", "\\u0016", "\\u0017",
    "\\u0018", "\\u0019", "\\u001a", "\\u001b", "\\u001c", "\\u001d", "\\u001e", "\\u001f",
];

/// Appends `s` to `out` as a JSON string (quoted, escaped as the JSON header encoder escapes
/// strings), for callers writing [`RemotingCommand::ext_fields_raw`].
pub fn push_json_str(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    push_json_str_contents(out, s);
    out.push('"');
}

/// [`push_json_str`] without the quotes, for writers of a string in pieces.
pub(crate) fn push_json_str_contents(out: &mut String, s: &str) {
    let bytes = s.as_bytes();
    let mut start = 0;
    loop {
        let i = json_fast::find_special(bytes, start);
        // `i` is at a special byte (ASCII) or at the end: a character boundary.
        out.push_str(&s[start..i]);
        let Some(&b) = bytes.get(i) else { break };
        match json_fast::ESCAPE[usize::from(b)] {
            b'u' => out.push_str(CONTROL_ESCAPES[usize::from(b)]),
            short => {
                out.push('\\');
                out.push(char::from(short));
            }
        }
        start = i + 1;
    }
}

/// The byte-at-a-time `put_json_str` this module had before, kept as the reference the
/// current one must match byte for byte.
#[cfg(test)]
fn put_json_str_reference(dst: &mut BytesMut, s: &str) {
    dst.reserve(s.len() + 2);
    dst.put_u8(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => b"",
            _ => continue,
        };
        dst.extend_from_slice(&bytes[start..i]);
        start = i + 1;
        if short.is_empty() {
            dst.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(b >> 4) as usize],
                HEX[(b & 0xf) as usize],
            ]);
        } else {
            dst.extend_from_slice(short);
        }
    }
    dst.extend_from_slice(&bytes[start..]);
    dst.put_u8(b'"');
}

// --- JSON header decoding --------------------------------------------------------------------

mod json_fast;

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
fn decode_json_header(header: &[u8]) -> Result<RemotingCommand> {
    decode_json_header_shared(Bytes::copy_from_slice(header))
}

/// A JSON header: the single-pass decoder for the common shape (whose extFields share
/// `header`), else serde (which defines the meaning of every other input, and every error).
fn decode_json_header_shared(header: Bytes) -> Result<RemotingCommand> {
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

// --- ROCKETMQ binary header decoding ---------------------------------------------------------

/// A bounds-checked big-endian reader over a header.
struct HeaderReader<'a> {
    buf: &'a [u8],
}

impl<'a> HeaderReader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        if self.buf.len() < n {
            return Err(ProtoError::Truncated {
                what,
                need: n,
                have: self.buf.len(),
            });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }

    fn i16(&mut self, what: &'static str) -> Result<i16> {
        let b = self.take(2, what)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn i32(&mut self, what: &'static str) -> Result<i32> {
        let b = self.take(4, what)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A length-prefixed string; zero length gives `None`.
    fn string(&mut self, len: i64, what: &'static str) -> Result<Option<String>> {
        let s = self.str(len, what)?;
        Ok((!s.is_empty()).then(|| s.to_owned()))
    }

    /// A length-prefixed string, borrowed.
    fn str(&mut self, len: i64, what: &'static str) -> Result<&'a str> {
        let bytes = self.bytes(len, what)?;
        std::str::from_utf8(bytes).map_err(|_| ProtoError::Utf8(what))
    }

    /// Length-prefixed bytes, borrowed.
    fn bytes(&mut self, len: i64, what: &'static str) -> Result<&'a [u8]> {
        if len < 0 {
            return Err(ProtoError::BadLength(format!(
                "negative {what} length {len}"
            )));
        }
        self.take(len as usize, what)
    }
}

/// One entry of a binary header's extFields area: `int16 keyLen | key | int32 valueLen |
/// value`, both borrowed and not yet checked as UTF-8.
fn next_rocketmq_entry<'a>(e: &mut HeaderReader<'a>) -> Result<(&'a [u8], &'a [u8])> {
    let key_len = e.i16("extFields key length")?;
    let key = e.bytes(i64::from(key_len), "extFields key")?;
    let value_len = e.i32("extFields value length")?;
    let value = e.bytes(i64::from(value_len), "extFields value")?;
    Ok((key, value))
}

/// Where the entries of a binary extFields area are: `(key, value)` ranges of the area, in
/// order, or `None` once it ends; `Err(())` for a malformed entry (a length that is negative
/// or runs past the area: [`next_rocketmq_entry`] says which).
#[inline]
pub(crate) fn rocketmq_entry_at(
    area: &[u8],
    at: &mut usize,
) -> std::result::Result<Option<(Span, Span)>, ()> {
    let rest = &area[*at..];
    if rest.is_empty() {
        return Ok(None);
    }
    let (key_len, rest) = rest.split_first_chunk::<2>().ok_or(())?;
    let key_len = usize::try_from(i16::from_be_bytes(*key_len)).map_err(|_| ())?;
    let value_len = rest
        .get(key_len..)
        .and_then(<[u8]>::first_chunk::<4>)
        .ok_or(())?;
    let value_len = usize::try_from(i32::from_be_bytes(*value_len)).map_err(|_| ())?;
    let key_start = *at + 2;
    let value_start = key_start + key_len + 4;
    let end = value_start + value_len;
    if end > area.len() {
        return Err(());
    }
    *at = end;
    Ok(Some(((key_start, key_len), (value_start, value_len))))
}

/// A binary header's extFields area: copied once into the map's text with every length field
/// (and every dropped entry) overwritten by spaces, so the text is UTF-8 exactly when each key
/// and value is by itself
/// (an ASCII byte sits before every string and after every one but the last, so no character
/// can straddle two strings), and checked once; entries are spans of it. Entries with an empty
/// key or value are dropped; an area left with none is no extFields at all, as an empty area
/// is (so the command encodes back to itself).
///
/// One pass does it all when every key is new and there are at most `INDEX_FROM` entries (a
/// send's 14, an answer's 5): the entries are recorded while the length fields are blanked;
/// otherwise a second pass records them through the map's general path.
fn decode_rocketmq_ext_fields(area: &[u8]) -> Result<Option<ExtFields>> {
    let mut text = area.to_vec();
    // An entry takes at least 8 bytes (2 + 1 + 4 + 1).
    let mut ext = ExtFields::with_text(String::new(), (area.len() / 8).min(INDEX_FROM));
    let mut one_pass = true;
    let mut entries = 0usize;
    let mut at = 0usize;
    loop {
        match rocketmq_entry_at(area, &mut at) {
            Ok(Some(((k, klen), (v, vlen)))) => {
                if klen != 0 && vlen != 0 {
                    text[k - 2..k].fill(b' ');
                    text[v - 4..v].fill(b' ');
                    entries += 1;
                    one_pass = one_pass && ext.push_new((k, klen), &area[k..k + klen], (v, vlen));
                } else {
                    // Dropped: its bytes are not checked either.
                    text[k - 2..v + vlen].fill(b' ');
                }
            }
            Ok(None) => break,
            Err(()) => return Err(rocketmq_area_error(area)),
        }
    }
    if entries == 0 {
        return Ok(None);
    }
    let text = match String::from_utf8(text) {
        Ok(t) => t,
        // Which string is bad, for the error.
        Err(_) => return Err(first_bad_rocketmq_string(area)),
    };
    if one_pass {
        ext.set_text(text);
        return Ok(Some(ext));
    }
    let mut ext = ExtFields::with_text(text, entries);
    let mut at = 0usize;
    while let Ok(Some((key, value))) = rocketmq_entry_at(area, &mut at) {
        if key.1 != 0 && value.1 != 0 {
            ext.record_spans_of(key, &area[key.0..key.0 + key.1], value);
        }
    }
    ext.finish_spans();
    Ok(Some(ext))
}

/// The error of the first malformed entry of a binary extFields area.
#[cold]
fn rocketmq_area_error(area: &[u8]) -> ProtoError {
    let mut e = HeaderReader { buf: area };
    while !e.buf.is_empty() {
        if let Err(err) = next_rocketmq_entry(&mut e) {
            return err;
        }
    }
    ProtoError::BadLength("malformed extFields area".into())
}

/// The error of the first kept key or value of a binary extFields area that is not UTF-8 by
/// itself.
fn first_bad_rocketmq_string(area: &[u8]) -> ProtoError {
    let mut e = HeaderReader { buf: area };
    while !e.buf.is_empty() {
        let (key, value) = match next_rocketmq_entry(&mut e) {
            Ok(kv) => kv,
            Err(err) => return err,
        };
        if key.is_empty() || value.is_empty() {
            continue;
        }
        if std::str::from_utf8(key).is_err() {
            return ProtoError::Utf8("extFields key");
        }
        if std::str::from_utf8(value).is_err() {
            return ProtoError::Utf8("extFields value");
        }
    }
    ProtoError::Utf8("extFields value")
}

fn decode_rocketmq_header(header: &[u8]) -> Result<RemotingCommand> {
    let (mut cmd, area) = decode_rocketmq_fixed(header)?;
    if !area.is_empty() {
        cmd.ext_fields = decode_rocketmq_ext_fields(area)?;
    }
    Ok(cmd)
}

/// `area` (a slice of `frame`) as a [`RawExtFields::BinaryArea`], if it qualifies: well
/// formed, at least one entry, no empty key or value (the map drops those), every length
/// field's bytes ASCII and the whole area UTF-8. The last two make every key and value UTF-8
/// by itself: each is bounded by ASCII bytes or the area's ends, and an ASCII byte is never
/// inside a character. Anything else is left to the map's decode (and its errors).
fn keepable_area(frame: &Bytes, area: &[u8]) -> Option<ByteString> {
    if area.is_empty() {
        return None;
    }
    let mut at = 0;
    while let Some(((_, kl), (_, vl))) = rocketmq_entry_at(area, &mut at).ok()? {
        let lengths = (kl as u64) << 32 | vl as u64;
        if kl == 0 || vl == 0 || lengths & 0x0000_8080_8080_8080 != 0 {
            return None;
        }
    }
    let start = area.as_ptr() as usize - frame.as_ptr() as usize;
    ByteString::try_from(frame.slice(start..start + area.len())).ok()
}

/// A binary header's fixed fields and remark (the command, without extFields or body) and
/// its extFields area.
fn decode_rocketmq_fixed(header: &[u8]) -> Result<(RemotingCommand, &[u8])> {
    let mut r = HeaderReader { buf: header };
    let code = r.i16("binary header code")?;
    let language =
        LanguageCode::from_code(r.u8("binary header language")?).unwrap_or(UNKNOWN_LANGUAGE);
    let version = r.i16("binary header version")?;
    let opaque = r.i32("binary header opaque")?;
    let flag = r.i32("binary header flag")?;
    let remark_len = r.i32("binary header remark length")?;
    let remark = r.string(i64::from(remark_len), "binary header remark")?;
    let ext_len = r.i32("binary header extFields length")?;
    if ext_len < 0 {
        return Err(ProtoError::BadLength(format!(
            "negative extFields length {ext_len}"
        )));
    }
    let ext_area = r.take(ext_len as usize, "binary header extFields")?;
    let cmd = RemotingCommand {
        code: i32::from(code),
        language,
        version: i32::from(version),
        opaque,
        flag,
        remark,
        ext_fields: None,
        ext_fields_raw: None,
        serialize_type: SerializeType::RocketMq,
        body: None,
    };
    Ok((cmd, ext_area))
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

    // --- frame codec -------------------------------------------------------------------------

    use proptest::prelude::*;

    const SPEC_JSON_REQUEST: &str = r#"{"code":310,"extFields":{"a":"PG","b":"T","c":"TBW102","d":"4","e":"1","f":"0","g":"1700000000000","h":"0","i":"UNIQ_KEY\u0001ABC\u0002WAIT\u0001true\u0002TAGS\u0001tagA\u0002","j":"0","k":"false","m":"false","n":"broker-a"},"flag":0,"language":"JAVA","opaque":7,"serializeTypeCurrentRPC":"JSON","version":479}"#;
    const SPEC_JSON_RESPONSE: &str = r#"{"code":0,"extFields":{"queueId":"1","transactionId":"ABC","msgId":"7F00000100002A9F0000000000000000","TRACE_ON":"true","MSG_REGION":"DefaultRegion","queueOffset":"0"},"flag":1,"language":"JAVA","opaque":7,"serializeTypeCurrentRPC":"JSON","version":479}"#;

    fn ext(pairs: &[(&str, &str)]) -> ExtFields {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn spec_send_request() -> RemotingCommand {
        RemotingCommand {
            code: 310,
            language: LanguageCode::Java,
            version: 479,
            opaque: 7,
            flag: 0,
            remark: None,
            ext_fields: Some(ext(&[
                ("a", "PG"),
                ("b", "T"),
                ("c", "TBW102"),
                ("d", "4"),
                ("e", "1"),
                ("f", "0"),
                ("g", "1700000000000"),
                ("h", "0"),
                (
                    "i",
                    "UNIQ_KEY\u{1}ABC\u{2}WAIT\u{1}true\u{2}TAGS\u{1}tagA\u{2}",
                ),
                ("j", "0"),
                ("k", "false"),
                ("m", "false"),
                ("n", "broker-a"),
            ])),
            ext_fields_raw: None,
            serialize_type: SerializeType::Json,
            body: Some(Bytes::from_static(b"hi")),
        }
    }

    fn spec_send_response() -> RemotingCommand {
        RemotingCommand {
            code: 0,
            language: LanguageCode::Java,
            version: 479,
            opaque: 7,
            flag: 1,
            remark: None,
            ext_fields: Some(ext(&[
                ("queueId", "1"),
                ("transactionId", "ABC"),
                ("msgId", "7F00000100002A9F0000000000000000"),
                ("TRACE_ON", "true"),
                ("MSG_REGION", "DefaultRegion"),
                ("queueOffset", "0"),
            ])),
            ext_fields_raw: None,
            serialize_type: SerializeType::Json,
            body: None,
        }
    }

    /// Splits a whole frame (with its length field) and decodes it.
    fn decode_whole(frame: &[u8]) -> Result<RemotingCommand> {
        let mut buf = BytesMut::from(frame);
        let inner = split_frame(&mut buf, MAX_FRAME_LEN)?
            .ok_or_else(|| ProtoError::Invalid("incomplete".into()))?;
        assert!(buf.is_empty());
        RemotingCommand::decode(inner)
    }

    fn json_frame(header: &str, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&((4 + header.len() + body.len()) as i32).to_be_bytes());
        v.extend_from_slice(&(header.len() as u32).to_be_bytes());
        v.extend_from_slice(header.as_bytes());
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn spec_json_request_encodes_byte_for_byte() {
        let frame = spec_send_request().to_frame().unwrap();
        assert_eq!(SPEC_JSON_REQUEST.len(), 310);
        assert_eq!(&frame[..8], &[0, 0, 0x01, 0x3c, 0, 0, 0x01, 0x36]);
        assert_eq!(&frame[8..318], SPEC_JSON_REQUEST.as_bytes());
        assert_eq!(&frame[318..], b"hi");
        assert_eq!(
            frame.as_ref(),
            json_frame(SPEC_JSON_REQUEST, b"hi").as_slice()
        );
        assert_eq!(decode_whole(&frame).unwrap(), spec_send_request());
    }

    #[test]
    fn json_headers_with_escapes_beyond_the_room_asked_for() {
        // Every byte of these strings needs an escape (6 bytes for a control character, 2 for
        // a quote): the header outgrows the room reserved for plain strings many times over.
        let mut ext = ExtFields::new();
        ext.insert("\u{1}\"key", "\u{2}".repeat(5000));
        ext.insert("plain", "value");
        let mut cmd = RemotingCommand::request(310).with_ext_fields(ext);
        cmd.remark = Some("\"\\\n".repeat(700));
        let mut header = BytesMut::from(&b"before"[..]);
        cmd.encode_header(&mut header).unwrap();
        assert_eq!(&header[..6], b"before");
        let text = std::str::from_utf8(&header[6..]).unwrap();
        assert!(text.ends_with('}'), "no bytes left over after the header");
        let back: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(back["remark"], cmd.remark.clone().unwrap());
        assert_eq!(back["extFields"]["\u{1}\"key"], "\u{2}".repeat(5000));
        assert_eq!(back["extFields"]["plain"], "value");
        let frame = cmd.to_frame().unwrap();
        assert_eq!(decode_whole(&frame).unwrap(), cmd);
    }

    #[test]
    fn spec_json_response_both_ways() {
        let mut header = BytesMut::new();
        spec_send_response().encode_header(&mut header).unwrap();
        assert_eq!(&header[..], SPEC_JSON_RESPONSE.as_bytes());
        let decoded = decode_whole(&json_frame(SPEC_JSON_RESPONSE, b"")).unwrap();
        assert_eq!(decoded, spec_send_response());
        // extFields keep the order of the wire.
        let keys: Vec<&str> = decoded.ext_fields.as_ref().unwrap().keys().collect();
        assert_eq!(keys[0], "queueId");
        assert_eq!(keys[5], "queueOffset");
    }

    fn spec_binary_frame() -> Vec<u8> {
        let mut entries = Vec::new();
        for (k, v) in spec_send_request().ext_fields.unwrap() {
            entries.extend_from_slice(&(k.len() as i16).to_be_bytes());
            entries.extend_from_slice(k.as_bytes());
            entries.extend_from_slice(&(v.len() as i32).to_be_bytes());
            entries.extend_from_slice(v.as_bytes());
        }
        assert_eq!(entries.len(), 169);
        let mut v = vec![
            0x00, 0x00, 0x00, 0xc4, 0x01, 0x00, 0x00, 0xbe, 0x01, 0x36, 0x00, 0x01, 0xdf, 0x00,
            0x00, 0x00, 0x07, // len=196, type 1, hdr=190; code=310 lang=0 ver=479 opaque=7
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xa9,
        ];
        assert_eq!(
            &entries[..18],
            &[
                0x00, 0x01, 0x61, 0x00, 0x00, 0x00, 0x02, 0x50, 0x47, 0x00, 0x01, 0x62, 0x00, 0x00,
                0x00, 0x01, 0x54, 0x00
            ]
        );
        v.extend_from_slice(&entries);
        v.extend_from_slice(b"hi");
        v
    }

    #[test]
    fn spec_binary_example_both_ways() {
        let mut cmd = spec_send_request();
        cmd.serialize_type = SerializeType::RocketMq;
        let expected = spec_binary_frame();
        assert_eq!(cmd.to_frame().unwrap().as_ref(), expected.as_slice());
        assert_eq!(decode_whole(&expected).unwrap(), cmd);
    }

    #[test]
    fn json_decoding_is_lenient_like_java() {
        let minimal = decode_whole(&json_frame(r#"{"code":0,"flag":1,"opaque":7}"#, b"")).unwrap();
        assert_eq!(minimal.code, 0);
        assert!(minimal.is_response());
        assert_eq!(minimal.opaque, 7);
        assert_eq!(minimal.language, LanguageCode::Java);
        assert_eq!(minimal.version, 0);
        assert_eq!(minimal.remark, None);
        assert_eq!(minimal.ext_fields, None);
        assert_eq!(minimal.body, None);

        // Section 10: C++ client: no serializeTypeCurrentRPC, scalar values, trailing newline,
        // keys in another order, unknown keys.
        let cpp = "{\"version\":63,\"unknown\":[1,{\"x\":2}],\"opaque\":-5,\"language\":\"CPP\",\
            \"extFields\":{\"queueId\":1,\"unitMode\":false,\"big\":12345678901234,\"neg\":-3,\
            \"f\":1.5,\"gone\":null,\"AccessKey\":\"\",\"obj\":{\"k\":[1,\"v\"]}},\"remark\":\"\",\"code\":11,\"flag\":0}\n\n";
        let c = decode_whole(&json_frame(cpp, b"body")).unwrap();
        assert_eq!(c.code, 11);
        assert_eq!(c.version, 63);
        assert_eq!(c.opaque, -5);
        assert_eq!(c.language, LanguageCode::Cpp);
        assert_eq!(c.remark.as_deref(), Some(""));
        assert_eq!(c.ext("queueId"), Some("1"));
        assert_eq!(c.ext("unitMode"), Some("false"));
        assert_eq!(c.ext("big"), Some("12345678901234"));
        assert_eq!(c.ext("neg"), Some("-3"));
        assert_eq!(c.ext("f"), Some("1.5"));
        assert_eq!(c.ext("gone"), None);
        assert_eq!(c.ext("AccessKey"), Some(""));
        assert_eq!(c.ext("obj"), Some(r#"{"k":[1,"v"]}"#));
        assert_eq!(c.body.as_deref(), Some(&b"body"[..]));

        let odd = decode_whole(&json_frame(
            r#"{"code":"310","language":"COBOL","flag":null,"remark":null,"extFields":{}}"#,
            b"",
        ))
        .unwrap();
        assert_eq!(odd.code, 310);
        assert_eq!(odd.language, UNKNOWN_LANGUAGE);
        assert_eq!(odd.flag, 0);
        assert_eq!(odd.ext_fields, Some(ExtFields::new()));
        let numeric_lang =
            RemotingCommand::decode_header(SerializeType::Json, br#"{"language":12}"#).unwrap();
        assert_eq!(numeric_lang.language, LanguageCode::Rust);
    }

    #[test]
    fn json_escapes_like_standard_json() {
        let mut cmd = RemotingCommand::response(
            1,
            Some("a\"b\\c/d\n\r\t\u{8}\u{c}\u{0}\u{1f}é😀\u{7f}".into()),
        );
        cmd.ext_fields = Some(ext(&[("k\u{1}", "v\u{2}")]));
        let mut h = BytesMut::new();
        cmd.encode_header(&mut h).unwrap();
        let text = std::str::from_utf8(&h).unwrap();
        assert!(
            text.contains(r#""remark":"a\"b\\c/d\n\r\t\b\f\u0000\u001fé😀"#),
            "{text}"
        );
        assert!(
            text.contains(r#""extFields":{"k\u0001":"v\u0002"}"#),
            "{text}"
        );
        assert_eq!(
            RemotingCommand::decode_header(SerializeType::Json, &h).unwrap(),
            cmd
        );
    }

    #[test]
    fn binary_quirks() {
        // Empty remark and empty values decode as absent; an empty map decodes as None.
        let mut cmd = RemotingCommand::request(10).with_ext_fields(ext(&[("a", ""), ("b", "x")]));
        cmd.serialize_type = SerializeType::RocketMq;
        cmd.remark = Some(String::new());
        let d = decode_whole(&cmd.to_frame().unwrap()).unwrap();
        assert_eq!(d.remark, None);
        assert_eq!(d.ext_fields, Some(ext(&[("b", "x")])));
        cmd.ext_fields = Some(ExtFields::new());
        assert_eq!(
            decode_whole(&cmd.to_frame().unwrap()).unwrap().ext_fields,
            None
        );
        // An area whose entries are all dropped (empty keys or values) is no map either, so the
        // decoded command encodes back to itself (libFuzzer's header_binary found Some({})).
        cmd.ext_fields = Some(ext(&[("a", ""), ("", "b")]));
        let d = decode_whole(&cmd.to_frame().unwrap()).unwrap();
        assert_eq!(d.ext_fields, None);
        assert_eq!(decode_whole(&d.to_frame().unwrap()).unwrap(), d);
        // Negative codes are legal and read back signed; unknown language codes are kept as Other.
        cmd.code = -2;
        let mut frame = BytesMut::from(&cmd.to_frame().unwrap()[..]);
        frame[10] = 200; // language byte
        let d = decode_whole(&frame).unwrap();
        assert_eq!(d.code, -2);
        assert_eq!(d.language, UNKNOWN_LANGUAGE);
    }

    /// A binary frame (code 10, nothing else) whose extFields area holds `entries` as given,
    /// bytes not checked.
    fn binary_frame_with(entries: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut area = Vec::new();
        for (k, v) in entries {
            area.extend_from_slice(&(k.len() as i16).to_be_bytes());
            area.extend_from_slice(k);
            area.extend_from_slice(&(v.len() as i32).to_be_bytes());
            area.extend_from_slice(v);
        }
        let mut header = vec![
            0x00, 0x0a, 12, 0x01, 0xdf, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        header.extend_from_slice(&(area.len() as i32).to_be_bytes());
        header.extend_from_slice(&area);
        let mut v = Vec::new();
        v.extend_from_slice(&((4 + header.len()) as i32).to_be_bytes());
        v.extend_from_slice(&(0x0100_0000 | header.len() as u32).to_be_bytes());
        v.extend_from_slice(&header);
        v
    }

    #[test]
    fn binary_ext_fields_are_utf8_string_by_string() {
        // "é" is 0xc3 0xa9: split between a key and its value, the text as a whole is UTF-8
        // but neither string is.
        let split: &[(&[u8], &[u8])] = &[(b"ok", b"fine"), (b"k\xc3", b"\xa9v")];
        assert!(std::str::from_utf8(b"okfinek\xc3\xa9v").is_ok());
        assert!(matches!(
            decode_whole(&binary_frame_with(split)),
            Err(ProtoError::Utf8("extFields key"))
        ));
        let bad_value: &[(&[u8], &[u8])] = &[(b"k", b"\xff")];
        assert!(matches!(
            decode_whole(&binary_frame_with(bad_value)),
            Err(ProtoError::Utf8("extFields value"))
        ));
        // Whole characters anywhere are fine.
        let fine: &[(&[u8], &[u8])] = &[("ké".as_bytes(), "é".as_bytes()), (b"x", b"y")];
        let d = decode_whole(&binary_frame_with(fine)).unwrap();
        assert_eq!(d.ext_fields, Some(ext(&[("ké", "é"), ("x", "y")])));
    }

    #[test]
    fn binary_ext_fields_repeated_keys_keep_the_last_value() {
        // Replaced values are most of the text (it is compacted once every entry is in).
        let big: Vec<Vec<u8>> = (0..6).map(|i| vec![b'a' + i; 3000]).collect();
        let mut entries: Vec<(&[u8], &[u8])> = Vec::new();
        for v in &big {
            entries.push((b"k", v));
            entries.push((b"other", b"o"));
        }
        entries.push((b"last", b"z"));
        let d = decode_whole(&binary_frame_with(&entries)).unwrap();
        let ext_fields = d.ext_fields.unwrap();
        let want = "f".repeat(3000);
        assert_eq!(
            ext_fields.iter().collect::<Vec<_>>(),
            vec![("k", want.as_str()), ("other", "o"), ("last", "z")]
        );
        assert!(
            ext_fields.text_len() < 2 * 3000 + 100,
            "{}",
            ext_fields.text_len()
        );
    }

    #[test]
    fn binary_encoding_refuses_what_does_not_fit() {
        let mut cmd = RemotingCommand::request(200_050); // POP family
        cmd.serialize_type = SerializeType::RocketMq;
        let mut dst = BytesMut::from(&b"keep"[..]);
        let err = cmd.encode(&mut dst).unwrap_err();
        assert!(
            matches!(err, ProtoError::InvalidField { field: "code", .. }),
            "{err}"
        );
        assert_eq!(&dst[..], b"keep", "nothing appended on error");
        cmd.code = 32_768;
        assert!(cmd.to_frame().is_err());
        cmd.code = 32_767;
        assert!(cmd.to_frame().is_ok());
        cmd.code = -32_769;
        assert!(cmd.to_frame().is_err());
        cmd.code = 10;
        cmd.version = 40_000;
        assert!(matches!(
            cmd.to_frame().unwrap_err(),
            ProtoError::InvalidField {
                field: "version",
                ..
            }
        ));
        cmd.version = 479;
        cmd.ext_fields = Some(ext(&[(&"k".repeat(40_000), "v")]));
        assert!(matches!(
            cmd.to_frame().unwrap_err(),
            ProtoError::InvalidField {
                field: "extFields",
                ..
            }
        ));
        // The same command is fine with JSON.
        cmd.serialize_type = SerializeType::Json;
        cmd.code = 200_050;
        assert_eq!(decode_whole(&cmd.to_frame().unwrap()).unwrap(), cmd);
    }

    #[test]
    fn split_frame_waits_for_whole_frames_and_checks_lengths() {
        let frame = spec_send_request().to_frame().unwrap();
        let mut buf = BytesMut::new();
        for (i, b) in frame.iter().enumerate() {
            assert_eq!(
                split_frame(&mut buf, MAX_FRAME_LEN).unwrap(),
                None,
                "byte {i}"
            );
            buf.extend_from_slice(&[*b]);
        }
        buf.extend_from_slice(&frame[..3]); // start of a second frame stays buffered
        let inner = split_frame(&mut buf, MAX_FRAME_LEN).unwrap().unwrap();
        assert_eq!(inner.len(), frame.len() - 4);
        assert_eq!(&buf[..], &frame[..3]);

        let err = |bytes: &[u8], max| split_frame(&mut BytesMut::from(bytes), max).unwrap_err();
        assert!(matches!(
            err(&[0xff, 0xff, 0xff, 0xfe], MAX_FRAME_LEN),
            ProtoError::BadLength(_)
        ));
        assert!(matches!(
            err(&[0, 0, 0, 3, 0, 0, 0], MAX_FRAME_LEN),
            ProtoError::BadLength(_)
        ));
        assert_eq!(
            err(&[0x01, 0x00, 0x00, 0x00], MAX_FRAME_LEN),
            ProtoError::FrameTooLarge {
                len: 16_777_220,
                max: MAX_FRAME_LEN
            }
        );
        // Exactly at the limit (length field included) is accepted.
        let mut at_limit = BytesMut::from(&[0u8, 0, 0, 12][..]);
        at_limit.extend_from_slice(&[0; 12]);
        assert!(split_frame(&mut at_limit, 16).unwrap().is_some());
        assert!(matches!(
            split_frame(&mut BytesMut::from(&[0u8, 0, 0, 13][..]), 16).unwrap_err(),
            ProtoError::FrameTooLarge { len: 17, max: 16 }
        ));
    }

    #[test]
    fn malformed_frames_are_errors() {
        let dec = |b: &'static [u8]| RemotingCommand::decode(Bytes::from_static(b)).unwrap_err();
        assert!(matches!(dec(b"\0\0"), ProtoError::Truncated { .. }));
        assert!(matches!(dec(b"\0\0\0\x05{}"), ProtoError::BadLength(_)));
        assert!(matches!(
            dec(b"\x02\0\0\x02{}"),
            ProtoError::UnknownSerializeType(2)
        ));
        assert!(matches!(dec(b"\0\0\0\x02{\xff"), ProtoError::Utf8(_)));
        assert!(matches!(dec(b"\0\0\0\x03{\"\xc3"), ProtoError::Utf8(_)));
        assert!(matches!(dec(b"\0\0\0\x02[]"), ProtoError::Json { .. }));
        assert!(matches!(dec(b"\0\0\0\x01{"), ProtoError::Json { .. }));
        assert!(matches!(dec(b"\0\0\0\x00"), ProtoError::Json { .. }));
        let json = |h: &str| decode_whole(&json_frame(h, b"")).unwrap_err();
        for bad in [
            r#"{"code":1e400}"#,
            r#"{"code":1.5}"#,
            r#"{"code":2147483648}"#,
            r#"{"opaque":"x"}"#,
            r#"{"extFields":[1]}"#,
            r#"{"extFields":{"a":"b",}}"#,
            r#"{"remark":5}"#,
            "{}    xxxx",
            "{\"remark\":\"\\ud800\"}",
        ] {
            assert!(matches!(json(bad), ProtoError::Json { .. }), "{bad}");
        }
        // Binary: truncated fixed part, negative and lying lengths, bad UTF-8.
        assert!(matches!(
            dec(b"\x01\0\0\x03\0\x01\0"),
            ProtoError::Truncated { .. }
        ));
        let binary = |remark_len: i32, remark: &[u8], ext_len: i32, ext: &[u8]| {
            let mut h = vec![0, 10, 12, 1, 0xdf, 0, 0, 0, 1, 0, 0, 0, 0];
            h.extend_from_slice(&remark_len.to_be_bytes());
            h.extend_from_slice(remark);
            h.extend_from_slice(&ext_len.to_be_bytes());
            h.extend_from_slice(ext);
            RemotingCommand::decode_header(SerializeType::RocketMq, &h)
        };
        assert!(binary(0, b"", 0, b"").is_ok());
        assert!(matches!(
            binary(-1, b"", 0, b"").unwrap_err(),
            ProtoError::BadLength(_)
        ));
        assert!(matches!(
            binary(9, b"abc", 0, b"").unwrap_err(),
            ProtoError::Truncated { .. }
        ));
        assert!(matches!(
            binary(2, b"\xff\xfe", 0, b"").unwrap_err(),
            ProtoError::Utf8(_)
        ));
        assert!(matches!(
            binary(0, b"", -7, b"").unwrap_err(),
            ProtoError::BadLength(_)
        ));
        assert!(matches!(
            binary(0, b"", 100, b"\0\x01a").unwrap_err(),
            ProtoError::Truncated { .. }
        ));
        assert!(matches!(
            binary(0, b"", 3, b"\0\x01a").unwrap_err(),
            ProtoError::Truncated { .. }
        ));
        assert!(matches!(
            binary(0, b"", 8, b"\0\x01a\xff\xff\xff\xff\0").unwrap_err(),
            ProtoError::BadLength(_)
        ));
        assert!(matches!(
            binary(0, b"", 8, b"\xff\xffa\0\0\0\0\0").unwrap_err(),
            ProtoError::BadLength(_)
        ));
        assert!(matches!(
            binary(0, b"", 8, b"\0\x01a\0\0\0\x01\xff").unwrap_err(),
            ProtoError::Utf8(_)
        ));
    }

    fn arb_ext() -> impl Strategy<Value = Option<ExtFields>> {
        proptest::option::of(
            proptest::collection::vec((any::<String>(), any::<String>()), 0..8)
                .prop_map(|v| v.into_iter().collect::<ExtFields>()),
        )
    }

    prop_compose! {
        fn arb_command(serialize_type: SerializeType)(
            code in any::<i32>(),
            language in 0u8..14,
            version in any::<i32>(),
            opaque in any::<i32>(),
            flag in any::<i32>(),
            remark in proptest::option::of(any::<String>()),
            ext_fields in arb_ext(),
            body in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64)),
        ) -> RemotingCommand {
            let (code, version) = match serialize_type {
                SerializeType::Json => (code, version),
                SerializeType::RocketMq => (i32::from(code as i16), i32::from(version as i16)),
            };
            RemotingCommand {
                code,
                language: LanguageCode::from_code(language).unwrap_or_default(),
                version,
                opaque,
                flag,
                remark,
                ext_fields,
                ext_fields_raw: None,
                serialize_type,
                body: body.map(Bytes::from),
            }
        }
    }

    /// What a decoder gives back for `cmd`: empty bodies are absent, and binary headers lose
    /// empty strings and empty maps.
    fn normalised(mut cmd: RemotingCommand) -> RemotingCommand {
        if cmd.body.as_ref().is_some_and(|b| b.is_empty()) {
            cmd.body = None;
        }
        if cmd.serialize_type == SerializeType::RocketMq {
            cmd.remark = cmd.remark.filter(|r| !r.is_empty());
            cmd.ext_fields = cmd
                .ext_fields
                .map(|m| {
                    m.into_iter()
                        .filter(|(k, v)| !k.is_empty() && !v.is_empty())
                        .collect::<ExtFields>()
                })
                .filter(|m| !m.is_empty());
        }
        cmd
    }

    proptest! {
        #[test]
        fn json_round_trip(cmd in arb_command(SerializeType::Json)) {
            let frame = cmd.to_frame().unwrap();
            prop_assert_eq!(decode_whole(&frame).unwrap(), normalised(cmd.clone()));
            // The header is standard JSON (serde_json agrees on every string).
            let mut h = BytesMut::new();
            cmd.encode_header(&mut h).unwrap();
            let v: serde_json::Value = serde_json::from_slice(&h).unwrap();
            prop_assert_eq!(v["remark"].as_str(), cmd.remark.as_deref());
        }

        #[test]
        fn binary_round_trip(cmd in arb_command(SerializeType::RocketMq)) {
            let frame = cmd.to_frame().unwrap();
            prop_assert_eq!(decode_whole(&frame).unwrap(), normalised(cmd));
        }

        #[test]
        fn binary_ext_fields_decode_as_entry_by_entry(
            entries in proptest::collection::vec(
                (
                    proptest::collection::vec(prop_oneof![Just(b'k'), Just(0xc3u8), Just(0xa9u8), any::<u8>()], 0..4),
                    proptest::collection::vec(prop_oneof![Just(b'v'), Just(0xc3u8), Just(0xa9u8), any::<u8>()], 0..6),
                ),
                // Past `INDEX_FROM` entries too: the one-pass decoder hands over to the map's
                // general path there, as it does at a key seen before.
                0..24,
            ),
            cut in any::<Option<proptest::sample::Index>>(),
            bad_len in any::<Option<(proptest::sample::Index, i32)>>(),
        ) {
            let mut area = Vec::new();
            let mut len_fields = Vec::new();
            for (k, v) in &entries {
                len_fields.push((area.len(), 2));
                area.extend_from_slice(&(k.len() as i16).to_be_bytes());
                area.extend_from_slice(k);
                len_fields.push((area.len(), 4));
                area.extend_from_slice(&(v.len() as i32).to_be_bytes());
                area.extend_from_slice(v);
            }
            // Malformed areas: a length field rewritten (negative, too long), or cut short.
            if let (Some((i, n)), false) = (bad_len, len_fields.is_empty()) {
                let (at, width) = len_fields[i.index(len_fields.len())];
                if width == 2 {
                    area[at..at + 2].copy_from_slice(&(n as i16).to_be_bytes());
                } else {
                    area[at..at + 4].copy_from_slice(&n.to_be_bytes());
                }
            }
            if let (Some(c), false) = (cut, area.is_empty()) {
                area.truncate(c.index(area.len()));
            }
            // The model: the area's layout first (its first malformed entry is the error),
            // then entry by entry, each string checked by itself.
            let model = (|| -> Result<Option<ExtFields>> {
                let mut e = HeaderReader { buf: &area };
                let mut all = Vec::new();
                while !e.buf.is_empty() {
                    all.push(next_rocketmq_entry(&mut e)?);
                }
                let mut map = ExtFields::new();
                for (k, v) in all {
                    if k.is_empty() || v.is_empty() {
                        continue;
                    }
                    let k = std::str::from_utf8(k).map_err(|_| ProtoError::Utf8("extFields key"))?;
                    let v = std::str::from_utf8(v).map_err(|_| ProtoError::Utf8("extFields value"))?;
                    map.insert(k, v);
                }
                Ok((!map.is_empty()).then_some(map))
            })();
            let got = decode_rocketmq_ext_fields(&area);
            match (got, model) {
                (Ok(g), Ok(m)) => prop_assert_eq!(g, m),
                (Err(g), Err(m)) => prop_assert_eq!(g.to_string(), m.to_string()),
                (g, m) => prop_assert!(false, "decoder {:?}, model {:?}", g, m),
            }
        }

        #[test]
        fn decimals_are_written_as_to_string_writes_them(v in any::<i64>(), w in any::<i32>()) {
            let mut out = Vec::new();
            push_decimal(&mut out, v);
            prop_assert_eq!(out, v.to_string().into_bytes());
            let mut dst = BytesMut::new();
            put_decimal(&mut dst, w);
            let want = w.to_string();
            prop_assert_eq!(&dst[..], want.as_bytes());
            for edge in [i64::MIN, i64::MAX, 0, -1] {
                let mut out = Vec::new();
                push_decimal(&mut out, edge);
                prop_assert_eq!(out, edge.to_string().into_bytes());
            }
        }

        #[test]
        fn json_strings_escape_like_serde_json(s in any::<String>()) {
            let mut out = BytesMut::new();
            put_json_str(&mut out, s.as_bytes());
            let expected = serde_json::to_string(&s).unwrap();
            prop_assert_eq!(&out[..], expected.as_bytes());
        }

        /// The run-copying `put_json_str` writes what the byte-at-a-time one did, and serde
        /// reads it back as the same string; strings dense in characters to escape, of
        /// lengths around the eight-byte steps, after text already in the buffer.
        #[test]
        fn json_strings_as_before(
            s in prop_oneof![
                any::<String>(),
                r#"[a-z"\\/\x00-\x1f\x7fé😀]{0,40}"#,
                r#"[a-z]{0,20}["\\\x00-\x1f][a-z]{0,20}"#,
            ],
            before in "[a-z]{0,3}",
        ) {
            let mut new = BytesMut::from(before.as_bytes());
            put_json_str(&mut new, s.as_bytes());
            let mut old = BytesMut::from(before.as_bytes());
            put_json_str_reference(&mut old, &s);
            prop_assert_eq!(&new[..], &old[..]);
            let back: String = serde_json::from_slice(&new[before.len()..]).unwrap();
            prop_assert_eq!(back, s);
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = RemotingCommand::decode(Bytes::from(bytes.clone()));
            let _ = RemotingCommand::decode_header(SerializeType::Json, &bytes);
            let _ = RemotingCommand::decode_header(SerializeType::RocketMq, &bytes);
            let mut buf = BytesMut::from(&bytes[..]);
            while let Ok(Some(frame)) = split_frame(&mut buf, 1024) {
                let _ = RemotingCommand::decode(frame);
            }
        }

        #[test]
        fn mutated_frames_never_panic(
            cmd in arb_command(SerializeType::RocketMq),
            json in any::<bool>(),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        ) {
            let mut cmd = cmd;
            if json {
                cmd.serialize_type = SerializeType::Json;
            }
            let mut frame = cmd.to_frame().unwrap().to_vec();
            for (i, b) in flips {
                let i = i.index(frame.len());
                frame[i] = b;
            }
            let mut buf = BytesMut::from(&frame[..]);
            if let Ok(Some(inner)) = split_frame(&mut buf, MAX_FRAME_LEN) {
                let _ = RemotingCommand::decode(inner);
            }
        }
    }
}
