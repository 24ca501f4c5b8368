//! The broker's cache of compiled SQL92 selectors (an owner of `Shared`, a leaf module).

use parking_lot::Mutex;
use shoal_filter::Selector;
use std::collections::HashMap;
use std::sync::Arc;

/// Compiled selectors kept at once; the cache is emptied when it is full (clients send the
/// same few selectors on every pull).
pub(crate) const SELECTOR_CACHE_ENTRIES: usize = 1024;

/// Compiled SQL92 selectors by their text (bounded: [`SELECTOR_CACHE_ENTRIES`]).
#[derive(Debug, Default)]
pub(crate) struct SelectorCache {
    compiled: Mutex<HashMap<String, Arc<Selector>>>,
}

impl SelectorCache {
    /// The compiled selector for `sql`.
    ///
    /// # Errors
    /// The parse error, for a selector that does not compile.
    pub(crate) fn get(&self, sql: &str) -> Result<Arc<Selector>, shoal_filter::ParseError> {
        if let Some(s) = self.compiled.lock().get(sql) {
            return Ok(Arc::clone(s));
        }
        let s = Arc::new(Selector::parse(sql)?);
        let mut map = self.compiled.lock();
        if map.len() >= SELECTOR_CACHE_ENTRIES {
            map.clear();
        }
        map.insert(sql.to_owned(), Arc::clone(&s));
        Ok(s)
    }

    /// Selectors cached now.
    pub(crate) fn len(&self) -> usize {
        self.compiled.lock().len()
    }
}
