//! The broker's clocks: the wall clock (stored times, stats) and one monotonic clock for its
//! group state (expiry, lock leases, the coordinator's deadlines), which a test or the
//! simulator harness can drive by hand.

#[cfg(test)]
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(test)]
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Wall-clock milliseconds since the Unix epoch.
pub fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[derive(Debug, Clone)]
enum Source {
    /// Time since the broker started.
    Real(Instant),
    /// Milliseconds since start, set by whoever drives the broker (tests, the simulator).
    #[cfg(test)]
    Manual(Arc<AtomicU64>),
}

/// The broker's clocks. See the [module documentation](self).
#[derive(Debug, Clone)]
pub(crate) struct BrokerClock {
    source: Source,
    started_wall_ms: i64,
}

impl BrokerClock {
    /// A clock starting now, when the wall clock says `started_wall_ms`.
    pub(crate) fn starting_at(started_wall_ms: i64) -> Self {
        Self {
            source: Source::Real(Instant::now()),
            started_wall_ms,
        }
    }

    #[cfg(test)]
    /// A clock that moves only when `elapsed_ms` (milliseconds since start) is set.
    pub(crate) fn manual(started_wall_ms: i64, elapsed_ms: Arc<AtomicU64>) -> Self {
        Self {
            source: Source::Manual(elapsed_ms),
            started_wall_ms,
        }
    }

    /// Monotonic milliseconds since the broker started.
    pub(crate) fn mono_ms(&self) -> u64 {
        match &self.source {
            Source::Real(started) => started.elapsed().as_millis() as u64,
            #[cfg(test)]
            Source::Manual(ms) => ms.load(Ordering::Relaxed),
        }
    }

    /// When the broker started (wall clock, ms).
    pub(crate) fn started_wall_ms(&self) -> i64 {
        self.started_wall_ms
    }

    /// The group state's clock: wall-clock ms at start plus monotonic time since, so it never
    /// goes backwards while the broker runs and stays comparable across restarts (the
    /// coordinator persists deadlines on it).
    pub(crate) fn now_ms(&self) -> u64 {
        (self.started_wall_ms.max(0) as u64).saturating_add(self.mono_ms())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_set() {
        let elapsed = Arc::new(AtomicU64::new(0));
        let c = BrokerClock::manual(1_000, elapsed.clone());
        assert_eq!((c.mono_ms(), c.now_ms()), (0, 1_000));
        elapsed.store(250, Ordering::Relaxed);
        assert_eq!(
            (c.mono_ms(), c.now_ms(), c.started_wall_ms()),
            (250, 1_250, 1_000)
        );
    }
}
