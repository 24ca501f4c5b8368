//! The invariants the simulator checks after every event. They read the world and draw no
//! randomness, so checking changes nothing in a run.
//!
//! - **The confirmed history never changes**: every confirmed offset a master publishes
//!   extends one reference history (the bytes below it must equal what was confirmed before);
//!   so no failover takes back a message a consumer may have seen.
//! - **In-sync logs agree up to the confirmed offset**: every member of the controller's
//!   in-sync set whose disk is intact holds the whole reference history.
//! - **No acknowledged message lost** (acknowledgement by the in-sync set): an acknowledged
//!   write is in the reference history, byte for byte, when it is acknowledged; with the two
//!   checks above it stays on every in-sync member, and so on every master ever elected.
//! - **At most one master acknowledges writes at any instant**: at most one broker holds a
//!   valid lease as master (each by its own drifting clock), and acknowledgements never go
//!   back to an older epoch nor come from two brokers under one epoch.
//! - **Epochs only grow**: a broker's known master epoch (per process life) and each voter's
//!   applied master and in-sync-set epochs (per process life).
//! - **Offsets never move back**: a replica never cuts its log below the confirmed offset
//!   it showed; voters at the same log index hold the same metadata.

use super::report::Violation;
use super::schedule::{Node, SimConfig};
use super::world::{record, whole_records_end, World, GROUP};
use crate::controller::GroupInfo;
use crate::replication::{AckMode, Acked, Role};
use crate::time::Millis;
use crate::Epoch;
use std::collections::BTreeMap;

#[derive(Debug, Default)]
pub(crate) struct Checker {
    pub(crate) violations: Vec<Violation>,
    pub(crate) reference: Vec<u8>,
    verified: Vec<u64>,
    shown_confirmed: Vec<u64>,
    known_epoch: Vec<Epoch>,
    master_epoch_seen: Vec<Option<Epoch>>,
    voter_epochs: Vec<Option<(u64, Epoch, Epoch)>>,
    voter_applied: Vec<Option<u64>>,
    view: Option<(u64, GroupInfo)>,
    max_ack_epoch: Epoch,
    ack_epoch_broker: BTreeMap<Epoch, usize>,
    pub(crate) acked_master_mode: Vec<(u64, Millis)>,
    pub(crate) acked_count: u64,
    pub(crate) last_ack_at: Millis,
    ack: AckMode,
}

/// The group as the controller committed it: the metadata at the highest log index any voter
/// ever applied (committed entries survive voters' crashes, so a voter that crashed after
/// applying it still speaks for the controller).
pub(crate) fn controller_view(w: &World) -> Option<&GroupInfo> {
    w.checker().view.as_ref().map(|(_, g)| g)
}

impl Checker {
    /// A checker of nothing (a placeholder while the real one is lent out).
    pub(crate) const fn empty() -> Self {
        Self {
            violations: Vec::new(),
            reference: Vec::new(),
            verified: Vec::new(),
            shown_confirmed: Vec::new(),
            known_epoch: Vec::new(),
            master_epoch_seen: Vec::new(),
            voter_epochs: Vec::new(),
            voter_applied: Vec::new(),
            view: None,
            max_ack_epoch: 0,
            ack_epoch_broker: BTreeMap::new(),
            acked_master_mode: Vec::new(),
            acked_count: 0,
            last_ack_at: 0,
            ack: AckMode::InSyncSet,
        }
    }

    pub(crate) fn new(cfg: &SimConfig) -> Self {
        Self {
            verified: vec![0; cfg.brokers],
            shown_confirmed: vec![0; cfg.brokers],
            known_epoch: vec![0; cfg.brokers],
            master_epoch_seen: vec![None; cfg.brokers],
            voter_epochs: vec![None; cfg.controllers],
            voter_applied: vec![None; cfg.controllers],
            ack: cfg.ack,
            ..Self::default()
        }
    }

    pub(crate) fn broker_restarted(&mut self, i: usize) {
        self.shown_confirmed[i] = 0;
        self.master_epoch_seen[i] = None;
        self.known_epoch[i] = 0;
    }

    pub(crate) fn controller_restarted(&mut self, i: usize) {
        self.voter_epochs[i] = None;
    }

    pub(crate) fn on_truncate(&mut self, i: usize, to: u64, at: Millis) {
        if to < self.shown_confirmed[i] {
            self.violations.push(Violation::TruncatedConfirmed {
                at,
                broker: i,
                to,
                confirmed: self.shown_confirmed[i],
            });
        }
        self.verified[i] = self.verified[i].min(to);
    }

    /// Broker `i`'s log restarts empty at `start`, as its master said: `start` must be a
    /// point of the confirmed history some broker's retention deleted below. (An in-sync
    /// member that lost confirmed bytes above `start` by it shows in the in-sync check.)
    pub(crate) fn on_restart(&mut self, w: &World, i: usize, start: u64, at: Millis) {
        let deleted_below = w.brokers.iter().any(|b| b.disk.log_start >= start);
        if start as usize > self.reference.len() || !deleted_below {
            self.violations.push(Violation::BadRestart {
                at,
                broker: i,
                start,
            });
        }
        // Nothing below `start` is held any more; what is above is checked from there.
        self.verified[i] = start;
        self.shown_confirmed[i] = self.shown_confirmed[i].min(start);
    }

    /// Extends the reference history with what broker `i`, if master, confirmed.
    fn extend(&mut self, w: &World, i: usize) {
        let b = &w.brokers[i];
        let Some(Role::Master(m)) = b.member.as_ref().map(|m| m.role()) else {
            return;
        };
        let c = m.confirmed() as usize;
        if c <= self.reference.len() {
            return;
        }
        let log = &b.disk.log;
        let known = self.reference.len();
        // Below its log start the bytes are gone (retention): checked while they were there.
        let from = self.verified[i].max(b.disk.log_start) as usize;
        if let Some(off) = first_difference(log, &self.reference, from) {
            self.violations.push(Violation::ConfirmedRewritten {
                at: w.now,
                broker: i,
                offset: off as u64,
            });
            return;
        }
        match log.get(known..c) {
            Some(more) => self.reference.extend_from_slice(more),
            None => {
                self.violations.push(Violation::ConfirmedRewritten {
                    at: w.now,
                    broker: i,
                    offset: log.len() as u64,
                });
                return;
            }
        }
        self.verified[i] = c as u64;
    }

    pub(crate) fn on_ack(&mut self, w: &World, i: usize, ack: Acked) {
        if ack.result.is_err() {
            return;
        }
        self.extend(w, i);
        self.last_ack_at = w.now;
        self.acked_count += 1;
        if ack.epoch < self.max_ack_epoch {
            self.violations.push(Violation::AckEpochBack {
                at: w.now,
                epoch: ack.epoch,
                newest: self.max_ack_epoch,
            });
        }
        self.max_ack_epoch = self.max_ack_epoch.max(ack.epoch);
        let by = *self.ack_epoch_broker.entry(ack.epoch).or_insert(i);
        if by != i {
            self.violations.push(Violation::AckEpochBack {
                at: w.now,
                epoch: ack.epoch,
                newest: self.max_ack_epoch,
            });
        }
        match self.ack {
            AckMode::InSyncSet => {
                let Some(&(_, start, end)) = w.writes.get(&ack.ticket) else {
                    return;
                };
                let want = record(ack.ticket);
                if self.reference.get(start as usize..end as usize) != Some(&want[..]) {
                    self.violations.push(Violation::AckedLost {
                        at: w.now,
                        write: ack.ticket,
                    });
                }
            }
            AckMode::Master => self.acked_master_mode.push((ack.ticket, w.now)),
        }
    }

    pub(crate) fn after_broker(&mut self, w: &World, i: usize) {
        // A new master's log holds whole records only.
        if let Some(Role::Master(m)) = w.brokers[i].member.as_ref().map(|m| m.role()) {
            if self.master_epoch_seen[i] != Some(m.epoch()) {
                self.master_epoch_seen[i] = Some(m.epoch());
                let disk = &w.brokers[i].disk;
                let log = &disk.log;
                if whole_records_end(log, disk.log_start, u64::MAX) != log.len() as u64 {
                    self.violations.push(Violation::PartialRecord {
                        at: w.now,
                        broker: i,
                        log_end: log.len() as u64,
                    });
                }
            }
        }
        self.extend(w, i);
        if let Some(m) = &w.brokers[i].member {
            self.shown_confirmed[i] = self.shown_confirmed[i].max(m.confirmed());
            if m.known_epoch() < self.known_epoch[i] {
                self.violations.push(Violation::EpochBack {
                    at: w.now,
                    what: format!(
                        "broker {i} known epoch {} after {}",
                        m.known_epoch(),
                        self.known_epoch[i]
                    ),
                });
            }
            self.known_epoch[i] = m.known_epoch();
        }
    }

    pub(crate) fn after_step(&mut self, w: &World) {
        // The controller's committed view.
        let newest = w
            .controllers
            .iter()
            .filter_map(|c| c.node.as_ref())
            .max_by_key(|n| n.applied_index());
        if let Some(n) = newest {
            if self
                .view
                .as_ref()
                .is_none_or(|(i, _)| n.applied_index() > *i)
            {
                if let Some(g) = n.metadata().group(GROUP) {
                    self.view = Some((n.applied_index(), g.clone()));
                }
            }
        }
        // One lease holder at most.
        let mut holder: Option<usize> = None;
        for (i, b) in w.brokers.iter().enumerate() {
            if let Some(Role::Master(m)) = b.member.as_ref().map(|m| m.role()) {
                if m.holds_lease(w.local_of(Node::Broker(i))) {
                    if let Some(other) = holder {
                        self.violations.push(Violation::TwoLeaseHolders {
                            at: w.now,
                            brokers: (other, i),
                        });
                    }
                    holder = Some(i);
                }
            }
        }
        // In-sync members hold the confirmed history.
        if let Some((_, info)) = &self.view {
            for id in &info.in_sync {
                if w.lost_ids.contains(id) {
                    continue;
                }
                let Some(&i) = w.ids.get(id) else {
                    continue;
                };
                let disk = &w.brokers[i].disk;
                if self.verified[i] as usize >= self.reference.len() {
                    continue;
                }
                let from = self.verified[i].max(disk.log_start) as usize;
                match first_difference(&disk.log, &self.reference, from) {
                    Some(off) => {
                        self.violations.push(Violation::InSyncLogDiverged {
                            at: w.now,
                            broker: i,
                            offset: off as u64,
                        });
                        return;
                    }
                    None => self.verified[i] = self.reference.len() as u64,
                }
            }
        }
        // Voters: epochs grow, and equal indexes hold equal metadata (looked at when a voter
        // applied something).
        let applied: Vec<Option<u64>> = w
            .controllers
            .iter()
            .map(|c| c.node.as_ref().map(|n| n.applied_index()))
            .collect();
        if applied == self.voter_applied {
            return;
        }
        self.voter_applied = applied;
        let mut by_index: BTreeMap<u64, usize> = BTreeMap::new();
        for (v, c) in w.controllers.iter().enumerate() {
            let Some(n) = &c.node else {
                continue;
            };
            let applied = n.applied_index();
            if let Some(&other) = by_index.get(&applied) {
                let same = w.controllers[other]
                    .node
                    .as_ref()
                    .is_some_and(|o| o.metadata() == n.metadata());
                if !same {
                    self.violations
                        .push(Violation::ControllersDiverged { at: w.now });
                }
            } else {
                by_index.insert(applied, v);
            }
            if let Some(g) = n.metadata().group(GROUP) {
                if let Some((_, me, ie)) = self.voter_epochs[v] {
                    if g.master_epoch < me || g.in_sync_epoch < ie {
                        self.violations.push(Violation::EpochBack {
                            at: w.now,
                            what: format!(
                                "voter {v} epochs ({}, {}) after ({me}, {ie})",
                                g.master_epoch, g.in_sync_epoch
                            ),
                        });
                    }
                }
                self.voter_epochs[v] = Some((applied, g.master_epoch, g.in_sync_epoch));
            }
        }
    }
}

/// The first offset at or after `from` where `log` differs from `reference` or ends before it.
fn first_difference(log: &[u8], reference: &[u8], from: usize) -> Option<usize> {
    let from = from.min(reference.len());
    let want = &reference[from..];
    let have = log.get(from..).unwrap_or(&[]);
    if let Some(off) = want.iter().zip(have).position(|(a, b)| a != b) {
        return Some(from + off);
    }
    (have.len() < want.len()).then_some(from + have.len())
}

#[cfg(test)]
mod tests {
    use super::first_difference;

    #[test]
    fn differences_are_found() {
        assert_eq!(first_difference(b"abcdef", b"abcd", 0), None);
        assert_eq!(first_difference(b"abXdef", b"abcd", 0), Some(2));
        assert_eq!(first_difference(b"abXdef", b"abcd", 3), None);
        assert_eq!(first_difference(b"ab", b"abcd", 1), Some(2));
    }
}
