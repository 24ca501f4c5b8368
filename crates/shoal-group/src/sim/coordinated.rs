//! Coordinated mode in the simulator, member side: each member's membership of the coordinated
//! group (what `shoal-client`'s `coordinated::Membership` and the rebalance driver do:
//! heartbeat the coordinator on its notices, after a release and every interval, reporting the
//! queues held; pass the assignment to the [`Rebalancer`](crate::rebalance::Rebalancer) as its
//! target; drop everything when fenced or when no heartbeat was answered for a session
//! timeout). The broker's part is the broker model's ([`super::BrokerModel`]).

use super::model::{GroupAnswer, Req};
use super::{Life, Pending, Violation, World};
use crate::member::{Applied, CoordinatedMember, MemberAnswer, MemberConfig};
use crate::rebalance::QueuePhase;
use shoal_proto::MessageQueue;
use std::collections::BTreeSet;

/// A simulated member's membership: the client's sans-IO core, and the directive fences and
/// rejoins already given to its rebalancer.
#[derive(Debug)]
pub(super) struct Membership {
    pub core: CoordinatedMember,
    pub applied: Applied,
}

impl Membership {
    pub(super) fn new(
        member_id: String,
        instance_id: Option<String>,
        now: u64,
        interval: u64,
        session_timeout_ms: u64,
    ) -> Self {
        Self {
            core: CoordinatedMember::new(
                MemberConfig {
                    group: super::GROUP.into(),
                    member_id,
                    instance_id,
                    session_timeout_ms,
                    interval_ms: interval,
                },
                now,
            ),
            applied: Applied::default(),
        }
    }

    /// The stamp pulls, commits and locks carry (member id, epoch) once joined.
    pub(super) fn stamp(&self) -> Option<(String, i32)> {
        self.core.stamp().map(|s| (s.member_id, s.epoch))
    }
}

impl World {
    /// Heartbeats the coordinator now (or right after the heartbeat in flight).
    pub(super) fn member_wake(&mut self, m: usize) {
        let now = self.now;
        if let Some(ms) = self.members[m].coord.as_mut() {
            ms.core.handle_wake(now);
        }
    }

    /// The queues a coordinated heartbeat reports as held (the client's snapshot): every queue
    /// the rebalancer may still start or is still releasing, but not those whose unlock (the
    /// release evidence) is on its way.
    fn held(&self, m: usize) -> Vec<MessageQueue> {
        self.members[m]
            .rb
            .phases()
            .into_iter()
            .filter(|(_, p)| !matches!(p, QueuePhase::Unlocking))
            .map(|(q, _)| q)
            .collect()
    }

    /// After the member's actions ran: publish what it holds; a release wakes the membership
    /// (the coordinator gives the queue to its next owner only once it hears of it).
    pub(super) fn publish_held(&mut self, m: usize) {
        if self.members[m].coord.is_none() {
            return;
        }
        let held = self.held(m);
        let applied = self.members[m].rb.target_epoch();
        let now = self.now;
        if let Some(ms) = self.members[m].coord.as_mut() {
            ms.core.handle_held(now, held, applied);
        }
    }

    pub(super) fn send_group_heartbeat(&mut self, m: usize) {
        let held = self.held(m);
        let applied = self.members[m].rb.target_epoch();
        let now = self.now;
        let Some(ms) = self.members[m].coord.as_mut() else {
            return;
        };
        ms.core.handle_held(now, held, applied);
        let held = ms.core.report();
        let Some(epoch) = ms.core.poll_heartbeat(now) else {
            return;
        };
        let body = Req::GroupHeartbeat {
            member_id: ms.core.config().member_id.clone(),
            epoch,
            instance_id: ms.core.config().instance_id.clone(),
            owned: held,
        };
        self.trace(|| format!("{} group heartbeat {body:?}", self.members[m].id));
        self.request(m, body, Pending::GroupHeartbeat { epoch });
    }

    /// The answer (`None`: lost or timed out) of a group heartbeat sent at `sent_epoch`.
    pub(super) fn on_group_answer(&mut self, m: usize, sent_epoch: i32, a: Option<GroupAnswer>) {
        let now = self.now;
        let t = now;
        self.trace(|| format!("{} group answer {a:?}", self.members[m].id));
        let answer = match a {
            Some(GroupAnswer::Assigned {
                epoch,
                queues,
                interval,
            }) => MemberAnswer::Assigned {
                epoch,
                queues,
                interval_ms: interval,
            },
            Some(GroupAnswer::Fenced(_)) => MemberAnswer::Fenced,
            Some(GroupAnswer::Refused) | None => MemberAnswer::NoAnswer,
        };
        let member = &mut self.members[m];
        let Some(ms) = member.coord.as_mut() else {
            return;
        };
        let fences = ms.core.fences();
        let _ = ms
            .core
            .handle_answer(now, Some(super::BROKER), sent_epoch, answer);
        if ms.core.fences() > fences {
            self.trace(|| format!("{} fenced", self.members[m].id));
        }
        let member = &mut self.members[m];
        let Some(ms) = member.coord.as_mut() else {
            return;
        };
        ms.core
            .directive()
            .apply(&mut member.rb, t, &mut ms.applied);
    }

    /// The coordinator's invariants (one owner per queue among assigned and revoking sets),
    /// checked after every step of the broker.
    pub(super) fn check_coordinator(&mut self) {
        if let Err(detail) = self.broker.check_coordinator() {
            self.violations.push(Violation::Coordinator {
                at: self.now,
                detail,
            });
        }
    }

    /// Coordinated runs settle only when the coordinator is reconciled and every live member
    /// owns exactly what it assigned.
    pub(super) fn coordinator_settled(&self) -> bool {
        if !self.cfg.coordinated {
            return true;
        }
        let Some(d) = self.broker.describe_group(self.now) else {
            return false;
        };
        if !d.reconciled {
            return false;
        }
        self.members
            .iter()
            .filter(|m| m.life == Life::Alive)
            .all(|m| {
                let Some(ms) = &m.coord else { return false };
                d.members.iter().any(|x| {
                    x.member_id == ms.core.config().member_id
                        && x.revoking.is_empty()
                        && x.owned.iter().cloned().collect::<BTreeSet<_>>()
                            == m.rb.owned().into_iter().collect()
                })
            })
    }

    /// Member timers of the membership (the periodic heartbeat).
    pub(super) fn membership_timer(&self, m: usize) -> Option<u64> {
        self.members[m].coord.as_ref()?.core.poll_timeout()
    }

    pub(super) fn on_membership_timer(&mut self, m: usize) {
        self.send_group_heartbeat(m);
    }

    /// A graceful leave after everything was released (GROUP_LEAVE, not permanent).
    pub(super) fn send_group_leave(&mut self, m: usize) {
        let Some(ms) = self.members[m].coord.as_ref() else {
            return;
        };
        let body = Req::GroupLeave {
            member_id: ms.core.config().member_id.clone(),
        };
        self.request(m, body, Pending::GroupLeave);
    }

    /// Restarts a member as a new process: killed, and a new one starts at once with the
    /// same instance id (static membership: it takes over the reserved queues, nothing moves).
    pub(super) fn restart(&mut self, m: usize) {
        let instance = self.members[m]
            .coord
            .as_ref()
            .and_then(|c| c.core.config().instance_id.clone());
        self.kill(m);
        self.add_member_with(instance);
    }
}
