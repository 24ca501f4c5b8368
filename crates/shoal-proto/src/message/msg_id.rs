//! Offset message id (spec §4.5): store host + commit-log offset as uppercase hex.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::{ProtoError, Result};

/// Length of an offset message id whose store host is IPv4 (16 bytes as hex).
pub const OFFSET_MSG_ID_V4_LEN: usize = 32;
/// Length of an offset message id whose store host is IPv6 (28 bytes as hex).
pub const OFFSET_MSG_ID_V6_LEN: usize = 56;

/// Uppercase hex digits.
const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Appends `bytes` as uppercase hex to `out`, in one copy per 32 bytes.
pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    let mut buf = [0u8; 64];
    for chunk in bytes.chunks(32) {
        out.push_str(ascii(hex_into(chunk, &mut buf)));
    }
}

/// Writes `bytes` as uppercase hex at the start of `buf` (at least twice as long) and returns
/// what it wrote.
fn hex_into<'b>(bytes: &[u8], buf: &'b mut [u8]) -> &'b [u8] {
    let hex = &mut buf[..2 * bytes.len()];
    for (pair, b) in hex.chunks_exact_mut(2).zip(bytes) {
        pair[0] = HEX[usize::from(b >> 4)];
        pair[1] = HEX[usize::from(b & 0xf)];
    }
    hex
}

/// Text known to be ASCII (hex digits) as a `str`.
#[allow(clippy::expect_used, reason = "hex digits are ASCII by construction")]
fn ascii(b: &[u8]) -> &str {
    std::str::from_utf8(b).expect("hex digits are ASCII")
}

/// Decodes hex (either case) into bytes; errors name `what`.
pub(crate) fn parse_hex(s: &str, what: &str) -> Result<Vec<u8>> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let bytes = s.as_bytes();
    if bytes.len() % 2 != 0 {
        return Err(ProtoError::Invalid(format!(
            "{what} {s:?} has an odd number of hex digits"
        )));
    }
    bytes
        .chunks_exact(2)
        .map(|pair| match pair {
            [hi, lo] => match (nibble(*hi), nibble(*lo)) {
                (Some(h), Some(l)) => Ok(h << 4 | l),
                _ => Err(ProtoError::Invalid(format!(
                    "{what} {s:?} contains a non-hex character"
                ))),
            },
            _ => Err(ProtoError::Invalid(format!("{what} {s:?} is malformed"))),
        })
        .collect()
}

/// Builds the offset message id of the record stored at `commit_log_offset` by `store_host`:
/// 32 hex chars for an IPv4 host, 56 for IPv6.
pub fn offset_msg_id(store_host: SocketAddr, commit_log_offset: i64) -> String {
    let mut out = String::with_capacity(OFFSET_MSG_ID_V6_LEN);
    push_offset_msg_id(&mut out, store_host, commit_log_offset);
    out
}

/// Appends the offset message id of the record stored at `commit_log_offset` by
/// `store_host` to `out` ([`offset_msg_id`] without a `String` of its own).
pub fn push_offset_msg_id(out: &mut String, store_host: SocketAddr, commit_log_offset: i64) {
    let mut buf = [0u8; OFFSET_MSG_ID_V6_LEN];
    out.push_str(ascii(offset_msg_id_into(
        &mut buf,
        store_host,
        commit_log_offset,
    )));
}

/// [`push_offset_msg_id`] into bytes (a binary header's value).
pub fn push_offset_msg_id_bytes(out: &mut Vec<u8>, store_host: SocketAddr, commit_log_offset: i64) {
    let mut buf = [0u8; OFFSET_MSG_ID_V6_LEN];
    out.extend_from_slice(offset_msg_id_into(&mut buf, store_host, commit_log_offset));
}

/// Writes the offset message id at the start of `buf` and returns it: host, port as four
/// bytes, offset as eight, all as hex.
fn offset_msg_id_into(
    buf: &mut [u8; OFFSET_MSG_ID_V6_LEN],
    store_host: SocketAddr,
    commit_log_offset: i64,
) -> &[u8] {
    let ip_len = match store_host.ip() {
        IpAddr::V4(ip) => hex_into(&ip.octets(), buf).len(),
        IpAddr::V6(ip) => hex_into(&ip.octets(), buf).len(),
    };
    hex_into(
        &i32::from(store_host.port()).to_be_bytes(),
        &mut buf[ip_len..],
    );
    hex_into(&commit_log_offset.to_be_bytes(), &mut buf[ip_len + 8..]);
    &buf[..ip_len + 24]
}

/// A parsed offset message id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OffsetMsgId {
    /// The broker's store host (address and port).
    pub store_host: SocketAddr,
    /// The record's commit-log (physical) offset.
    pub commit_log_offset: i64,
}

impl OffsetMsgId {
    /// Parses an offset message id: 32 hex chars (IPv4) or 56 (IPv6), either case.
    pub fn parse(s: &str) -> Result<Self> {
        let ip_len = match s.len() {
            OFFSET_MSG_ID_V4_LEN => 4,
            OFFSET_MSG_ID_V6_LEN => 16,
            n => {
                return Err(ProtoError::Invalid(format!(
                    "offset message id {s:?} has {n} characters, expected 32 or 56"
                )))
            }
        };
        let bytes = parse_hex(s, "offset message id")?;
        let (ip, rest) = bytes.split_at(ip_len);
        let ip = match ip_len {
            4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(ip).map_err(bad_len)?)),
            _ => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(ip).map_err(bad_len)?)),
        };
        let (port, offset) = rest.split_at(4);
        let port = i32::from_be_bytes(port.try_into().map_err(bad_len)?);
        let port = u16::try_from(port).map_err(|_| {
            ProtoError::Invalid(format!(
                "offset message id {s:?} has port {port} out of range"
            ))
        })?;
        let commit_log_offset = i64::from_be_bytes(offset.try_into().map_err(bad_len)?);
        Ok(OffsetMsgId {
            store_host: SocketAddr::new(ip, port),
            commit_log_offset,
        })
    }

    /// Formats this id (same as [`offset_msg_id`]).
    pub fn to_id_string(&self) -> String {
        offset_msg_id(self.store_host, self.commit_log_offset)
    }
}

impl std::fmt::Display for OffsetMsgId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_id_string())
    }
}

impl std::str::FromStr for OffsetMsgId {
    type Err = ProtoError;

    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

fn bad_len(_: std::array::TryFromSliceError) -> ProtoError {
    ProtoError::Invalid("offset message id has a bad length".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_example() {
        let host: SocketAddr = "192.168.0.1:10911".parse().unwrap();
        let id = offset_msg_id(host, 4096);
        assert_eq!(id, "C0A8000100002A9F0000000000001000");
        let parsed = OffsetMsgId::parse(&id).unwrap();
        assert_eq!(parsed.store_host, host);
        assert_eq!(parsed.commit_log_offset, 4096);
        assert_eq!(
            OffsetMsgId::parse(&id.to_lowercase()).unwrap().to_string(),
            id
        );
    }

    #[test]
    fn ipv6_round_trip() {
        let host: SocketAddr = "[fe80::1:2]:10911".parse().unwrap();
        let id = offset_msg_id(host, i64::MAX);
        assert_eq!(id.len(), 56);
        let parsed: OffsetMsgId = id.parse().unwrap();
        assert_eq!(
            parsed,
            OffsetMsgId {
                store_host: host,
                commit_log_offset: i64::MAX
            }
        );
    }

    #[test]
    fn bad_input_is_an_error() {
        for s in [
            "",
            "C0A8",
            "C0A8000100002A9F000000000000100",
            "C0A8000100002A9F000000000000100G",
            "C0A80001FFFFFFFF0000000000001000",
            "C0A8000100002A9F0000000000001000é",
            "ééééééééééééééééé0000000000001",
        ] {
            assert!(OffsetMsgId::parse(s).is_err(), "{s:?}");
        }
    }

    proptest::proptest! {
        /// Every host and offset round-trips, as text and as bytes, in either IP version,
        /// appended after what the buffer already holds; the hex is byte for byte what
        /// formatting each part with `{:02X}` gives.
        #[test]
        fn ids_round_trip(
            v4 in proptest::prelude::any::<[u8; 4]>(),
            v6 in proptest::prelude::any::<[u8; 16]>(),
            port in proptest::prelude::any::<u16>(),
            offset in proptest::prelude::any::<i64>(),
        ) {
            for ip in [IpAddr::from(v4), IpAddr::from(v6)] {
                let host = SocketAddr::new(ip, port);
                let mut text = String::from("x,");
                push_offset_msg_id(&mut text, host, offset);
                let mut bytes = b"x,".to_vec();
                push_offset_msg_id_bytes(&mut bytes, host, offset);
                proptest::prop_assert_eq!(text.as_bytes(), &bytes[..]);
                let octets: Vec<u8> = match ip {
                    IpAddr::V4(a) => a.octets().to_vec(),
                    IpAddr::V6(a) => a.octets().to_vec(),
                };
                let mut want = String::from("x,");
                for b in octets
                    .iter()
                    .chain(&i32::from(port).to_be_bytes())
                    .chain(&offset.to_be_bytes())
                {
                    want.push_str(&format!("{b:02X}"));
                }
                proptest::prop_assert_eq!(&text, &want);
                let parsed = OffsetMsgId::parse(&text[2..]).unwrap();
                proptest::prop_assert_eq!(parsed.store_host, host);
                proptest::prop_assert_eq!(parsed.commit_log_offset, offset);
            }
        }

        /// `push_hex` writes what `{:02X}` per byte does, for lengths across its 32-byte steps.
        #[test]
        fn hex_as_formatted(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..100)) {
            let mut out = String::from("-");
            push_hex(&mut out, &bytes);
            let want: String = std::iter::once("-".to_owned())
                .chain(bytes.iter().map(|b| format!("{b:02X}")))
                .collect();
            proptest::prop_assert_eq!(out, want);
        }
    }
}
