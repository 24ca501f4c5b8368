//! What a run found.

use crate::time::Millis;
use crate::{BrokerId, Epoch};
use std::fmt;

/// A broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// An in-sync member (by the controller) lacks confirmed bytes or has other bytes there.
    InSyncLogDiverged {
        /// Virtual ms.
        at: Millis,
        /// The broker index.
        broker: usize,
        /// The first offset that differs or is missing.
        offset: u64,
    },
    /// A master published a confirmed offset over a log that differs from what was confirmed
    /// before (a confirmed, possibly delivered, message taken back).
    ConfirmedRewritten {
        /// Virtual ms.
        at: Millis,
        /// The broker index.
        broker: usize,
        /// The first offset that differs.
        offset: u64,
    },
    /// An acknowledged write is not in the confirmed history.
    AckedLost {
        /// Virtual ms.
        at: Millis,
        /// The write.
        write: u64,
    },
    /// Two brokers held a valid lease as master at one instant.
    TwoLeaseHolders {
        /// Virtual ms.
        at: Millis,
        /// The broker indexes.
        brokers: (usize, usize),
    },
    /// A write was acknowledged under an older epoch after one under a newer epoch, or two
    /// brokers acknowledged under one epoch.
    AckEpochBack {
        /// Virtual ms.
        at: Millis,
        /// The acknowledging broker's epoch.
        epoch: Epoch,
        /// The newest epoch acknowledged before.
        newest: Epoch,
    },
    /// An epoch went down (a broker's known master epoch, or a voter's applied master or
    /// in-sync-set epoch).
    EpochBack {
        /// Virtual ms.
        at: Millis,
        /// What.
        what: String,
    },
    /// A replica cut its log below the confirmed offset it had shown.
    TruncatedConfirmed {
        /// Virtual ms.
        at: Millis,
        /// The broker index.
        broker: usize,
        /// Cut to.
        to: u64,
        /// It had shown.
        confirmed: u64,
    },
    /// A broker was told to restart its log at an offset no broker's retention deleted
    /// below, or past the confirmed history.
    BadRestart {
        /// Virtual ms.
        at: Millis,
        /// The broker index.
        broker: usize,
        /// Where its log restarted.
        start: u64,
    },
    /// A broker became master over a log that does not end on a whole record.
    PartialRecord {
        /// Virtual ms.
        at: Millis,
        /// The broker index.
        broker: usize,
        /// Its log end.
        log_end: u64,
    },
    /// Two voters applied different metadata at the same log index.
    ControllersDiverged {
        /// Virtual ms.
        at: Millis,
    },
    /// After healing, no write was acknowledged within the settle time.
    Stuck {
        /// Virtual ms.
        at: Millis,
        /// The controller's view and the brokers' roles.
        detail: String,
    },
}

/// A run's figures.
#[derive(Debug, Clone, Default)]
pub struct SimReport {
    /// The seed.
    pub seed: u64,
    /// What broke, first first.
    pub violations: Vec<Violation>,
    /// Writes attempted, appended, acknowledged, refused.
    pub writes: (u64, u64, u64, u64),
    /// Acknowledged writes missing from the final confirmed history (only possible under
    /// `AckMode::Master`).
    pub acked_lost_master_mode: u64,
    /// Elections applied (the final master epoch).
    pub master_epoch: Epoch,
    /// The final confirmed history's length in bytes.
    pub confirmed_bytes: u64,
    /// Events processed.
    pub steps: u64,
    /// Faults applied.
    pub faults: usize,
    /// Final master (broker id) if any.
    pub master: Option<BrokerId>,
    /// Snapshots voters installed from a leader (live voters at the end).
    pub snapshots_installed: u64,
}

impl SimReport {
    /// Whether every invariant held.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

impl fmt::Display for SimReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {}: {} steps, {} faults, writes tried/appended/acked/refused {:?}, \
             master epoch {}, confirmed {} B",
            self.seed,
            self.steps,
            self.faults,
            self.writes,
            self.master_epoch,
            self.confirmed_bytes
        )?;
        if self.acked_lost_master_mode > 0 {
            write!(
                f,
                ", {} acked writes lost (ack = master)",
                self.acked_lost_master_mode
            )?;
        }
        for v in &self.violations {
            write!(f, "\n  VIOLATION {v:?}")?;
        }
        Ok(())
    }
}
