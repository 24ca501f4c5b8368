//! The wall clock of the listener (record timestamps, producer ids).

/// Wall-clock milliseconds since the Unix epoch.
pub(crate) fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
