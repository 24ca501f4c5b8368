//! Where a selector reads message properties from.

use std::collections::{BTreeMap, HashMap};

/// A message's properties by name.
pub trait Properties {
    /// The value of property `name`, if the message has it.
    fn property(&self, name: &str) -> Option<&str>;
}

impl<S: std::hash::BuildHasher> Properties for HashMap<String, String, S> {
    fn property(&self, name: &str) -> Option<&str> {
        self.get(name).map(String::as_str)
    }
}

impl Properties for BTreeMap<String, String> {
    fn property(&self, name: &str) -> Option<&str> {
        self.get(name).map(String::as_str)
    }
}

impl Properties for [(&str, &str)] {
    fn property(&self, name: &str) -> Option<&str> {
        self.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
    }
}

/// Properties in RocketMQ's stored form, `name\u{1}value\u{2}` repeated, read in place (no
/// map per message). A name that appears twice reads as its first value.
#[derive(Debug, Clone, Copy)]
pub struct RawProperties<'a>(pub &'a str);

impl Properties for RawProperties<'_> {
    fn property(&self, name: &str) -> Option<&str> {
        self.0.split('\u{2}').find_map(|pair| {
            let (k, v) = pair.split_once('\u{1}')?;
            (k == name).then_some(v)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_properties_read_in_place() {
        let p = RawProperties("a\u{1}1\u{2}TAGS\u{1}x\u{2}empty\u{1}\u{2}");
        assert_eq!(p.property("a"), Some("1"));
        assert_eq!(p.property("TAGS"), Some("x"));
        assert_eq!(p.property("empty"), Some(""));
        assert_eq!(p.property("b"), None);
        assert_eq!(RawProperties("").property("a"), None);
    }
}
