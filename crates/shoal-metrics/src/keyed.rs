//! [`Keyed`]: metric handles per key (topic, group), looked up by `&str` under a read lock
//! and created on first use. Callers on a hot path should keep the returned `Arc` (a
//! pre-resolved handle) rather than look it up per request.

use foldhash::{HashMap, HashMapExt};
use parking_lot::RwLock;
use std::sync::Arc;

/// A map from key to a shared `T` (a struct of counters, say), created with `T::default()`.
#[derive(Debug)]
pub struct Keyed<T> {
    map: RwLock<HashMap<String, Arc<T>>>,
}

impl<T> Default for Keyed<T> {
    fn default() -> Self {
        Self {
            map: RwLock::new(HashMap::new()),
        }
    }
}

impl<T: Default> Keyed<T> {
    /// The handle of `key`, created on first use.
    pub fn get(&self, key: &str) -> Arc<T> {
        if let Some(v) = self.map.read().get(key) {
            return v.clone();
        }
        self.map.write().entry(key.to_string()).or_default().clone()
    }
}

impl<T> Keyed<T> {
    /// The handle of `key` if it exists.
    pub fn find(&self, key: &str) -> Option<Arc<T>> {
        self.map.read().get(key).cloned()
    }

    /// Forgets `key` (a deleted topic): its series disappear from the next scrape.
    pub fn remove(&self, key: &str) {
        self.map.write().remove(key);
    }

    /// Every key and handle, sorted by key.
    pub fn snapshot(&self) -> Vec<(String, Arc<T>)> {
        let mut v: Vec<(String, Arc<T>)> = self
            .map
            .read()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.map.read().len()
    }

    /// True when no key exists.
    pub fn is_empty(&self) -> bool {
        self.map.read().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn handles_are_shared_and_removable() {
        let k: Keyed<AtomicU64> = Keyed::default();
        k.get("a").fetch_add(2, Ordering::Relaxed);
        k.get("a").fetch_add(1, Ordering::Relaxed);
        k.get("b");
        assert_eq!(k.find("a").map(|a| a.load(Ordering::Relaxed)), Some(3));
        assert_eq!(k.snapshot().len(), 2);
        k.remove("a");
        assert!(k.find("a").is_none());
        assert_eq!(k.len(), 1);
    }
}
