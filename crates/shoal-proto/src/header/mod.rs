//! Typed request and response headers ("custom headers", spec sections 1.5, 2 and 8).
//!
//! A header travels as the command's `extFields`: one string entry per non-null Java field,
//! keyed by the Java field name. Every header type implements [`CommandHeader`]; decode one
//! from a command with [`RemotingCommand::decode_command_header`] and build a command from one with
//! [`RemotingCommand::request_with_header`] or [`RemotingCommand::with_header`]:
//!
//! ```
//! use shoal_proto::code::request_code;
//! use shoal_proto::header::{CommandHeader, GetMaxOffsetRequestHeader};
//! use shoal_proto::RemotingCommand;
//!
//! let h = GetMaxOffsetRequestHeader { topic: "T".into(), queue_id: 1, ..Default::default() };
//! let cmd = RemotingCommand::request_with_header(request_code::GET_MAX_OFFSET, &h);
//! assert_eq!(cmd.ext("committed"), Some("true"));
//! let back: GetMaxOffsetRequestHeader = cmd.decode_command_header().unwrap();
//! assert_eq!(back, h);
//! ```
//!
//! Parsing follows Java (1.5, 10): integers are signed decimal, booleans are `true` when the
//! value is `"true"` (any case) or `"1"` and `false` otherwise, unknown keys are ignored. A
//! missing required field is [`ProtoError::MissingField`], an unparsable number
//! [`ProtoError::InvalidField`].

mod admin;
mod consumer;
mod namesrv;
mod pop;
mod send;

pub use admin::*;
pub use consumer::*;
pub use namesrv::*;
pub use pop::*;
pub use send::*;

use crate::command::ExtFields;
use crate::{ProtoError, RemotingCommand, Result};

/// A typed custom header: converts to and from a command's `extFields`.
pub trait CommandHeader: Sized {
    /// Appends this header's entries (every non-null field as a string) to `ext`.
    fn write_ext_fields(&self, ext: &mut ExtFields);

    /// Parses the header from `ext`, applying Java's rules.
    fn from_ext_fields(ext: &ExtFields) -> Result<Self>;

    /// This header's entries as a new map.
    fn to_ext_fields(&self) -> ExtFields {
        // Most headers have at most 16 entries: no re-hashing while they are written.
        let mut ext = ExtFields::with_capacity(16);
        self.write_ext_fields(&mut ext);
        ext
    }
}

/// A scalar header value: how a Java field type is written to and parsed from a string.
pub trait HeaderValue: Sized {
    /// Parses `value` received for the extFields key `field`.
    fn parse_value(field: &'static str, value: &str) -> Result<Self>;
    /// Appends the string written on the wire to `out`.
    fn push_value(&self, out: &mut String);
    /// The string written on the wire.
    fn to_value(&self) -> String {
        let mut out = String::new();
        self.push_value(&mut out);
        out
    }
}

impl HeaderValue for String {
    fn parse_value(_field: &'static str, value: &str) -> Result<Self> {
        Ok(value.to_owned())
    }
    fn push_value(&self, out: &mut String) {
        out.push_str(self);
    }
}

/// `value` as a number when it is 1 to `max_digits` ASCII digits (no sign): what `parse`
/// answers for it, without its general path. `max_digits` keeps the result in range.
#[inline]
pub(super) fn plain_digits(value: &str, max_digits: usize) -> Option<i64> {
    let bytes = value.as_bytes();
    if bytes.is_empty() || bytes.len() > max_digits {
        return None;
    }
    let mut n: i64 = 0;
    for &b in bytes {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        n = n * 10 + i64::from(d);
    }
    Some(n)
}

impl HeaderValue for i32 {
    fn parse_value(field: &'static str, value: &str) -> Result<Self> {
        if let Some(n) = plain_digits(value, 9) {
            // Nine digits fit an i32.
            return Ok(n as i32);
        }
        value
            .parse()
            .map_err(|e: std::num::ParseIntError| ProtoError::InvalidField {
                field,
                value: value.to_owned(),
                reason: format!("not a 32-bit integer: {e}"),
            })
    }
    fn push_value(&self, out: &mut String) {
        out.push_str(itoa::Buffer::new().format(*self));
    }
}

impl HeaderValue for i64 {
    fn parse_value(field: &'static str, value: &str) -> Result<Self> {
        if let Some(n) = plain_digits(value, 18) {
            return Ok(n);
        }
        value
            .parse()
            .map_err(|e: std::num::ParseIntError| ProtoError::InvalidField {
                field,
                value: value.to_owned(),
                reason: format!("not a 64-bit integer: {e}"),
            })
    }
    fn push_value(&self, out: &mut String) {
        out.push_str(itoa::Buffer::new().format(*self));
    }
}

impl HeaderValue for bool {
    /// Java's `Boolean.parseBoolean` (case-insensitive `"true"`), plus `"1"` as the C++ client
    /// sends it. Everything else is `false`; this never fails.
    fn parse_value(_field: &'static str, value: &str) -> Result<Self> {
        Ok(parse_java_bool(value))
    }
    fn push_value(&self, out: &mut String) {
        out.push_str(if *self { "true" } else { "false" });
    }
}

/// Java's `Boolean.parseBoolean` extended with `"1"` (C++ client, spec section 10).
pub fn parse_java_bool(value: &str) -> bool {
    value.eq_ignore_ascii_case("true") || value == "1"
}

/// How one declared field is read and written: required (`T`) or optional (`Option<T>`).
pub trait HeaderField: Sized {
    /// Reads the field `key` given its value in the map (`None` = absent).
    fn read_value(value: Option<&str>, key: &'static str) -> Result<Self>;
    /// Writes the field (nothing for `None`).
    fn write(&self, ext: &mut ExtFields, key: &'static str);
    /// Reads the field `key` from `ext`.
    fn read(ext: &ExtFields, key: &'static str) -> Result<Self> {
        Self::read_value(ext.get(key), key)
    }
}

macro_rules! header_field_impls {
    ($($t:ty),*) => {$(
        impl HeaderField for $t {
            fn read_value(value: Option<&str>, key: &'static str) -> Result<Self> {
                match value {
                    Some(v) => <$t as HeaderValue>::parse_value(key, v),
                    None => Err(ProtoError::MissingField { field: key }),
                }
            }
            fn write(&self, ext: &mut ExtFields, key: &'static str) {
                ext.insert_with(key, |out| self.push_value(out));
            }
        }
        impl HeaderField for Option<$t> {
            fn read_value(value: Option<&str>, key: &'static str) -> Result<Self> {
                value.map(|v| <$t as HeaderValue>::parse_value(key, v)).transpose()
            }
            fn write(&self, ext: &mut ExtFields, key: &'static str) {
                if let Some(v) = self {
                    ext.insert_with(key, |out| v.push_value(out));
                }
            }
        }
    )*};
}

header_field_impls!(String, i32, i64, bool, BoundaryType);

/// Reads a field that Java initialises to a default (primitive or initialised wrapper):
/// absent means `default`.
pub fn read_or<T: HeaderValue>(ext: &ExtFields, key: &'static str, default: T) -> Result<T> {
    read_value_or(ext.get(key), key, default)
}

/// [`read_or`] given the value found in the map (`None` = absent).
pub fn read_value_or<T: HeaderValue>(
    value: Option<&str>,
    key: &'static str,
    default: T,
) -> Result<T> {
    match value {
        Some(v) => T::parse_value(key, v),
        None => Ok(default),
    }
}

/// SEARCH_OFFSET_BY_TIMESTAMP `boundaryType`: which offset to answer when several messages
/// share the timestamp. Written `"LOWER"`/`"UPPER"`, parsed case-insensitively.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BoundaryType {
    /// The first matching offset (default).
    #[default]
    Lower,
    /// The last matching offset.
    Upper,
}

impl HeaderValue for BoundaryType {
    fn parse_value(field: &'static str, value: &str) -> Result<Self> {
        if value.eq_ignore_ascii_case("lower") {
            Ok(BoundaryType::Lower)
        } else if value.eq_ignore_ascii_case("upper") {
            Ok(BoundaryType::Upper)
        } else {
            Err(ProtoError::InvalidField {
                field,
                value: value.to_owned(),
                reason: "expected LOWER or UPPER".to_owned(),
            })
        }
    }
    fn push_value(&self, out: &mut String) {
        out.push_str(match self {
            BoundaryType::Lower => "LOWER",
            BoundaryType::Upper => "UPPER",
        });
    }
}

/// The fields every Java RPC request header inherits (`RpcRequestHeader`, `TopicRequestHeader`),
/// all optional. Java clients set `bname` on most broker requests.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct RpcFields {
    /// `ns`: namespace.
    pub namespace: Option<String>,
    /// `nsd`: whether names are already namespaced.
    pub namespaced: Option<bool>,
    /// `bname`: the broker name the client targets.
    pub broker_name: Option<String>,
    /// `oway`: oneway hint.
    pub oneway: Option<bool>,
    /// `lo`: logical (static) topic.
    pub logical: Option<bool>,
}

impl RpcFields {
    /// Only `bname` set, as Java clients send on most broker requests.
    pub fn with_broker_name(name: impl Into<String>) -> Self {
        Self {
            broker_name: Some(name.into()),
            ..Self::default()
        }
    }
}

impl RpcFields {
    /// Takes `key`/`value` if it is one of the RPC keys; returns whether it was.
    pub fn absorb(&mut self, key: &str, value: &str) -> bool {
        match key {
            "ns" => self.namespace = Some(value.to_owned()),
            "nsd" => self.namespaced = Some(parse_java_bool(value)),
            "bname" => self.broker_name = Some(value.to_owned()),
            "oway" => self.oneway = Some(parse_java_bool(value)),
            "lo" => self.logical = Some(parse_java_bool(value)),
            _ => return false,
        }
        true
    }
}

impl CommandHeader for RpcFields {
    fn write_ext_fields(&self, ext: &mut ExtFields) {
        self.namespace.write(ext, "ns");
        self.namespaced.write(ext, "nsd");
        self.broker_name.write(ext, "bname");
        self.oneway.write(ext, "oway");
        self.logical.write(ext, "lo");
    }

    fn from_ext_fields(ext: &ExtFields) -> Result<Self> {
        Ok(Self {
            namespace: HeaderField::read(ext, "ns")?,
            namespaced: HeaderField::read(ext, "nsd")?,
            broker_name: HeaderField::read(ext, "bname")?,
            oneway: HeaderField::read(ext, "oway")?,
            logical: HeaderField::read(ext, "lo")?,
        })
    }
}

/// A header with no fields at all (e.g. the responses of UPDATE_CONSUMER_OFFSET,
/// UNREGISTER_CLIENT, END_TRANSACTION): written as `{}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EmptyHeader;

impl CommandHeader for EmptyHeader {
    fn write_ext_fields(&self, _ext: &mut ExtFields) {}
    fn from_ext_fields(_ext: &ExtFields) -> Result<Self> {
        Ok(EmptyHeader)
    }
}

/// Generates a header struct, its `Default`, and its [`CommandHeader`] impl from a field list.
///
/// ```text
/// command_header! {
///     /// docs
///     pub struct Name [rpc] {          // `[rpc]` adds `pub rpc: RpcFields` (optional)
///         /// docs
///         field: String = "javaName";                 // required
///         other: Option<i32> = "other";               // optional
///         flag: bool = "flag", default true;          // absent => default
///     }
/// }
/// ```
macro_rules! command_header {
    (
        $(#[$meta:meta])*
        pub struct $name:ident $([$rpc:ident])? {
            $(
                $(#[$fmeta:meta])*
                $field:ident : $ty:ty = $key:literal $(, default $def:expr)? ;
            )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name {
            $(
                $(#[$fmeta])*
                #[doc = concat!("\n\nextFields key `", $key, "`.")]
                pub $field: $ty,
            )*
            $(
                /// Inherited RPC fields (`ns`, `nsd`, `bname`, `oway`, `lo`).
                pub $rpc: $crate::header::RpcFields,
            )?
        }

        impl Default for $name {
            fn default() -> Self {
                Self {
                    $( $field: command_header!(@default $($def)?), )*
                    $( $rpc: $crate::header::RpcFields::default(), )?
                }
            }
        }

        impl $crate::header::CommandHeader for $name {
            #[allow(unused_variables)]
            fn write_ext_fields(&self, ext: &mut $crate::command::ExtFields) {
                $( $crate::header::HeaderField::write(&self.$field, ext, $key); )*
                $( $crate::header::CommandHeader::write_ext_fields(&self.$rpc, ext); )?
            }

            // One pass over the map: each entry is matched against the known keys.
            #[allow(unused_variables, unused_mut, clippy::match_single_binding)]
            fn from_ext_fields(ext: &$crate::command::ExtFields) -> $crate::Result<Self> {
                $( let mut $field: Option<&str> = None; )*
                $( let mut $rpc = $crate::header::RpcFields::default(); )?
                for (key, value) in ext {
                    match key {
                        $( $key => $field = Some(value), )*
                        _ => { $( $rpc.absorb(key, value); )? }
                    }
                }
                Ok(Self {
                    $( $field: command_header!(@read $field, $ty, $key $(, $def)?), )*
                    $( $rpc, )?
                })
            }
        }

        #[cfg(test)]
        impl $crate::header::test_support::RandomValue for $name {
            #[allow(unused_variables)]
            fn random(rng: &mut proptest::test_runner::TestRng) -> Self {
                Self {
                    $( $field: $crate::header::test_support::RandomValue::random(rng), )*
                    $( $rpc: $crate::header::test_support::RandomValue::random(rng), )?
                }
            }
        }
    };
    (@default) => { Default::default() };
    (@default $def:expr) => { $def };
    (@read $value:ident, $ty:ty, $key:literal) => {
        <$ty as $crate::header::HeaderField>::read_value($value, $key)?
    };
    (@read $value:ident, $ty:ty, $key:literal, $def:expr) => {
        $crate::header::read_value_or::<$ty>($value, $key, $def)?
    };
}
pub(crate) use command_header;

impl RemotingCommand {
    /// Decodes the typed header `H` from this command's `extFields` (an absent map counts as
    /// empty).
    pub fn decode_command_header<H: CommandHeader>(&self) -> Result<H> {
        match &self.ext_fields {
            Some(ext) => H::from_ext_fields(ext),
            None => H::from_ext_fields(&ExtFields::new()),
        }
    }

    /// A new request (see [`RemotingCommand::request`]) carrying `header` as its `extFields`.
    pub fn request_with_header<H: CommandHeader>(code: i32, header: &H) -> Self {
        Self::request(code).with_header(header)
    }

    /// Replaces this command's `extFields` with `header`'s entries.
    pub fn with_header<H: CommandHeader>(mut self, header: &H) -> Self {
        self.ext_fields = Some(header.to_ext_fields());
        self
    }

    /// Adds `header`'s entries to this command's `extFields` (creating the map if absent),
    /// keeping entries already there unless the header overwrites them.
    pub fn add_header<H: CommandHeader>(&mut self, header: &H) {
        header.write_ext_fields(self.ext_fields.get_or_insert_with(ExtFields::new));
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Random values for property tests of every header type.
    use super::{BoundaryType, RpcFields};
    use proptest::prelude::Rng;
    use proptest::test_runner::TestRng;

    fn below(rng: &mut TestRng, n: usize) -> usize {
        rng.next_u32() as usize % n
    }

    fn coin(rng: &mut TestRng) -> bool {
        rng.next_u32() & 1 == 1
    }

    /// A value drawn at random over the type's whole range.
    pub(crate) trait RandomValue {
        fn random(rng: &mut TestRng) -> Self;
    }

    impl RandomValue for String {
        fn random(rng: &mut TestRng) -> Self {
            const POOL: &[char] = &[
                'a', 'Z', '0', '9', ' ', '%', '@', '#', ':', ',', '{', '}', '"', '\\', '\u{1}',
                '\u{2}', '\n', 'é', '标', '😀',
            ];
            let len = below(rng, 12);
            (0..len).map(|_| POOL[below(rng, POOL.len())]).collect()
        }
    }

    impl RandomValue for i32 {
        fn random(rng: &mut TestRng) -> Self {
            rng.next_u32() as i32
        }
    }

    impl RandomValue for i64 {
        fn random(rng: &mut TestRng) -> Self {
            rng.next_u64() as i64
        }
    }

    impl RandomValue for bool {
        fn random(rng: &mut TestRng) -> Self {
            coin(rng)
        }
    }

    impl RandomValue for BoundaryType {
        fn random(rng: &mut TestRng) -> Self {
            if coin(rng) {
                BoundaryType::Lower
            } else {
                BoundaryType::Upper
            }
        }
    }

    impl<T: RandomValue> RandomValue for Option<T> {
        fn random(rng: &mut TestRng) -> Self {
            if coin(rng) {
                Some(T::random(rng))
            } else {
                None
            }
        }
    }

    impl RandomValue for RpcFields {
        fn random(rng: &mut TestRng) -> Self {
            Self {
                namespace: RandomValue::random(rng),
                namespaced: RandomValue::random(rng),
                broker_name: RandomValue::random(rng),
                oneway: RandomValue::random(rng),
                logical: RandomValue::random(rng),
            }
        }
    }
}

#[cfg(test)]
mod tests;
