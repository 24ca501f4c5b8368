//! What the store demands of a record and reads from it: topic names (they become directory
//! names), the torn-properties rule, the keys a record is indexed under; and the store's clock.

use std::time::{SystemTime, UNIX_EPOCH};

use shoal_proto::message::property::{find_properties, KEYS, UNIQ_KEY};

use crate::error::Result;
use crate::StoreError;

/// Now, in ms since the epoch: the store timestamp of an append.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Topic names become directory names: RocketMQ's character set (`[%|a-zA-Z0-9_-]`), at most
/// 255 bytes.
pub(crate) fn validate_topic(topic: &str) -> Result<()> {
    if topic.is_empty() || topic.len() > 255 {
        return Err(StoreError::InvalidArgument(format!(
            "topic length {} is outside 1..=255",
            topic.len()
        )));
    }
    if !topic
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'%' | b'|' | b'_' | b'-'))
    {
        return Err(StoreError::InvalidArgument(format!(
            "topic {topic:?} contains characters outside [%|a-zA-Z0-9_-]"
        )));
    }
    Ok(())
}

/// A stored record whose properties end with this is taken for a torn write (see
/// [`crate::scan::scan_commit_log`]); puts refuse such properties.
pub(crate) const TORN_PROPERTIES_END: char = '\0';

/// The keys a record is indexed under: each of its `KEYS` (space separated), then its
/// `UNIQ_KEY` unless it is one of them. Borrowed from `properties`, no copy.
pub(crate) fn index_keys(properties: &str) -> impl Iterator<Item = &str> {
    let [keys, uniq] = find_properties(properties, [KEYS, UNIQ_KEY]);
    index_keys_of(keys, uniq)
}

/// [`index_keys`] given the values of KEYS and UNIQ_KEY (for a caller that found them in a
/// pass over the properties of its own).
pub(crate) fn index_keys_of<'a>(
    keys: Option<&'a str>,
    uniq: Option<&'a str>,
) -> impl Iterator<Item = &'a str> {
    let keys = keys.unwrap_or("");
    let uniq = uniq.filter(|u| !u.is_empty() && !keys.split(' ').any(|k| k == *u));
    keys.split(' ').filter(|k| !k.is_empty()).chain(uniq)
}

/// [`index_keys_of`] as calls of `f`, without iterator adapters (the appender's dispatch
/// runs it for every record under the index's lock).
#[inline]
pub(crate) fn for_each_index_key<'a>(
    keys: Option<&'a str>,
    uniq: Option<&'a str>,
    mut f: impl FnMut(&'a str),
) {
    let uniq = uniq.filter(|u| !u.is_empty());
    let mut uniq_among_keys = false;
    if let Some(keys) = keys.filter(|k| !k.is_empty()) {
        for k in keys.split(' ') {
            if !k.is_empty() {
                uniq_among_keys |= uniq == Some(k);
                f(k);
            }
        }
    }
    if let Some(u) = uniq.filter(|_| !uniq_among_keys) {
        f(u);
    }
}
