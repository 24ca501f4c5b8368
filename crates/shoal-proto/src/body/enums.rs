//! Enums of the JSON bodies: written by name, read by name or ordinal (fastjson accepts both;
//! the C++ client writes ordinals, spec section 10 — its orders match Java's for these enums).
//! Names are read regardless of ASCII case, as fastjson's enum reader does (the Go client writes
//! `messageModel` as `Clustering` / `BroadCasting`).

use crate::LanguageCode;
use serde::de::{Error, Unexpected, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// Generates a Java-style enum: `name()`, `from_name()`, `from_ordinal()`, `ordinal()`, serde
/// by name (written) and name-or-ordinal (read), `Display`.
macro_rules! java_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $java:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub enum $name {
            $( $(#[$vmeta])* #[doc = concat!("\n\nJava name `", $java, "`.")] $variant, )*
        }

        impl $name {
            /// All variants in Java declaration (ordinal) order.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            /// The Java enum name.
            pub fn name(self) -> &'static str {
                match self { $( $name::$variant => $java, )* }
            }

            /// Looks a Java enum name up (exact spelling).
            pub fn from_name(name: &str) -> Option<Self> {
                match name { $( $java => Some($name::$variant), )* _ => None }
            }

            /// Looks a Java enum name up in any ASCII case (as fastjson reads enum names).
            pub fn from_name_any_case(name: &str) -> Option<Self> {
                Self::from_name(name).or_else(|| {
                    Self::ALL.iter().copied().find(|v| v.name().eq_ignore_ascii_case(name))
                })
            }

            /// The Java ordinal.
            pub fn ordinal(self) -> usize {
                Self::ALL.iter().position(|v| *v == self).unwrap_or(0)
            }

            /// Looks a Java ordinal up.
            pub fn from_ordinal(ordinal: u64) -> Option<Self> {
                usize::try_from(ordinal).ok().and_then(|i| Self::ALL.get(i)).copied()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_any(NameOrOrdinal::<$name>(
                    stringify!($name),
                    $name::from_name_any_case,
                    $name::from_ordinal,
                ))
            }
        }
    };
}

/// Visitor for an enum given by name (string) or ordinal (number or digit string).
struct NameOrOrdinal<T>(&'static str, fn(&str) -> Option<T>, fn(u64) -> Option<T>);

impl<T> Visitor<'_> for NameOrOrdinal<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a {} name or ordinal", self.0)
    }

    fn visit_str<E: Error>(self, v: &str) -> Result<T, E> {
        if let Some(x) = (self.1)(v) {
            return Ok(x);
        }
        match v.parse::<u64>() {
            Ok(n) => (self.2)(n).ok_or_else(|| E::invalid_value(Unexpected::Str(v), &self)),
            Err(_) => Err(E::invalid_value(Unexpected::Str(v), &self)),
        }
    }

    fn visit_u64<E: Error>(self, v: u64) -> Result<T, E> {
        (self.2)(v).ok_or_else(|| E::invalid_value(Unexpected::Unsigned(v), &self))
    }

    fn visit_i64<E: Error>(self, v: i64) -> Result<T, E> {
        u64::try_from(v)
            .ok()
            .and_then(self.2)
            .ok_or_else(|| E::invalid_value(Unexpected::Signed(v), &self))
    }
}

java_enum! {
    /// How a consumer consumes (`ConsumeType`).
    pub enum ConsumeType {
        /// Pull / lite pull consumers.
        ConsumeActively = "CONSUME_ACTIVELY",
        /// Push consumers.
        #[default]
        ConsumePassively = "CONSUME_PASSIVELY",
        /// POP consumers (5.x).
        ConsumePop = "CONSUME_POP",
    }
}

java_enum! {
    /// Clustering or broadcasting (`MessageModel`).
    pub enum MessageModel {
        /// Every consumer gets every message.
        Broadcasting = "BROADCASTING",
        /// Queues are shared among the group.
        #[default]
        Clustering = "CLUSTERING",
    }
}

java_enum! {
    /// Where a new group starts (`ConsumeFromWhere`).
    pub enum ConsumeFromWhere {
        /// Latest offset (default).
        #[default]
        ConsumeFromLastOffset = "CONSUME_FROM_LAST_OFFSET",
        /// Deprecated; treated like LAST_OFFSET.
        ConsumeFromLastOffsetAndFromMinWhenBootFirst = "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
        /// Deprecated; treated like LAST_OFFSET.
        ConsumeFromMinOffset = "CONSUME_FROM_MIN_OFFSET",
        /// Deprecated; treated like LAST_OFFSET.
        ConsumeFromMaxOffset = "CONSUME_FROM_MAX_OFFSET",
        /// Earliest offset.
        ConsumeFromFirstOffset = "CONSUME_FROM_FIRST_OFFSET",
        /// Offset at a timestamp.
        ConsumeFromTimestamp = "CONSUME_FROM_TIMESTAMP",
    }
}

java_enum! {
    /// Subscription expression type (Java string constants `ExpressionType.TAG` / `SQL92`).
    pub enum ExpressionType {
        /// Tag expression `"tagA || tagB"` (default).
        #[default]
        Tag = "TAG",
        /// SQL92 over message properties.
        Sql92 = "SQL92",
    }
}

java_enum! {
    /// Topic filter type (`TopicFilterType`).
    pub enum TopicFilterType {
        /// One tag per message (default).
        #[default]
        SingleTag = "SINGLE_TAG",
        /// Several tags per message.
        MultiTag = "MULTI_TAG",
    }
}

java_enum! {
    /// How a queue is consumed under broker-side assignment (`MessageRequestMode`).
    pub enum MessageRequestMode {
        /// Classic pull.
        #[default]
        Pull = "PULL",
        /// POP.
        Pop = "POP",
    }
}

java_enum! {
    /// Result of CONSUME_MESSAGE_DIRECTLY (`CMResult`).
    pub enum ConsumeResult {
        /// Consumed.
        #[default]
        Success = "CR_SUCCESS",
        /// Retry later.
        Later = "CR_LATER",
        /// Rolled back (orderly).
        Rollback = "CR_ROLLBACK",
        /// Committed (orderly).
        Commit = "CR_COMMIT",
        /// The listener threw.
        ThrowException = "CR_THROW_EXCEPTION",
        /// The listener returned null.
        ReturnNull = "CR_RETURN_NULL",
    }
}

/// Serde adapter for [`LanguageCode`] in bodies (Connection): written by name, read by name or
/// code. Use with `#[serde(with = "language_code")]`.
pub mod language_code {
    use super::*;

    /// Writes the Java name.
    pub fn serialize<S: Serializer>(l: &LanguageCode, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(l.name())
    }

    /// Reads a name or a numeric code.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<LanguageCode, D::Error> {
        d.deserialize_any(NameOrOrdinal::<LanguageCode>(
            "LanguageCode",
            LanguageCode::from_name,
            |n| u8::try_from(n).ok().and_then(LanguageCode::from_code),
        ))
    }
}
