//! The replica side of a broker group's replication, sans-IO.
//!
//! A replica follows the master the controller names. On every change of master (or epoch)
//! it handshakes with its epoch entries and log end; the master answers where the two logs
//! agree (KIP-101's divergence point) and the replica cuts its log there before taking
//! batches. It takes a batch only from the master it follows, at its own log end, with a
//! master epoch not older than any it knows; a batch from an older epoch is answered with the
//! newer epoch, which makes an old master step down.

use super::epoch::EpochCache;
use super::message::{BatchHeader, ToMaster, ToReplica};
use crate::time::Millis;
use crate::{BrokerId, Epoch};
use std::collections::VecDeque;

/// What the caller must do with a batch's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchVerdict {
    /// Append the bytes at `start` (the log end), durably, before sending what
    /// [`Replica::poll_transmit`] gives next.
    Append {
        /// Where they go.
        start: u64,
        /// Where the log ends after them.
        end: u64,
    },
    /// Drop them.
    Ignore,
}

/// What the caller must do to its log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaAction {
    /// Cut the commit log (and the epoch entries, see [`Replica::epochs`]) at this offset,
    /// durably, before sending what [`Replica::poll_transmit`] gives next.
    Truncate(u64),
    /// Drop the whole commit log (its consume queues and index with it) and start it afresh
    /// at this offset, a segment start of the master's, durably, before sending what
    /// [`Replica::poll_transmit`] gives next. The epoch entries are empty after it.
    RestartAt(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Handshake sent at this time, no answer yet.
    Handshaking(Millis),
    Following,
    /// A batch could not be appended: nothing is taken until this time, then it handshakes
    /// again (a full disk is not retried as fast as the master ships).
    Paused(Millis),
}

/// A replica of one broker group.
#[derive(Debug)]
pub struct Replica {
    me: BrokerId,
    epoch: Epoch,
    master: Option<BrokerId>,
    epochs: EpochCache,
    log_end: u64,
    confirmed: u64,
    phase: Phase,
    resend_ms: Millis,
    out: VecDeque<(BrokerId, ToMaster)>,
    actions: VecDeque<ReplicaAction>,
}

impl Replica {
    /// A replica over a log ending at `log_end` with `epochs`, knowing master epochs up to
    /// `epoch`. It follows nobody until [`Self::handle_master`].
    pub fn new(
        me: BrokerId,
        epoch: Epoch,
        epochs: EpochCache,
        log_end: u64,
        resend_ms: Millis,
    ) -> Self {
        Self {
            me,
            epoch: epoch.max(epochs.last_epoch()),
            master: None,
            epochs,
            log_end,
            confirmed: 0,
            phase: Phase::Handshaking(0),
            resend_ms,
            out: VecDeque::new(),
            actions: VecDeque::new(),
        }
    }

    /// The highest master epoch it knows.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The master it follows.
    pub fn master(&self) -> Option<BrokerId> {
        self.master
    }

    /// Its epoch entries; to be persisted beside the log.
    pub fn epochs(&self) -> &EpochCache {
        &self.epochs
    }

    /// Its log end.
    pub fn log_end(&self) -> u64 {
        self.log_end
    }

    /// The master's confirmed offset as far as this log has it: consumers reading from this
    /// replica see nothing above it.
    pub fn confirmed(&self) -> u64 {
        self.confirmed.min(self.log_end)
    }

    /// Whether it has handshaken and takes batches.
    pub fn is_following(&self) -> bool {
        self.phase == Phase::Following
    }

    /// The controller says `master` is master of `master_epoch`. An older epoch is ignored; a
    /// new master or epoch starts a handshake.
    pub fn handle_master(&mut self, now: Millis, master: BrokerId, master_epoch: Epoch) {
        if master_epoch < self.epoch || master == self.me {
            return;
        }
        if master_epoch == self.epoch && self.master == Some(master) {
            return;
        }
        self.epoch = master_epoch;
        self.master = Some(master);
        self.handshake(now);
    }

    /// A message from a broker (`from`); for a batch, what to do with its bytes.
    pub fn handle_message(&mut self, now: Millis, from: BrokerId, msg: ToReplica) -> BatchVerdict {
        match msg {
            ToReplica::Truncate {
                master_epoch,
                to,
                for_end,
            } => {
                if !self.accepts(now, from, master_epoch) {
                    return BatchVerdict::Ignore;
                }
                if !matches!(self.phase, Phase::Handshaking(_)) || for_end != self.log_end {
                    // A late answer to an earlier handshake: the log may have moved since.
                    return BatchVerdict::Ignore;
                }
                if to < self.log_end {
                    self.log_end = to;
                    self.epochs.truncate_to(to);
                    self.actions.push_back(ReplicaAction::Truncate(to));
                }
                self.confirmed = self.confirmed.min(self.log_end);
                self.phase = Phase::Following;
                self.ack(from);
                BatchVerdict::Ignore
            }
            ToReplica::RestartAt {
                master_epoch,
                at,
                for_end,
            } => {
                if !self.accepts(now, from, master_epoch)
                    || for_end != self.log_end
                    || self.is_paused()
                {
                    // Not our master, or a late answer: the log may have moved since.
                    return BatchVerdict::Ignore;
                }
                // A replica is never in the in-sync set while its master must restart it, so
                // what it drops acknowledges nothing.
                self.log_end = at;
                self.epochs.truncate_to(0);
                self.confirmed = self.confirmed.min(at);
                self.actions.push_back(ReplicaAction::RestartAt(at));
                self.phase = Phase::Following;
                self.ack(from);
                BatchVerdict::Ignore
            }
            ToReplica::Batch(h) => self.batch(now, from, h),
        }
    }

    fn batch(&mut self, now: Millis, from: BrokerId, h: BatchHeader) -> BatchVerdict {
        if h.master_epoch < self.epoch {
            // Tell the old master there is a newer epoch.
            self.out.push_back((
                from,
                ToMaster::Ack {
                    replica: self.me,
                    master_epoch: self.epoch,
                    end: self.log_end,
                },
            ));
            return BatchVerdict::Ignore;
        }
        if !self.accepts(now, from, h.master_epoch) {
            return BatchVerdict::Ignore;
        }
        if self.phase != Phase::Following {
            // Our master is sending, so it is master now; our handshake may have reached it
            // before it was (and been dropped): say it again rather than wait `resend_ms`.
            // At most once per message the master sends, and it sends only heartbeats to a
            // member that has not handshaken.
            if let Phase::Handshaking(at) = self.phase {
                if now > at {
                    self.handshake(now);
                }
            }
            return BatchVerdict::Ignore;
        }
        if h.start != self.log_end || h.start == h.end {
            // A heartbeat, a lost batch (a gap) or a duplicate: say where the log ends, which
            // also tells a master that restarted in this epoch where to ship from.
            if h.start == self.log_end {
                self.confirmed = self.confirmed.max(h.confirmed.min(self.log_end));
            }
            self.ack(from);
            return BatchVerdict::Ignore;
        }
        if h.end < h.start || h.batch_epoch > h.master_epoch {
            return BatchVerdict::Ignore;
        }
        if self.epochs.push(h.batch_epoch, h.start).is_err() {
            // Data of an older epoch than we hold at this point: not the master's log.
            self.handshake(now);
            return BatchVerdict::Ignore;
        }
        self.log_end = h.end;
        self.confirmed = self.confirmed.max(h.confirmed.min(self.log_end));
        self.ack(from);
        BatchVerdict::Append {
            start: h.start,
            end: h.end,
        }
    }

    /// The bytes of the last [`BatchVerdict::Append`] could not be appended (the disk refused
    /// them) and the log ends at `log_end`, where it did before them. The acknowledgement
    /// queued with the verdict is withdrawn, the master is told (writes stop waiting for this
    /// replica at once rather than after its lag limit), and nothing more is taken for
    /// `resend_ms`; then it handshakes again.
    pub fn handle_append_failed(&mut self, now: Millis, log_end: u64) {
        self.out.retain(|(_, m)| !matches!(m, ToMaster::Ack { .. }));
        if log_end < self.log_end {
            self.log_end = log_end;
            self.epochs.truncate_to(log_end);
        }
        self.confirmed = self.confirmed.min(self.log_end);
        if let Some(master) = self.master {
            self.out.push_back((
                master,
                ToMaster::CannotAppend {
                    replica: self.me,
                    master_epoch: self.epoch,
                    end: self.log_end,
                },
            ));
        }
        self.phase = Phase::Paused(now + self.resend_ms);
    }

    /// Whether it stopped taking batches after a failed append.
    pub fn is_paused(&self) -> bool {
        matches!(self.phase, Phase::Paused(_))
    }

    /// Time passed: a handshake without answer is sent again; a pause ends.
    pub fn handle_timeout(&mut self, now: Millis) {
        match self.phase {
            Phase::Handshaking(at) if self.master.is_some() && now >= at + self.resend_ms => {
                self.handshake(now);
            }
            Phase::Paused(until) if now >= until => {
                self.phase = Phase::Handshaking(now);
                self.handshake(now);
            }
            _ => {}
        }
    }

    /// When to call [`Self::handle_timeout`] next.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Millis> {
        match self.phase {
            Phase::Handshaking(at) if self.master.is_some() => Some(at + self.resend_ms),
            Phase::Paused(until) => Some(until),
            _ => None,
        }
    }

    /// What to do to the log, before sending anything polled after it.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<ReplicaAction> {
        self.actions.pop_front()
    }

    /// A message for a broker (the master).
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<(BrokerId, ToMaster)> {
        self.out.pop_front()
    }

    fn accepts(&mut self, now: Millis, from: BrokerId, master_epoch: Epoch) -> bool {
        if master_epoch < self.epoch {
            return false;
        }
        if master_epoch > self.epoch {
            // A master of a newer epoch than the controller told us of: epochs come only from
            // the controller, so it is the current one. Follow it.
            self.epoch = master_epoch;
            self.master = Some(from);
            self.handshake(now);
            return false;
        }
        self.master == Some(from)
    }

    fn handshake(&mut self, now: Millis) {
        let Some(master) = self.master else {
            return;
        };
        self.phase = Phase::Handshaking(now);
        self.out.push_back((
            master,
            ToMaster::Handshake {
                replica: self.me,
                master_epoch: self.epoch,
                end: self.log_end,
                epochs: self.epochs.entries().to_vec(),
            },
        ));
    }

    fn ack(&mut self, to: BrokerId) {
        self.out.push_back((
            to,
            ToMaster::Ack {
                replica: self.me,
                master_epoch: self.epoch,
                end: self.log_end,
            },
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replication::EpochEntry;

    fn batch(master_epoch: Epoch, batch_epoch: Epoch, start: u64, end: u64) -> ToReplica {
        ToReplica::Batch(BatchHeader {
            master_epoch,
            batch_epoch,
            start,
            end,
            confirmed: start,
        })
    }

    #[test]
    fn handshake_truncate_then_follow() {
        // Its log: epoch 1 up to 100, then 50 bytes of an epoch-2 master nobody else has.
        let epochs = EpochCache::from_entries(vec![
            EpochEntry { epoch: 1, start: 0 },
            EpochEntry {
                epoch: 2,
                start: 100,
            },
        ])
        .expect("ordered");
        let mut r = Replica::new(9, 2, epochs, 150, 200);
        r.handle_master(0, 1, 3);
        let Some((
            1,
            ToMaster::Handshake {
                end: 150, epochs, ..
            },
        )) = r.poll_transmit()
        else {
            panic!("handshake expected")
        };
        assert_eq!(epochs.len(), 2);
        // Batches before the answer are not taken.
        assert_eq!(
            r.handle_message(1, 1, batch(3, 3, 100, 120)),
            BatchVerdict::Ignore
        );
        // A stale answer (for another log end) is ignored.
        let stale = ToReplica::Truncate {
            master_epoch: 3,
            to: 10,
            for_end: 99,
        };
        assert_eq!(r.handle_message(2, 1, stale), BatchVerdict::Ignore);
        assert_eq!(r.poll_action(), None);
        let answer = ToReplica::Truncate {
            master_epoch: 3,
            to: 100,
            for_end: 150,
        };
        r.handle_message(3, 1, answer);
        assert_eq!(r.poll_action(), Some(ReplicaAction::Truncate(100)));
        assert_eq!(r.epochs().last_epoch(), 1);
        assert!(r.is_following());
        assert_eq!(
            r.handle_message(4, 1, batch(3, 3, 100, 130)),
            BatchVerdict::Append {
                start: 100,
                end: 130
            }
        );
        assert_eq!(
            r.epochs().last(),
            Some(EpochEntry {
                epoch: 3,
                start: 100
            })
        );
        assert_eq!(r.log_end(), 130);
    }

    #[test]
    fn refuses_an_older_epoch_and_says_so() {
        let mut r = Replica::new(9, 0, EpochCache::default(), 0, 200);
        r.handle_master(0, 2, 5);
        let _ = r.poll_transmit();
        assert_eq!(
            r.handle_message(1, 1, batch(4, 4, 0, 10)),
            BatchVerdict::Ignore
        );
        while let Some((to, msg)) = r.poll_transmit() {
            if to == 1 {
                assert_eq!(
                    msg.master_epoch(),
                    5,
                    "the old master learns the newer epoch"
                );
                return;
            }
        }
        panic!("no answer to the old master");
    }

    #[test]
    fn a_gap_is_answered_with_the_log_end() {
        let mut r = Replica::new(9, 0, EpochCache::default(), 0, 200);
        r.handle_master(0, 1, 1);
        let _ = r.poll_transmit();
        r.handle_message(
            1,
            1,
            ToReplica::Truncate {
                master_epoch: 1,
                to: 0,
                for_end: 0,
            },
        );
        let _ = r.poll_transmit();
        assert_eq!(
            r.handle_message(2, 1, batch(1, 1, 10, 20)),
            BatchVerdict::Ignore
        );
        assert_eq!(
            r.poll_transmit(),
            Some((
                1,
                ToMaster::Ack {
                    replica: 9,
                    master_epoch: 1,
                    end: 0
                }
            ))
        );
    }

    /// A batch its disk refused: the acknowledgement queued with the verdict is withdrawn and
    /// the master told; batches are ignored during the pause, then it handshakes again from
    /// where its log ends.
    #[test]
    fn a_batch_that_could_not_be_appended_is_not_acknowledged_and_pauses_it() {
        let mut r = Replica::new(9, 0, EpochCache::default(), 0, 200);
        r.handle_master(0, 1, 1);
        let _ = r.poll_transmit();
        r.handle_message(
            1,
            1,
            ToReplica::Truncate {
                master_epoch: 1,
                to: 0,
                for_end: 0,
            },
        );
        let _ = r.poll_transmit();
        assert_eq!(
            r.handle_message(2, 1, batch(1, 1, 0, 10)),
            BatchVerdict::Append { start: 0, end: 10 }
        );
        r.handle_append_failed(3, 0);
        assert_eq!(
            r.poll_transmit(),
            Some((
                1,
                ToMaster::CannotAppend {
                    replica: 9,
                    master_epoch: 1,
                    end: 0
                }
            ))
        );
        assert_eq!(r.poll_transmit(), None, "the batch is not acknowledged");
        assert_eq!(r.log_end(), 0);
        assert!(r.epochs().entries().is_empty());
        assert!(r.is_paused());
        assert_eq!(
            r.handle_message(50, 1, batch(1, 1, 0, 10)),
            BatchVerdict::Ignore
        );
        assert_eq!(r.poll_transmit(), None, "no handshake during the pause");
        assert_eq!(r.poll_timeout(), Some(203));
        r.handle_timeout(203);
        assert!(matches!(
            r.poll_transmit(),
            Some((1, ToMaster::Handshake { end: 0, .. }))
        ));
        assert!(!r.is_paused());
    }

    /// The controller told the replica of the new master before the master knew: its
    /// handshake was dropped. The master's first message makes it handshake again at once.
    #[test]
    fn a_handshake_the_master_dropped_is_sent_again_at_its_first_message() {
        let mut r = Replica::new(9, 1, EpochCache::default(), 0, 1_000);
        r.handle_master(10, 2, 2);
        assert!(matches!(
            r.poll_transmit(),
            Some((2, ToMaster::Handshake { .. }))
        ));
        // The same millisecond: the answer may be on its way.
        assert_eq!(
            r.handle_message(10, 2, batch(2, 2, 0, 0)),
            BatchVerdict::Ignore
        );
        assert_eq!(r.poll_transmit(), None);
        // Later, well before resend_ms.
        assert_eq!(
            r.handle_message(40, 2, batch(2, 2, 0, 0)),
            BatchVerdict::Ignore
        );
        assert!(matches!(
            r.poll_transmit(),
            Some((
                2,
                ToMaster::Handshake {
                    end: 0,
                    master_epoch: 2,
                    ..
                }
            ))
        ));
        // Nobody else's message does it.
        assert_eq!(
            r.handle_message(80, 3, batch(2, 2, 0, 0)),
            BatchVerdict::Ignore
        );
        assert_eq!(r.poll_transmit(), None);
    }

    /// Its master no longer has what it lacks: it drops its log and starts afresh at the
    /// master's first offset; a late restart (for another log end) is ignored.
    #[test]
    fn a_restart_drops_the_log_and_takes_batches_from_the_new_start() {
        let epochs =
            EpochCache::from_entries(vec![EpochEntry { epoch: 1, start: 0 }]).expect("ordered");
        let mut r = Replica::new(9, 1, epochs, 100, 200);
        r.handle_master(0, 1, 2);
        let Some((1, ToMaster::Handshake { end: 100, .. })) = r.poll_transmit() else {
            panic!("handshake expected")
        };
        let restart = |for_end| ToReplica::RestartAt {
            master_epoch: 2,
            at: 4_096,
            for_end,
        };
        assert_eq!(r.handle_message(1, 1, restart(50)), BatchVerdict::Ignore);
        assert_eq!(r.poll_action(), None, "a late answer changes nothing");
        assert_eq!(r.handle_message(2, 1, restart(100)), BatchVerdict::Ignore);
        assert_eq!(r.poll_action(), Some(ReplicaAction::RestartAt(4_096)));
        assert_eq!(r.log_end(), 4_096);
        assert!(r.epochs().entries().is_empty());
        assert!(r.is_following());
        let Some((1, ToMaster::Ack { end: 4_096, .. })) = r.poll_transmit() else {
            panic!("ack from the new start expected")
        };
        // Batches come from there, of whatever epoch wrote them.
        assert_eq!(
            r.handle_message(3, 1, batch(2, 1, 4_096, 4_200)),
            BatchVerdict::Append {
                start: 4_096,
                end: 4_200
            }
        );
        // Only the master it follows may restart it.
        assert_eq!(r.handle_message(4, 7, restart(4_200)), BatchVerdict::Ignore);
        assert_eq!(r.poll_action(), None);
    }
}
