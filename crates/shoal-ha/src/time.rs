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
    "lease {lease_ms} ms is not safely shorter than the election delay {election_delay_ms} ms \
     under a clock drift of {MAX_CLOCK_DRIFT_PPM} ppm"
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
    /// A 3 s lease and a 4 s election delay.
    fn default() -> Self {
        Self {
            lease_ms: 3_000,
            election_delay_ms: 4_000,
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
}
