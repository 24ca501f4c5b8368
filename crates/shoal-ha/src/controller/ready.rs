//! Driving raft-rs: each `Ready` handled as its contract asks, committed entries applied to
//! the metadata (answering the requests that proposed them), snapshots installed and taken.

use super::command::{Command, Outcome};
use super::metadata::Metadata;
use super::node::{ControllerNode, Waiter};
use super::request::Response;
use raft::eraftpb::{Entry, EntryType};

impl ControllerNode {
    /// Handles raft-rs's `Ready` as its contract asks: send messages, persist entries and hard
    /// state, send the messages that needed them persisted, apply committed entries, advance.
    pub(super) fn pump(&mut self) {
        while self.raw.has_ready() {
            let mut ready = self.raw.ready();
            if let Some(ss) = ready.ss() {
                self.on_role(ss.raft_state);
            }
            self.outbox.extend(ready.take_messages());
            if !ready.snapshot().is_empty() {
                self.install(ready.snapshot().clone());
            }
            let committed = ready.take_committed_entries();
            self.apply(committed);
            self.storage.append(ready.entries());
            if let Some(hs) = ready.hs() {
                self.storage.set_hard_state(hs.clone());
            }
            self.outbox.extend(ready.take_persisted_messages());
            let mut light = self.raw.advance(ready);
            if let Some(commit) = light.commit_index() {
                self.storage.set_commit(commit);
            }
            self.outbox.extend(light.take_messages());
            let committed = light.take_committed_entries();
            self.apply(committed);
            self.raw.advance_apply();
        }
        self.maybe_compact();
    }

    /// A snapshot from the leader replaces the metadata. Every lease in it counts as granted
    /// now (it was granted before the snapshot was taken).
    fn install(&mut self, snapshot: raft::eraftpb::Snapshot) {
        let metadata = serde_json::from_slice::<Metadata>(snapshot.get_data()).ok();
        self.storage.apply_snapshot(snapshot);
        // A snapshot without data (none was taken yet) holds no metadata to install.
        if let Some(metadata) = metadata {
            for g in metadata.groups().keys() {
                self.lease_seen.insert(g.clone(), self.now);
            }
            self.metadata = metadata;
            self.snapshots_installed += 1;
            self.pending_snapshot = None;
            self.compact_mark = self.raw.raft.raft_log.applied.max(self.compact_mark);
        }
    }

    /// Every `compact_every` applied entries, the log is cut at the snapshot taken at the
    /// previous mark, so the newest `compact_every` entries or more stay for voters that are
    /// only a little behind (a cut at `applied` would send them snapshots all the time).
    fn maybe_compact(&mut self) {
        let applied = self.raw.raft.raft_log.applied;
        if applied < self.compact_mark + self.cfg.compact_every {
            return;
        }
        if let Some((index, data)) = self.pending_snapshot.take() {
            self.storage.compact(index, data);
        }
        if let Ok(data) = serde_json::to_vec(&self.metadata) {
            self.pending_snapshot = Some((applied, data));
        }
        self.compact_mark = applied;
    }

    fn apply(&mut self, entries: Vec<Entry>) {
        for entry in entries {
            if entry.get_entry_type() != EntryType::EntryNormal || entry.get_data().is_empty() {
                continue;
            }
            // Entries are written only by `propose` from a `Command`; one that does not decode
            // was written by another version and is skipped by every voter alike.
            let Ok(cmd) = serde_json::from_slice::<Command>(entry.get_data()) else {
                continue;
            };
            let outcome = self.metadata.apply(&cmd);
            if let (Command::GrantLease { group, .. }, Outcome::LeaseGranted { .. }) =
                (&cmd, &outcome)
            {
                self.lease_seen.insert(group.clone(), self.now);
            }
            let waiter = self.waiter_of(entry.get_context());
            if let Command::ElectMaster { group, .. } = &cmd {
                if matches!(outcome, Outcome::Group(_)) {
                    if self.is_leader() {
                        self.elections_done += 1;
                    }
                    self.elections.remove(group);
                } else if waiter.is_some() {
                    // Refused: the view it was decided on is gone; decide again.
                    if let Some(e) = self.elections.get_mut(group) {
                        e.inflight_until = None;
                        if e.manual.is_some() {
                            self.elections.remove(group);
                        }
                    }
                }
            }
            if let Command::FenceLeases { group, .. } = &cmd {
                if let Some(e) = self.elections.get_mut(group) {
                    e.inflight_until = None;
                }
            }
            if let Some(waiter) = waiter {
                let response = match outcome {
                    // Proposed by the leader itself, with nobody to answer.
                    Outcome::LimitsSet => continue,
                    Outcome::BrokerId(id) => Response::BrokerId(id),
                    Outcome::Group(info) => Response::Group(info),
                    Outcome::LeaseGranted { master_epoch, .. } => Response::LeaseGranted {
                        master_epoch,
                        lease_ms: self.cfg.lease.lease_ms(),
                    },
                    Outcome::Refused(r) => Response::Refused(r),
                };
                if let (Waiter::Election { manual: None }, _) = (waiter, &response) {
                    continue;
                }
                self.answer(waiter, response);
            }
        }
    }

    fn waiter_of(&mut self, context: &[u8]) -> Option<Waiter> {
        let (node, seq) = context.split_at_checked(8)?;
        let node = u64::from_be_bytes(node.try_into().ok()?);
        let seq = u64::from_be_bytes(seq.try_into().ok()?);
        if node != self.cfg.id {
            return None;
        }
        self.pending.remove(&seq)
    }
}
