//! Coordinated mode in the simulator: each member's membership of the coordinated group (what
//! `shoal-client`'s `coordinated::Membership` and the rebalance driver do: heartbeat the
//! coordinator on its notices, after a release and every interval, reporting the queues held;
//! pass the assignment to the [`Rebalancer`](crate::rebalance::Rebalancer) as its target; drop
//! everything when fenced or when no heartbeat was answered for a session timeout), and the
//! broker's part (the sans-IO [`Coordinator`] beside the registry and the lock table: unlock
//! evidence, the member-epoch fence on locks, pulls and commits, lock releases of removed
//! members, notices).

use super::broker::{Outbox, SimBroker, GROUP, TOPIC};
use super::{Life, Pending, Reply, Req, Violation, World};
use crate::coordinator::{Coordinator, CoordinatorConfig, Effect, HeartbeatRequest, JOIN_EPOCH};
use crate::error::GroupError;
use crate::rebalance::QueuePhase;
use shoal_proto::MessageQueue;
use std::collections::BTreeSet;

/// A member's membership of the coordinated group (client side).
#[derive(Debug)]
pub(super) struct Membership {
    pub member_id: String,
    pub instance_id: Option<String>,
    /// Member epoch of the last answer (0: joining).
    pub epoch: i32,
    /// The coordinator answered at least once since the last fence.
    pub joined: bool,
    /// The coordinator answered once: pulls, commits and locks carry the member epoch.
    pub stamped: bool,
    pub assignment: BTreeSet<MessageQueue>,
    pub in_flight: bool,
    /// A wake-up came while a heartbeat was in flight: heartbeat again after its answer.
    pub again: bool,
    /// Next periodic heartbeat.
    pub next_at: u64,
    pub interval: u64,
    /// When the last successful answer arrived.
    pub last_ok: Option<u64>,
    /// The held queues last published (a queue leaving it wakes the membership).
    pub held: Vec<MessageQueue>,
    pub fences: u64,
}

impl Membership {
    pub fn new(member_id: String, instance_id: Option<String>, now: u64, interval: u64) -> Self {
        Self {
            member_id,
            instance_id,
            epoch: JOIN_EPOCH,
            joined: false,
            stamped: false,
            assignment: BTreeSet::new(),
            in_flight: false,
            again: false,
            next_at: now,
            interval,
            last_ok: None,
            held: Vec::new(),
            fences: 0,
        }
    }

    /// The stamp pulls, commits and locks carry (member id, epoch) once joined.
    pub fn stamp(&self) -> Option<(String, i32)> {
        self.stamped.then(|| (self.member_id.clone(), self.epoch))
    }
}

/// What the coordinator answered a group heartbeat.
#[derive(Debug, Clone)]
pub(super) enum GroupAnswer {
    Assigned {
        epoch: i32,
        queues: Vec<MessageQueue>,
        interval: u64,
    },
    /// FENCED_MEMBER_EPOCH or UNKNOWN_MEMBER_ID (why): drop everything, rejoin.
    Fenced(String),
    /// Another refusal (e.g. UNRELEASED_INSTANCE_ID): try again at the next interval.
    Refused,
}

/// The coordinator settings of a simulated run. Its own session timeout stays the default
/// (45 s, longer than any run): members name theirs in every heartbeat, as the client does.
pub(super) fn coordinator_config(
    heartbeat_ms: u64,
    rebalance_ms: u64,
    assignor: &str,
) -> CoordinatorConfig {
    CoordinatorConfig {
        heartbeat_interval_ms: heartbeat_ms,
        rebalance_timeout_ms: rebalance_ms,
        max_rebalance_timeout_ms: rebalance_ms.max(1),
        default_assignor: assignor.to_string(),
        ..CoordinatorConfig::default()
    }
}

impl SimBroker {
    /// Executes the coordinator's effects (the broker's `GroupState::take_effects`): notices
    /// to members, broker-lock releases of members it removed (with their waiters told).
    pub fn coordinator_effects(&mut self, out: &mut Outbox) {
        let Some(c) = self.coordinator.as_mut() else {
            return;
        };
        let effects: Vec<Effect> = c.drain_effects();
        for e in effects {
            match e {
                Effect::Notify { conn_id, .. } => out.assign.push(conn_id),
                Effect::ReleaseLocks { client_id, .. } => {
                    // A member the coordinator removed may still be alive (frozen, stuck in
                    // its listener) and its locks' lease (its broker session) still valid:
                    // the locks are freed when it unlocks or its session ends, not before.
                    if self.registry.conn_of(GROUP, &client_id).is_none() {
                        let freed = self.locks.release_client(GROUP, &client_id);
                        self.freed(freed, out);
                    }
                }
                Effect::MemberRemoved { .. } | Effect::Persist { .. } => {}
            }
        }
    }

    /// The member-epoch fence (the broker's `check_stamp`): refused when the coordinator
    /// would not accept `stamp` for one of `queues`.
    pub fn stamp_refused(&self, stamp: &Option<(String, i32)>, queues: &[MessageQueue]) -> bool {
        let (Some(c), Some((member, epoch))) = (&self.coordinator, stamp) else {
            return false;
        };
        if !c.has_members(GROUP) {
            return false;
        }
        queues
            .iter()
            .any(|q| c.validate(GROUP, member, *epoch, q).is_err())
    }
}

impl World {
    /// Sets up the coordinator of a coordinated run.
    pub(super) fn start_coordinator(&mut self) {
        if !self.cfg.coordinated {
            return;
        }
        let cfg = coordinator_config(
            self.cfg.heartbeat_ms,
            self.cfg.rebalance_timeout_ms,
            &self.cfg.strategy,
        );
        let mut c = Coordinator::new(cfg);
        c.set_topic_queues(TOPIC, self.broker.queues(), self.now);
        self.broker.coordinator = Some(c);
    }

    /// Heartbeats the coordinator now (or right after the heartbeat in flight).
    pub(super) fn member_wake(&mut self, m: usize) {
        let Some(ms) = self.members[m].coord.as_mut() else {
            return;
        };
        if ms.in_flight {
            ms.again = true;
        } else {
            ms.next_at = self.now;
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
        let coordinated = self.members[m].rb.is_coordinated();
        let Some(ms) = self.members[m].coord.as_mut() else {
            return;
        };
        let released = ms.held.iter().any(|q| !held.contains(q));
        ms.held = held;
        if released && coordinated {
            self.member_wake(m);
        }
    }

    pub(super) fn send_group_heartbeat(&mut self, m: usize) {
        let held = self.held(m);
        let Some(ms) = self.members[m].coord.as_mut() else {
            return;
        };
        ms.in_flight = true;
        ms.again = false;
        ms.next_at = self.now + ms.interval;
        let body = Req::GroupHeartbeat {
            member_id: ms.member_id.clone(),
            epoch: ms.epoch,
            instance_id: ms.instance_id.clone(),
            owned: held,
        };
        let epoch = ms.epoch;
        self.trace(|| format!("{} group heartbeat {body:?}", self.members[m].id));
        self.request(m, body, Pending::GroupHeartbeat { epoch });
    }

    /// The answer (`None`: lost or timed out) of a group heartbeat sent at `sent_epoch`.
    pub(super) fn on_group_answer(&mut self, m: usize, sent_epoch: i32, a: Option<GroupAnswer>) {
        let now = self.now;
        let t = self.at(now);
        let session = self.cfg.session_timeout_ms;
        self.trace(|| format!("{} group answer {a:?}", self.members[m].id));
        let Some(ms) = self.members[m].coord.as_mut() else {
            return;
        };
        ms.in_flight = false;
        let mut again = std::mem::take(&mut ms.again);
        let mut fenced = false;
        let mut fence_why = None;
        match a {
            Some(GroupAnswer::Assigned {
                epoch,
                queues,
                interval,
            }) => {
                ms.joined = true;
                ms.stamped = true;
                ms.epoch = epoch;
                ms.assignment = queues.into_iter().collect();
                ms.last_ok = Some(now);
                ms.interval = interval.max(1);
                ms.next_at = now + ms.interval;
            }
            Some(GroupAnswer::Fenced(why)) => {
                fence_why = Some(why);
                ms.epoch = JOIN_EPOCH;
                ms.assignment.clear();
                ms.fences += 1;
                fenced = true;
                again |= sent_epoch != JOIN_EPOCH;
            }
            Some(GroupAnswer::Refused) | None => {
                // No successful heartbeat for a session timeout: the coordinator has given our
                // queues away.
                if ms.joined
                    && ms.last_ok.is_some_and(|t| now >= t + session)
                    && !ms.assignment.is_empty()
                {
                    ms.assignment.clear();
                    ms.epoch = JOIN_EPOCH;
                    ms.fences += 1;
                    fenced = true;
                }
            }
        }
        if fenced {
            ms.joined = false;
            self.members[m].rb.handle_fenced(t);
            let why = fence_why.unwrap_or_else(|| "no answer for a session timeout".into());
            self.trace(|| format!("{} fenced: {why}", self.members[m].id));
        }
        let ms = self.members[m].coord.as_ref().expect("membership");
        if ms.joined {
            let (epoch, queues) = (ms.epoch, ms.assignment.clone());
            self.members[m]
                .rb
                .handle_target(t, i64::from(epoch), queues);
        } else if fenced {
            self.members[m].rb.handle_target(t, 0, BTreeSet::new());
        }
        if again {
            self.member_wake(m);
        }
    }

    /// GROUP_HEARTBEAT at the broker.
    pub(super) fn broker_group_heartbeat(
        &mut self,
        conn: u64,
        client_id: &str,
        body: Req,
        out: &mut Outbox,
    ) -> Reply {
        let Req::GroupHeartbeat {
            member_id,
            epoch,
            instance_id,
            owned,
        } = body
        else {
            return Reply::Done;
        };
        let now = self.now;
        let owned: BTreeSet<MessageQueue> = owned.into_iter().collect();
        let adoptable = if epoch == JOIN_EPOCH {
            owned
                .iter()
                .filter(|q| self.broker.locks.owner(GROUP, q, now) == Some(client_id))
                .cloned()
                .collect()
        } else {
            BTreeSet::new()
        };
        let req = HeartbeatRequest {
            group: GROUP.into(),
            member_id,
            member_epoch: epoch,
            instance_id,
            client_id: client_id.to_string(),
            conn_id: conn,
            subscriptions: [TOPIC.to_string()].into(),
            owned,
            adoptable,
            rebalance_timeout_ms: Some(self.cfg.rebalance_timeout_ms),
            // The member's own session (the coordinator's default is Kafka's 45 s, longer
            // than the run): as the client sends it.
            session_timeout_ms: Some(self.cfg.session_timeout_ms),
            assignor: Some(self.cfg.strategy.clone()),
        };
        let Some(c) = self.broker.coordinator.as_mut() else {
            return Reply::Done;
        };
        let r = c.heartbeat(req, now);
        self.broker.coordinator_effects(out);
        Reply::Group(match r {
            Ok(r) => GroupAnswer::Assigned {
                epoch: r.member_epoch,
                queues: r.assignment,
                interval: r.heartbeat_interval_ms,
            },
            Err(e @ (GroupError::FencedMemberEpoch { .. } | GroupError::UnknownMember { .. })) => {
                GroupAnswer::Fenced(e.to_string())
            }
            Err(_) => GroupAnswer::Refused,
        })
    }

    /// The coordinator's invariants (one owner per queue among assigned and revoking sets),
    /// checked after every step of the broker.
    pub(super) fn check_coordinator(&mut self) {
        if let Some(c) = &self.broker.coordinator {
            if let Err(detail) = c.check_invariants() {
                self.violations.push(Violation::Coordinator {
                    at: self.now,
                    detail,
                });
            }
        }
    }

    /// Coordinated runs settle only when the coordinator is reconciled and every live member
    /// owns exactly what it assigned.
    pub(super) fn coordinator_settled(&self) -> bool {
        let Some(c) = &self.broker.coordinator else {
            return true;
        };
        let Some(d) = c.describe(GROUP, self.now) else {
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
                    x.member_id == ms.member_id
                        && x.revoking.is_empty()
                        && x.owned.iter().cloned().collect::<BTreeSet<_>>()
                            == m.rb.owned().into_iter().collect()
                })
            })
    }

    /// Member timers of the membership (the periodic heartbeat).
    pub(super) fn membership_timer(&self, m: usize) -> Option<u64> {
        let ms = self.members[m].coord.as_ref()?;
        (!ms.in_flight).then_some(ms.next_at)
    }

    pub(super) fn on_membership_timer(&mut self, m: usize) {
        let due = self.members[m]
            .coord
            .as_ref()
            .is_some_and(|ms| !ms.in_flight && ms.next_at <= self.now);
        if due {
            self.send_group_heartbeat(m);
        }
    }

    /// A graceful leave after everything was released (GROUP_LEAVE, not permanent).
    pub(super) fn send_group_leave(&mut self, m: usize) {
        let Some(ms) = self.members[m].coord.as_ref() else {
            return;
        };
        let body = Req::GroupLeave {
            member_id: ms.member_id.clone(),
        };
        self.request(m, body, Pending::GroupLeave);
    }

    /// Schedules the broker events a coordinated run needs after a connection closed.
    pub(super) fn coordinator_closed(&mut self, conn: u64, out: &mut Outbox) {
        if let Some(c) = self.broker.coordinator.as_mut() {
            c.connection_closed(conn, self.now);
        }
        self.broker.coordinator_effects(out);
    }

    /// Restarts a member as a new process: killed, and a new one starts at once with the
    /// same instance id (static membership: it takes over the reserved queues, nothing moves).
    pub(super) fn restart(&mut self, m: usize) {
        let instance = self.members[m]
            .coord
            .as_ref()
            .and_then(|c| c.instance_id.clone());
        self.kill(m);
        self.add_member_with(instance);
    }
}
