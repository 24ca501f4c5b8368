//! [`ExtFields`]: a command's custom header, string keys to string values in insertion order,
//! kept in one text buffer.
//!
//! Every key and value lives in one `String` (`text`), entries are spans into it, so decoding
//! a header of a dozen fields costs two allocations instead of two per field, and a lookup
//! compares a few short slices instead of hashing with SipHash. A map decoded from a frame
//! also refers to the frame's header text (`shared`, a [`ByteString`] sharing the frame's
//! bytes): keys and values written there without escapes are spans into it and are never
//! copied. Headers are small (a send has
//! 13 fields); a map that grows past [`INDEX_FROM`] entries gets a hash index (foldhash, seeded
//! per process) so that a hostile header with many keys stays linear to decode.

use bytestring::ByteString;
use hashbrown::HashTable;
use std::fmt;
use std::hash::BuildHasher;
use std::ops::Range;

/// Entries from which lookups go through a hash index instead of a scan.
pub const INDEX_FROM: usize = 16;

/// The top bit of a span's start: the span is in `shared`, not in `text`.
const SHARED: usize = 1 << (usize::BITS - 1);

/// Where a key or a value is: `(start, len)` in `text`, or in `shared` when `start` has the
/// [`SHARED`] bit.
pub(crate) type Span = (usize, usize);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    key: Span,
    value: Span,
}

#[derive(Clone)]
struct Index {
    table: HashTable<usize>,
    state: foldhash::fast::RandomState,
}

impl Index {
    fn hash(&self, key: &str) -> u64 {
        index_hash(&self.state, key)
    }
}

/// The "custom header" of a command: string keys to string values, in insertion order
/// (order matters only for byte-exact output; receivers look fields up by name). Inserting a
/// key that is present replaces its value in place, as a map does.
#[derive(Clone, Default)]
pub struct ExtFields {
    text: String,
    /// Text shared with the frame the map was decoded from (empty for other maps).
    shared: ByteString,
    entries: Vec<Entry>,
    index: Option<Box<Index>>,
    /// Bytes of `text` no entry refers to any more (replaced values, removed entries; bytes
    /// of `shared` are not counted: they are the frame's).
    unused: usize,
    /// One bit per key ever inserted since the last `clear` ([`key_bit`]): a key whose bit is
    /// clear is absent, so most misses (and the duplicate check of every insert) skip the
    /// scan. Removed keys leave their bit set, which only costs a scan.
    filter: u64,
}

impl ExtFields {
    /// An empty map (no allocation).
    pub const fn new() -> Self {
        Self {
            text: String::new(),
            shared: ByteString::new(),
            entries: Vec::new(),
            index: None,
            unused: 0,
            filter: 0,
        }
    }

    /// An empty map with room for `entries` entries of about 16 bytes of text each.
    pub fn with_capacity(entries: usize) -> Self {
        Self {
            text: String::with_capacity(entries * 16),
            shared: ByteString::new(),
            entries: Vec::with_capacity(entries),
            index: None,
            unused: 0,
            filter: 0,
        }
    }

    /// An empty map with room for `entries` entries of `text` bytes of keys and values in
    /// all (for a map whose size is known, one allocation each).
    pub fn with_text_capacity(entries: usize, text: usize) -> Self {
        Self {
            text: String::with_capacity(text),
            shared: ByteString::new(),
            entries: Vec::with_capacity(entries),
            index: None,
            unused: 0,
            filter: 0,
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there is no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// An empty map for a decoder that reads it from `shared` (see [`ExtFields::shared_span`]),
    /// with room for `entries` entries and no owned text yet.
    pub(crate) fn decoding(shared: ByteString, entries: usize) -> Self {
        Self {
            text: String::new(),
            shared,
            entries: Vec::with_capacity(entries),
            index: None,
            unused: 0,
            filter: 0,
        }
    }

    /// A map whose owned text is `text`, for a decoder that then records entries as spans of
    /// it ([`ExtFields::commit_spans`]), with room for `entries` entries.
    pub(crate) fn with_text(text: String, entries: usize) -> Self {
        Self {
            text,
            shared: ByteString::new(),
            entries: Vec::with_capacity(entries),
            index: None,
            unused: 0,
            filter: 0,
        }
    }

    /// The first byte of a non-empty span.
    #[inline]
    fn first_byte(&self, (start, _): Span) -> u8 {
        if start & SHARED == 0 {
            self.text.as_bytes()[start]
        } else {
            self.shared.as_bytes()[start & !SHARED]
        }
    }

    #[inline]
    fn slice(&self, span: Span) -> &str {
        span_str(&self.text, &self.shared, span)
    }

    fn position(&self, key: &str) -> Option<usize> {
        match &self.index {
            Some(index) => {
                let hash = index.hash(key);
                index
                    .table
                    .find(hash, |&i| self.slice(self.entries[i].key) == key)
                    .copied()
            }
            None => {
                if self.filter & key_bit(key) == 0 {
                    return None;
                }
                let kb = key.as_bytes();
                self.entries.iter().position(|e| {
                    e.key.1 == kb.len()
                        && (kb.is_empty() || self.first_byte(e.key) == kb[0])
                        && self.slice(e.key) == key
                })
            }
        }
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.position(key)
            .map(|i| self.slice(self.entries[i].value))
    }

    /// True when `key` is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.position(key).is_some()
    }

    /// Sets `key` to `value` (replacing the value in place when `key` is present).
    pub fn insert(&mut self, key: impl AsRef<str>, value: impl AsRef<str>) {
        let value = value.as_ref();
        self.insert_with(key.as_ref(), |out| out.push_str(value));
    }

    /// Sets `key` to the text `write` appends to the buffer it is given (replacing the value in
    /// place when `key` is present); formatted values need no `String` of their own.
    pub fn insert_with(&mut self, key: &str, write: impl FnOnce(&mut String)) {
        let key_start = self.text.len();
        self.text.push_str(key);
        let value_start = self.text.len();
        write(&mut self.text);
        self.commit(key_start, value_start);
    }

    /// Records the entry whose key is `text[key_start..value_start]` and whose value is
    /// `text[value_start..]`, both just appended.
    fn commit(&mut self, key_start: usize, value_start: usize) {
        let key = (key_start, value_start - key_start);
        let value = (value_start, self.text.len() - value_start);
        self.commit_spans(key, value);
    }

    /// Records the entry `key` -> `value` (spans of `text` or `shared`), replacing the value in
    /// place when the key is present.
    pub(crate) fn commit_spans(&mut self, key: Span, value: Span) {
        if self.record_spans(key, value) {
            self.compact_if_wasteful();
        }
    }

    /// As [`ExtFields::commit_spans`] but never compacts the text (spans of `text` computed
    /// before the call stay valid); true when a value was replaced. A decoder recording
    /// precomputed spans ends with [`ExtFields::finish_spans`].
    pub(crate) fn record_spans(&mut self, key: Span, value: Span) -> bool {
        let bit = key_bit(self.slice(key));
        // A key whose filter bit is clear is new: no scan (the common case of a decoded header).
        let found = if self.index.is_none() && self.filter & bit == 0 {
            None
        } else {
            self.position(self.slice(key))
        };
        match found {
            // The key keeps its place; the new value's text follows an unused copy of the key,
            // and the old value's bytes stay unused in `text` (bounded by what was inserted).
            Some(i) => {
                self.unused += owned_len(key) + owned_len(self.entries[i].value);
                self.entries[i].value = value;
                true
            }
            None => {
                let at = self.entries.len();
                self.filter |= bit;
                self.entries.push(Entry { key, value });
                self.note_in_index(at);
                false
            }
        }
    }

    /// As [`ExtFields::commit_spans`] for a decoder that has the key's bytes at hand (`key` is
    /// a span of them): a key new to a small map is pushed without slicing it again.
    #[inline]
    pub(crate) fn record_decoded(&mut self, key: Span, key_bytes: &[u8], value: Span) {
        if !self.push_if_new(key, key_bytes, value) {
            self.commit_spans(key, value);
        }
    }

    /// As [`ExtFields::record_spans`] for a decoder that has the key's bytes at hand (`key` is
    /// a span of them): a key new to a small map is pushed without slicing it again.
    #[inline]
    pub(crate) fn record_spans_of(&mut self, key: Span, key_bytes: &[u8], value: Span) {
        if !self.push_if_new(key, key_bytes, value) {
            self.record_spans(key, value);
        }
    }

    /// [`ExtFields::push_if_new`] for a decoder that records entries before its text is
    /// checked (and set with [`ExtFields::set_text`]); false when the entry needs the slow
    /// path (a key seen before, or a map past `INDEX_FROM` entries), nothing recorded then.
    #[inline]
    pub(crate) fn push_new(&mut self, key: Span, key_bytes: &[u8], value: Span) -> bool {
        self.push_if_new(key, key_bytes, value)
    }

    /// Sets the owned text the spans recorded by [`ExtFields::push_new`] point into.
    pub(crate) fn set_text(&mut self, text: String) {
        self.text = text;
    }

    /// Pushes the entry when its key's filter bit says it is new and the map is small (the
    /// pushed entry keeps it at most `INDEX_FROM` long: no index to build); false otherwise.
    #[inline]
    fn push_if_new(&mut self, key: Span, key_bytes: &[u8], value: Span) -> bool {
        let bit = key_bit_of(key_bytes);
        let new = self.filter & bit == 0 && self.index.is_none() && self.entries.len() < INDEX_FROM;
        if new {
            self.filter |= bit;
            self.entries.push(Entry { key, value });
        }
        new
    }

    /// Ends a run of [`ExtFields::record_spans`]: drops the text of replaced values if it is
    /// most of the text.
    pub(crate) fn finish_spans(&mut self) {
        self.compact_if_wasteful();
    }

    fn note_in_index(&mut self, at: usize) {
        if let Some(index) = &mut self.index {
            let Index { table, state } = &mut **index;
            let (text, shared, entries) = (&self.text, &self.shared, &self.entries);
            let hash = index_hash(state, span_str(text, shared, entries[at].key));
            table.insert_unique(hash, at, |&i| {
                index_hash(state, span_str(text, shared, entries[i].key))
            });
        } else if self.entries.len() > INDEX_FROM {
            self.rebuild_index();
        }
    }

    fn rebuild_index(&mut self) {
        if self.entries.len() <= INDEX_FROM {
            self.index = None;
            return;
        }
        let state = foldhash::fast::RandomState::default();
        let mut table = HashTable::with_capacity(self.entries.len());
        let (text, shared, entries) = (&self.text, &self.shared, &self.entries);
        for (i, e) in entries.iter().enumerate() {
            let hash = index_hash(&state, span_str(text, shared, e.key));
            table.insert_unique(hash, i, |&j| {
                index_hash(&state, span_str(text, shared, entries[j].key))
            });
        }
        self.index = Some(Box::new(Index { table, state }));
    }

    /// Removes `key`, keeping the order of the others; returns its value.
    pub fn remove(&mut self, key: &str) -> Option<String> {
        let i = self.position(key)?;
        let entry = self.entries.remove(i);
        let value = self.slice(entry.value).to_owned();
        self.unused += owned_len(entry.key) + owned_len(entry.value);
        if self.index.is_some() {
            self.rebuild_index();
        }
        self.compact_if_wasteful();
        Some(value)
    }

    /// Rewrites `text` without its unused bytes once they are most of it (a map updated
    /// over and over stays bounded by its live entries).
    fn compact_if_wasteful(&mut self) {
        if self.unused < 4096 || self.unused < self.text.len() / 2 {
            return;
        }
        let mut text = String::with_capacity(self.text.len() - self.unused);
        for e in &mut self.entries {
            for span in [&mut e.key, &mut e.value] {
                if span.0 & SHARED == 0 {
                    let start = text.len();
                    text.push_str(&self.text[span.0..span.0 + span.1]);
                    span.0 = start;
                }
            }
        }
        self.text = text;
        self.unused = 0;
    }

    /// As [`ExtFields::remove`] (the name `IndexMap` gives it).
    pub fn shift_remove(&mut self, key: &str) -> Option<String> {
        self.remove(key)
    }

    /// Keeps only the entries for which `keep(key, value)` is true, in order.
    pub fn retain(&mut self, mut keep: impl FnMut(&str, &str) -> bool) {
        let before = self.entries.len();
        let (text, shared) = (&self.text, &self.shared);
        let mut dropped = 0;
        self.entries.retain(|e| {
            let k = keep(
                span_str(text, shared, e.key),
                span_str(text, shared, e.value),
            );
            if !k {
                dropped += owned_len(e.key) + owned_len(e.value);
            }
            k
        });
        if self.entries.len() != before {
            self.unused += dropped;
            if self.index.is_some() {
                self.rebuild_index();
            }
            self.compact_if_wasteful();
        }
    }

    /// Sorts the entries by key (byte order).
    pub fn sort_keys(&mut self) {
        let (text, shared) = (&self.text, &self.shared);
        self.entries
            .sort_by(|a, b| span_str(text, shared, a.key).cmp(span_str(text, shared, b.key)));
        if self.index.is_some() {
            self.rebuild_index();
        }
    }

    /// Removes every entry, keeping the buffers for reuse.
    pub fn clear(&mut self) {
        self.text.clear();
        self.shared = ByteString::new();
        self.entries.clear();
        self.index = None;
        self.unused = 0;
        self.filter = 0;
    }

    /// The entries in insertion order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            map: self,
            range: 0..self.entries.len(),
        }
    }

    /// The values of the one-letter keys `first ..= first + N - 1` (a later entry of a key
    /// wins, as in [`ExtFields::iter_keyed`]; the map keeps one entry per key anyway), for
    /// headers written with one-letter keys (SEND_MESSAGE_V2). Keys of other lengths are
    /// skipped by their span's length, without slicing them.
    #[inline]
    pub(crate) fn letter_values<const N: usize>(&self, first: u8) -> [Option<&str>; N] {
        let mut found = [None; N];
        let (text, shared) = (&self.text, &self.shared);
        for e in &self.entries {
            if e.key.1 != 1 {
                continue;
            }
            let key = span_bytes(text.as_bytes(), shared.as_bytes(), e.key)[0];
            if let Some(slot) = found.get_mut(usize::from(key.wrapping_sub(first))) {
                *slot = Some(span_str(text, shared, e.value));
            }
        }
        found
    }

    /// The entries in insertion order, keys as bytes and values as text: for typed readers
    /// that match keys as bytes and keep the values of the keys they know.
    #[inline]
    pub(crate) fn iter_keyed(&self) -> impl ExactSizeIterator<Item = (&[u8], &str)> + '_ {
        let (text, shared) = (&self.text, &self.shared);
        self.entries.iter().map(move |e| {
            (
                span_bytes(text.as_bytes(), shared.as_bytes(), e.key),
                span_str(text, shared, e.value),
            )
        })
    }

    /// The entries in insertion order as bytes, for encoders: no character-boundary checks
    /// per slice (every span was cut at boundaries of valid UTF-8 when it was recorded).
    pub(crate) fn iter_bytes(&self) -> impl ExactSizeIterator<Item = (&[u8], &[u8])> + '_ {
        let (text, shared) = (self.text.as_bytes(), self.shared.as_bytes());
        self.entries.iter().map(move |e| {
            (
                span_bytes(text, shared, e.key),
                span_bytes(text, shared, e.value),
            )
        })
    }

    /// The keys in insertion order.
    pub fn keys(&self) -> impl Iterator<Item = &str> + '_ {
        self.iter().map(|(k, _)| k)
    }

    /// The values in insertion order.
    pub fn values(&self) -> impl Iterator<Item = &str> + '_ {
        self.iter().map(|(_, v)| v)
    }

    /// Bytes of key and value text held (including values replaced since, and the whole
    /// header text a decoded map shares with its frame): at least the text of every entry.
    pub fn text_len(&self) -> usize {
        self.text.len() + self.shared.len()
    }

    /// The text buffer, for a decoder that appends a key and then its value straight into it.
    /// Finish with [`ExtFields::commit_raw`] or undo with [`ExtFields::truncate_raw`].
    pub(crate) fn raw_text(&mut self) -> &mut String {
        &mut self.text
    }

    /// See [`ExtFields::raw_text`]: records the key `text[key_start..value_start]` with the
    /// value `text[value_start..]`.
    pub(crate) fn commit_raw(&mut self, key_start: usize, value_start: usize) {
        self.commit(key_start, value_start);
    }

    /// See [`ExtFields::raw_text`]: drops text appended from `at` on.
    pub(crate) fn truncate_raw(&mut self, at: usize) {
        self.text.truncate(at);
    }

    /// The span of `shared[range]` (for [`ExtFields::commit_spans`]).
    #[inline]
    pub(crate) fn shared_span(range: Range<usize>) -> Span {
        (range.start | SHARED, range.end - range.start)
    }

    /// The span of the owned text appended from `start` on (for [`ExtFields::commit_spans`]).
    #[inline]
    pub(crate) fn owned_span(&self, start: usize) -> Span {
        (start, self.text.len() - start)
    }
}

/// The text of `span`, in `text` or `shared`.
#[inline]
fn span_str<'t>(text: &'t str, shared: &'t str, (start, len): Span) -> &'t str {
    if start & SHARED == 0 {
        &text[start..start + len]
    } else {
        let start = start & !SHARED;
        &shared[start..start + len]
    }
}

/// The bytes of `span`, in `text` or `shared`.
#[inline]
fn span_bytes<'t>(text: &'t [u8], shared: &'t [u8], (start, len): Span) -> &'t [u8] {
    if start & SHARED == 0 {
        &text[start..start + len]
    } else {
        let start = start & !SHARED;
        &shared[start..start + len]
    }
}

/// Bytes of `text` (not of `shared`) a span holds.
#[inline]
fn owned_len((start, len): Span) -> usize {
    if start & SHARED == 0 {
        len
    } else {
        0
    }
}

/// The bit of `key` in `ExtFields::filter`, from its length and first and last bytes. The
/// odd weight of a one-byte key's byte (3) makes consecutive letters take distinct bits, so
/// the send header's keys `a`..`n` never share one.
fn key_bit(key: &str) -> u64 {
    key_bit_of(key.as_bytes())
}

/// [`key_bit`] of a key's bytes.
#[inline]
fn key_bit_of(b: &[u8]) -> u64 {
    let (first, last) = (
        usize::from(b.first().copied().unwrap_or(0)),
        usize::from(b.last().copied().unwrap_or(0)),
    );
    1 << ((first + 2 * last + 11 * b.len()) & 63)
}

fn index_hash(state: &foldhash::fast::RandomState, key: &str) -> u64 {
    state.hash_one(key)
}

/// Iterator over an [`ExtFields`]' entries.
#[derive(Debug)]
pub struct Iter<'a> {
    map: &'a ExtFields,
    range: Range<usize>,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        let e = self.map.entries[self.range.next()?];
        Some((self.map.slice(e.key), self.map.slice(e.value)))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.range.size_hint()
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        let e = self.map.entries[self.range.next_back()?];
        Some((self.map.slice(e.key), self.map.slice(e.value)))
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a ExtFields {
    type Item = (&'a str, &'a str);
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl IntoIterator for ExtFields {
    type Item = (String, String);
    type IntoIter = std::vec::IntoIter<(String, String)>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect::<Vec<_>>()
            .into_iter()
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for ExtFields {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut out = ExtFields::new();
        out.extend(iter);
        out
    }
}

impl<K: AsRef<str>, V: AsRef<str>> Extend<(K, V)> for ExtFields {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, iter: I) {
        for (k, v) in iter {
            self.insert(k, v);
        }
    }
}

/// `map["key"]`: the value of a key that must be present.
///
/// # Panics
/// When `key` is absent (as `IndexMap`'s indexing does); use [`ExtFields::get`] for input.
impl std::ops::Index<&str> for ExtFields {
    type Output = str;

    fn index(&self, key: &str) -> &str {
        match self.get(key) {
            Some(v) => v,
            None => panic!("extFields key {key:?} is absent"),
        }
    }
}

/// Map equality: the same keys with the same values, in any order (as `IndexMap`'s).
impl PartialEq for ExtFields {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().all(|(k, v)| other.get(k) == Some(v))
    }
}

impl Eq for ExtFields {}

impl fmt::Debug for ExtFields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn insert_replaces_in_place_and_keeps_order() {
        let mut m = ExtFields::new();
        m.insert("a", "1");
        m.insert(String::from("b"), "2");
        m.insert("a", "three");
        assert_eq!(m.len(), 2);
        assert_eq!(m.get("a"), Some("three"));
        assert_eq!(m.keys().collect::<Vec<_>>(), ["a", "b"]);
        m.insert_with("c", |out| out.push_str("42"));
        assert_eq!(m.get("c"), Some("42"));
        assert_eq!(m.remove("a").as_deref(), Some("three"));
        assert_eq!(m.iter().collect::<Vec<_>>(), [("b", "2"), ("c", "42")]);
        assert_eq!(m.get("a"), None);
        assert!(!m.contains_key("a"));
        m.clear();
        assert!(m.is_empty());
    }

    #[test]
    fn updates_over_and_over_stay_bounded() {
        let mut m = ExtFields::new();
        m.insert("keep", "v");
        for i in 0..100_000 {
            m.insert("counter", i.to_string());
        }
        assert_eq!(m.get("counter"), Some("99999"));
        assert_eq!(m.get("keep"), Some("v"));
        assert!(m.text_len() < 16 * 1024, "{}", m.text_len());
        for i in 0..100_000 {
            m.insert(format!("k{}", i % 3), "x");
            m.remove(&format!("k{}", (i + 1) % 3));
        }
        assert!(m.text_len() < 16 * 1024, "{}", m.text_len());
    }

    #[test]
    fn the_send_headers_keys_have_distinct_filter_bits() {
        // Not needed for correctness (a shared bit costs a scan), but the send header's
        // one-letter keys are decoded on every send: none of them should collide.
        let bits: std::collections::BTreeSet<u64> = ('a'..='n')
            .map(|c| key_bit(c.encode_utf8(&mut [0; 4])))
            .collect();
        assert_eq!(bits.len(), 14);
    }

    #[test]
    fn equality_ignores_order() {
        let a: ExtFields = [("x", "1"), ("y", "2")].into_iter().collect();
        let b: ExtFields = [("y", "2"), ("x", "1")].into_iter().collect();
        let c: ExtFields = [("y", "2"), ("x", "9")].into_iter().collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(format!("{a:?}"), r#"{"x": "1", "y": "2"}"#);
    }

    proptest! {
        /// Lookups (hits and misses, through the key filter) agree with a model map under
        /// inserts, removals, `retain` and `clear`, for short keys of any shape.
        #[test]
        fn lookups_agree_with_a_model_through_the_filter(
            ops in proptest::collection::vec((0u8..10, "[a-e]{0,3}", "[x-z]{0,2}"), 0..150),
        ) {
            let mut ours = ExtFields::new();
            let mut model: indexmap::IndexMap<String, String> = indexmap::IndexMap::new();
            let mut seen = std::collections::BTreeSet::new();
            for (op, key, v) in ops {
                seen.insert(key.clone());
                match op {
                    0 => {
                        prop_assert_eq!(ours.remove(&key), model.shift_remove(&key));
                    }
                    1 => {
                        ours.retain(|k, _| !k.starts_with('a'));
                        model.retain(|k, _| !k.starts_with('a'));
                    }
                    2 if v.is_empty() => {
                        ours.clear();
                        model.clear();
                    }
                    _ => {
                        ours.insert(&key, &v);
                        model.insert(key, v);
                    }
                }
                for k in &seen {
                    prop_assert_eq!(ours.get(k), model.get(k).map(String::as_str));
                    prop_assert_eq!(ours.contains_key(k), model.contains_key(k));
                }
            }
        }
    }
}
