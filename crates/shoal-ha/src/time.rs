//! The one time type of the crate and the lease arithmetic that fences an old master.
//!
//! Every state machine takes `now` as [`Millis`]: milliseconds of the caller's monotonic clock
//! (as `shoal-group` does). Clocks of different processes are never compared; what crosses a
//! process boundary is a duration, and the bound on how fast one clock may run against another
//! is [`MAX_CLOCK_DRIFT_PPM`].

/// Milliseconds of a monotonic clock local to one process.
pub type Millis = u64;

/// The largest rate at which a process's monotonic clock may run fast or slow against real
/// time, in parts per million (1% here; quartz clocks stay within about 100 ppm, and a hung
/// clock is a pause, which the lease already covers). The lease check in [`LeaseTiming`]
/// holds for any two clocks within this bound.
pub const MAX_CLOCK_DRIFT_PPM: u64 = 10_000;

const PPM: u64 = 1_000_000;

/// How long a master may acknowledge writes after it asked for a lease, and how long the
/// controller waits after it last saw a lease granted before it elects another master.
///
/// Safety: the master counts its lease from the moment it *sent* the request (before the
/// grant was committed anywhere) and stops acknowledging after `lease_ms` of its own clock,
/// which is at most `lease_ms / (1 - drift)` of real time. The controller counts from the
/// moment it applied the grant (or became leader, whichever is later; both after the request
/// was sent) and waits `election_delay_ms` of its clock, which is at least
/// `election_delay_ms / (1 + drift)` of real time. [`LeaseTiming::new`] refuses timings where
/// the first can reach the second, so the old master has stopped before a new one is elected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    lease_ms: Millis,
    election_delay_ms: Millis,
}

/// A lease longer than the election delay allows (see [`LeaseTiming`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "lease {lease_ms} ms is not safely shorter than the election delay {election_delay_ms} ms: \
     clocks may drift by {MAX_CLOCK_DRIFT_PPM} ppm (1%) each way, so the lease times 1.01 must \
     stay below the election delay times 0.99 (with this lease, an election delay of at least \
     {} ms)",
    LeaseTiming::min_election_delay_ms(*lease_ms)
)]
pub struct UnsafeLease {
    /// The lease asked for.
    pub lease_ms: Millis,
    /// The election delay asked for.
    pub election_delay_ms: Millis,
}

impl LeaseTiming {
    /// A lease of `lease_ms` with an election delay of `election_delay_ms`; refused unless
    /// `lease_ms * (1 + d) < election_delay_ms * (1 - d)` for the drift bound `d`.
    pub fn new(lease_ms: Millis, election_delay_ms: Millis) -> Result<Self, UnsafeLease> {
        let worst_lease = lease_ms.saturating_mul(PPM + MAX_CLOCK_DRIFT_PPM);
        let least_delay = election_delay_ms.saturating_mul(PPM - MAX_CLOCK_DRIFT_PPM);
        if lease_ms == 0 || worst_lease >= least_delay {
            return Err(UnsafeLease {
                lease_ms,
                election_delay_ms,
            });
        }
        Ok(Self {
            lease_ms,
            election_delay_ms,
        })
    }

    /// The shortest election delay that [`LeaseTiming::new`] accepts with `lease_ms`.
    pub fn min_election_delay_ms(lease_ms: Millis) -> Millis {
        let worst_lease = u128::from(lease_ms) * u128::from(PPM + MAX_CLOCK_DRIFT_PPM);
        let least = worst_lease / u128::from(PPM - MAX_CLOCK_DRIFT_PPM) + 1;
        Millis::try_from(least).unwrap_or(Millis::MAX)
    }

    /// The lease a master holds from the moment it sent its request.
    pub fn lease_ms(&self) -> Millis {
        self.lease_ms
    }

    /// How long the controller waits after it last saw a grant before electing another master.
    pub fn election_delay_ms(&self) -> Millis {
        self.election_delay_ms
    }
}

impl Default for LeaseTiming {
    /// A 1 s lease and a 1.2 s election delay (safe up to the drift bound: 1,010 ms of the
    /// old master's lease at most against 1,188 ms of the controller's delay at least).
    fn default() -> Self {
        Self {
            lease_ms: 1_000,
            election_delay_ms: 1_200,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_timing_is_safe() {
        let d = LeaseTiming::default();
        assert_eq!(LeaseTiming::new(d.lease_ms(), d.election_delay_ms()), Ok(d));
    }

    #[test]
    fn a_lease_near_the_delay_is_refused() {
        // 1 s lease against 1.02 s: within 1% drift each way the lease may outlast the delay.
        assert!(LeaseTiming::new(1_000, 1_020).is_err());
        assert!(LeaseTiming::new(1_000, 1_000).is_err());
        assert!(LeaseTiming::new(0, 1_000).is_err());
        assert!(LeaseTiming::new(1_000, 1_030).is_ok());
    }

    #[test]
    fn the_shortest_safe_delay_is_accepted_and_one_less_is_not() {
        for lease in [1, 100, 999, 1_000, 3_000, 60_000] {
            let min = LeaseTiming::min_election_delay_ms(lease);
            assert!(LeaseTiming::new(lease, min).is_ok(), "{lease} {min}");
            assert!(LeaseTiming::new(lease, min - 1).is_err(), "{lease} {min}");
        }
        let e = LeaseTiming::new(1_000, 1_000).unwrap_err().to_string();
        assert!(e.contains("1%") && e.contains("at least 1021 ms"), "{e}");
    }
}
