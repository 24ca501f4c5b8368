//! The leader's decisions outside the log: which brokers are alive (heartbeats), when the
//! last lease it saw has certainly expired, and whom to elect, each proposed as a command.
//! A new leader starts with every broker unseen and every lease just granted, so it waits a
//! whole session and a whole election delay before electing anyone.

use super::command::Command;
use super::node::{ControllerNode, Election, Live, Waiter, ELECTION_RETRY_MS};
use super::request::Response;
use crate::{BrokerId, Epoch};
use raft::StateRole;
use std::collections::BTreeMap;

impl ControllerNode {
    /// The leader's election step for every group that needs one: fence the old master's
    /// leases, wait until the last lease seen has certainly expired, then elect the in-sync
    /// replica with the highest epoch and offset.
    pub(super) fn drive_elections(&mut self) {
        let Some(since) = self.leader_since else {
            return;
        };
        let now = self.now;
        let session = self.cfg.session_timeout_ms;
        let alive = |live: &BTreeMap<(String, BrokerId), Live>, g: &str, b: BrokerId| {
            live.get(&(g.to_string(), b))
                .filter(|l| l.alive(now, session))
                .copied()
        };
        // Automatic failovers: a group whose master is not alive (a new leader first waits a
        // whole session, as it has seen nobody yet), or a group with no master yet.
        if now >= since + session {
            for (name, info) in self.metadata.groups() {
                if self.elections.contains_key(name) {
                    continue;
                }
                // A fenced master (an election a former leader began) cannot renew its
                // lease: finish that election (the master itself is a candidate again).
                let needs = match info.master {
                    Some(m) => {
                        alive(&self.live, name, m).is_none()
                            || info.fenced_epoch >= info.master_epoch
                    }
                    None => info
                        .members
                        .keys()
                        .any(|b| alive(&self.live, name, *b).is_some()),
                };
                if needs {
                    self.elections.insert(
                        name.clone(),
                        Election {
                            target: None,
                            manual: None,
                            inflight_until: None,
                        },
                    );
                }
            }
        }
        let names: Vec<String> = self.elections.keys().cloned().collect();
        for name in names {
            let Some(info) = self.metadata.group(&name).cloned() else {
                self.elections.remove(&name);
                continue;
            };
            let Some(election) = self.elections.get(&name).cloned() else {
                continue;
            };
            if election.inflight_until.is_some_and(|until| now < until) {
                continue;
            }
            let waiter = Waiter::Election {
                manual: election.manual,
            };
            let first = info.master.is_none() && info.in_sync.is_empty();
            if !first && info.fenced_epoch < info.master_epoch {
                self.mark_inflight(&name);
                self.propose(
                    Command::FenceLeases {
                        group: name.clone(),
                        master_epoch: info.master_epoch,
                    },
                    Waiter::Election { manual: None },
                );
                continue;
            }
            let seen = self.lease_seen.get(&name).copied().unwrap_or(0).max(since);
            if !first && now < seen + self.cfg.lease.election_delay_ms() {
                continue;
            }
            // Candidates: alive members of the in-sync set (any alive member the first time),
            // the best by (epoch, offset) descending, then the lowest id.
            let pool: Vec<BrokerId> = if first {
                info.members.keys().copied().collect()
            } else {
                info.in_sync.iter().copied().collect()
            };
            let mut best: Option<(Epoch, u64, std::cmp::Reverse<BrokerId>)> = None;
            for b in pool {
                if election.target.is_some_and(|t| t != b) {
                    continue;
                }
                if let Some(l) = alive(&self.live, &name, b) {
                    let key = (l.last_epoch, l.end_offset, std::cmp::Reverse(b));
                    if best.is_none_or(|k| key > k) {
                        best = Some(key);
                    }
                }
            }
            let Some((_, _, std::cmp::Reverse(master))) = best else {
                // Nobody electable is alive: keep waiting (the fence stays, so the old master
                // cannot acknowledge; it is a candidate again once it is heard from).
                continue;
            };
            self.mark_inflight(&name);
            self.propose(
                Command::ElectMaster {
                    group: name.clone(),
                    master,
                    expect_master_epoch: info.master_epoch,
                },
                waiter,
            );
        }
    }

    fn mark_inflight(&mut self, name: &str) {
        if let Some(e) = self.elections.get_mut(name) {
            e.inflight_until = Some(self.now + ELECTION_RETRY_MS);
        }
    }

    pub(super) fn on_role(&mut self, role: StateRole) {
        if role == StateRole::Leader {
            if self.leader_since.is_none() {
                self.leader_since = Some(self.now);
                self.limits_inflight_until = None;
                self.live.clear();
                self.elections.clear();
            }
        } else if self.leader_since.take().is_some() {
            let pending = std::mem::take(&mut self.pending);
            let leader = self.leader();
            for (_, waiter) in pending {
                self.answer(waiter, Response::NotLeader { leader });
            }
            let elections = std::mem::take(&mut self.elections);
            for (_, e) in elections {
                if let Some(token) = e.manual {
                    self.responses
                        .push_back((token, Response::NotLeader { leader }));
                }
            }
            self.live.clear();
        }
    }
}
