//! POP leases follow the data: the master's POP engine records (a queue's baseline, cursor
//! moves, leases granted or renewed, offsets done) go to the replicas as metadata records in
//! the journal's one-line form, the whole state first and then what changed each round. A
//! replica rebuilds the engine's state aside ([`PopFollower`]); a new master adopts it when it
//! takes over, so a message under lease at the old master stays invisible until its lease
//! ends, and an acknowledged one is not delivered again.
//!
//! Like consumer offsets, what changed less than a round before the master died is not on the
//! new master: a lease granted then is not known (its message is delivered again at once),
//! an acknowledgement then is not known (its message is delivered again after its lease).

use shoal_group::pop::{PopConfig, PopEngine, PopRecord};
use tracing::warn;

/// Engine records per metadata record at most (a line is about 60 to 120 bytes).
pub(super) const RECORDS_PER_METADATA: usize = 4_096;

/// The records in the journal's text form, one a line.
pub(super) fn encode_lines(records: &[PopRecord]) -> String {
    let mut out = String::new();
    for r in records {
        r.encode(&mut out);
    }
    out
}

/// The master's POP state as its records carried it.
#[derive(Debug)]
pub(super) struct PopFollower {
    config: PopConfig,
    /// `None` until the first record: the log carried no POP state.
    engine: Option<PopEngine>,
}

impl PopFollower {
    pub(super) fn new(config: PopConfig) -> Self {
        Self {
            config,
            engine: None,
        }
    }

    /// Applies one metadata record's lines; `whole` starts a new state (a whole-state set's
    /// first record).
    pub(super) fn apply(&mut self, whole: bool, lines: &str) {
        if whole || self.engine.is_none() {
            self.engine = Some(PopEngine::new(self.config.clone()));
        }
        let mut records = Vec::new();
        for line in lines.lines() {
            match PopRecord::decode(line) {
                Ok(r) => records.push(r),
                Err(e) => warn!(error = %e, "replicated POP record not understood; skipped"),
            }
        }
        if let Some(e) = self.engine.as_mut() {
            e.restore(records);
        }
    }

    /// The state to adopt, if the log carried any.
    pub(super) fn snapshot(&self) -> Option<Vec<PopRecord>> {
        self.engine.as_ref().map(PopEngine::snapshot)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use shoal_group::pop::QueueKey;

    fn grant(offset: u64, consumer: &str) -> PopRecord {
        PopRecord::Grant {
            key: QueueKey::new("g", "t", 0),
            offset,
            pop_time: 1_000,
            deadline: 61_000,
            attempts: 1,
            consumer: consumer.into(),
        }
    }

    #[test]
    fn a_follower_rebuilds_leases_and_a_whole_state_replaces_them() {
        let key = QueueKey::new("g", "t", 0);
        let base = PopRecord::Base {
            key: key.clone(),
            ack: 0,
            cursor: 0,
            fifo: false,
        };
        let mut f = PopFollower::new(PopConfig::default());
        assert_eq!(f.snapshot(), None);
        f.apply(true, &encode_lines(std::slice::from_ref(&base)));
        f.apply(
            false,
            &encode_lines(&[
                grant(0, "c1"),
                grant(1, "c1"),
                PopRecord::Cursor {
                    key: key.clone(),
                    cursor: 2,
                },
            ]),
        );
        f.apply(
            false,
            &encode_lines(&[PopRecord::Done {
                key: key.clone(),
                offset: 0,
            }]),
        );
        let mut e = PopEngine::new(PopConfig::default());
        e.restore(f.snapshot().unwrap());
        // Offset 0 acknowledged, 1 under lease: acked offset 1, cursor 2.
        assert_eq!(e.queue_offsets(&key), Some((1, 2)));
        let snap = f.snapshot().unwrap();
        assert!(snap.contains(&grant(1, "c1")), "{snap:?}");
        assert!(!snap.contains(&grant(0, "c1")), "{snap:?}");

        // A whole state replaces what was there.
        f.apply(
            true,
            &encode_lines(&[PopRecord::Base {
                key: key.clone(),
                ack: 5,
                cursor: 5,
                fifo: false,
            }]),
        );
        let snap = f.snapshot().unwrap();
        assert_eq!(
            snap,
            [PopRecord::Base {
                key,
                ack: 5,
                cursor: 5,
                fifo: false
            }]
        );
    }

    #[test]
    fn a_line_that_does_not_parse_is_skipped() {
        let mut f = PopFollower::new(PopConfig::default());
        let mut lines = encode_lines(&[grant(3, "c1")]);
        lines.push_str("X nonsense\n");
        lines.push_str(&encode_lines(&[grant(4, "c2")]));
        f.apply(true, &lines);
        let snap = f.snapshot().unwrap();
        assert!(snap.contains(&grant(3, "c1")) && snap.contains(&grant(4, "c2")));
    }
}
