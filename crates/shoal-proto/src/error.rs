//! The one error type of `shoal-proto`.

/// Everything that can go wrong while decoding or encoding protocol data.
///
/// Every variant names what was wrong, so that a broker can log the peer and the reason and
/// answer with a precise remark.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// Fewer bytes were available than the structure needs.
    #[error("truncated {what}: need {need} bytes, have {have}")]
    Truncated {
        /// What was being decoded.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// A frame larger than the limit (16 MiB including the length field by default).
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    FrameTooLarge {
        /// Declared frame length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A length field that contradicts the data around it.
    #[error("bad length: {0}")]
    BadLength(String),
    /// The serialize-type byte of a frame is neither 0 (JSON) nor 1 (ROCKETMQ).
    #[error("unknown serialize type {0}")]
    UnknownSerializeType(u8),
    /// Invalid JSON, or JSON of the wrong shape.
    #[error("bad JSON in {what}: {reason}")]
    Json {
        /// What was being decoded.
        what: &'static str,
        /// The parser's message.
        reason: String,
    },
    /// A required header field is absent.
    #[error("missing required header field `{field}`")]
    MissingField {
        /// The extFields key.
        field: &'static str,
    },
    /// A header field is present but its value cannot be parsed.
    #[error("invalid value {value:?} for header field `{field}`: {reason}")]
    InvalidField {
        /// The extFields key.
        field: &'static str,
        /// The value received.
        value: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A stored message whose magic code is unknown.
    #[error("bad message magic code {0:#010x}")]
    BadMagic(u32),
    /// A stored message whose body CRC does not match.
    #[error("body CRC mismatch: stored {stored:#x}, computed {computed:#x}")]
    BadCrc {
        /// CRC in the record.
        stored: u32,
        /// CRC of the body bytes.
        computed: u32,
    },
    /// A message property key or value that cannot be encoded.
    #[error("bad message property: {0}")]
    BadProperty(String),
    /// A compressed body that cannot be (de)compressed.
    #[error("compression error: {0}")]
    Compression(String),
    /// A string field that is not valid UTF-8.
    #[error("invalid UTF-8 in {0}")]
    Utf8(&'static str),
    /// Anything else that is malformed, with a description.
    #[error("{0}")]
    Invalid(String),
}

/// `Result` with [`ProtoError`].
pub type Result<T, E = ProtoError> = std::result::Result<T, E>;
