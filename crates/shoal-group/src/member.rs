//! A consumer's membership of a group that a Shoal broker coordinates, client side, with no I/O:
//! when to heartbeat the coordinator, what its answers mean for the consumer's target, when the
//! member is fenced, and what happens when the coordinator moves. `shoal-client` drives one per
//! consumer (its task sends the heartbeats); the simulator drives the same type.
//!
//! The member heartbeats the coordinator (GROUP_HEARTBEAT) with the queues it holds, at once
//! when woken ([`CoordinatedMember::handle_wake`]: the coordinator's notice, or a release the
//! coordinator waits for) and every heartbeat interval otherwise
//! ([`CoordinatedMember::poll_timeout`]). The assignment is the consumer's target
//! ([`CoordinatedMember::directive`]); the consumer's rebalancer hands queues over as it always
//! does (stop, commit, unlock), and the coordinator gives a queue to its next owner only once
//! this member reported it released.
//!
//! Mode rules (`docs/rebalance.md`): a broker that does not coordinate answers
//! REQUEST_CODE_NOT_SUPPORTED (`Unsupported`: classic allocation); a group with a classic-only
//! member is answered GROUP_CLASSIC_MODE (the member allocates client-side until the broker
//! says otherwise). Fenced or unknown: drop every queue, rejoin with epoch 0.
//!
//! **No stop of the world when the coordinator goes.** A member that gets no answer keeps its
//! target: it goes on consuming the queues it holds for as long as their broker locks' leases
//! last (the rebalancer fences a queue whose lease runs out), whatever happens to the
//! coordinator, since the lock is what makes its ownership exclusive. When the group's
//! coordinator moves (the routes changed: a broker died, left or joined), the member keeps its
//! queues and joins the new coordinator at once with epoch 0, reporting them; the new
//! coordinator adopts what nobody else owns ([`crate::state::GroupState`]), so a consistent
//! group moves without a revocation. The old coordinator is left (its group empties).

use crate::coordinator::JOIN_EPOCH;
use crate::rebalance::Rebalancer;
use shoal_proto::MessageQueue;
use std::collections::BTreeSet;

/// Heartbeat intervals a coordinator may ask for are clamped to this range, ms.
pub const INTERVAL_RANGE_MS: (u64, u64) = (100, 60_000);

/// Where the membership stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberMode {
    /// No answer from a coordinator yet.
    Probing,
    /// The coordinator assigns the queues.
    Coordinated,
    /// The group runs classic (a classic-only member is in it).
    Classic,
    /// The broker does not coordinate groups.
    Unsupported,
}

/// What the membership tells the consumer's rebalancer: its target source, and how many fences
/// happened so far (each is applied once, see [`Applied`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Directive {
    /// Fences so far ([`Rebalancer::handle_fenced`]).
    pub fences: u64,
    /// Coordinator moves so far ([`Rebalancer::handle_coordinator_moved`]: the new
    /// coordinator's epochs start a new lineage).
    pub moves: u64,
    /// Where the target comes from now.
    pub source: TargetSource,
}

/// Where a consumer's target comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetSource {
    /// No coordinator answered yet: hold nothing (the group may be coordinated).
    Waiting,
    /// The coordinator's assignment at this member epoch.
    Coordinator {
        /// Member epoch.
        epoch: i32,
        /// Assigned queues (every topic).
        queues: BTreeSet<MessageQueue>,
    },
    /// Client-side allocation (classic group, or a broker without coordinated mode).
    Classic,
}

/// The fences of a membership already given to a rebalancer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    fences: u64,
    moves: u64,
}

impl Directive {
    /// Gives the directive to the consumer's rebalancer: new fences (once each), then the
    /// target.
    pub fn apply(&self, rb: &mut Rebalancer, now: u64, applied: &mut Applied) {
        if self.fences > applied.fences {
            applied.fences = self.fences;
            rb.handle_fenced(now);
        }
        if self.moves > applied.moves {
            applied.moves = self.moves;
            rb.handle_coordinator_moved(now);
        }
        match &self.source {
            TargetSource::Waiting => {
                if !rb.is_coordinated() {
                    rb.handle_rejoin(now);
                }
            }
            TargetSource::Coordinator { epoch, queues } => {
                rb.handle_target(now, i64::from(*epoch), queues.clone())
            }
            TargetSource::Classic => rb.handle_classic(now),
        }
    }
}

/// What the coordinator answered a group heartbeat (or that it did not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberAnswer {
    /// The member's epoch, assignment and heartbeat interval.
    Assigned {
        /// Member epoch.
        epoch: i32,
        /// Assigned queues (every topic).
        queues: Vec<MessageQueue>,
        /// Heartbeat interval, ms.
        interval_ms: u64,
    },
    /// FENCED_MEMBER_EPOCH or UNKNOWN_MEMBER_ID: drop everything, rejoin.
    Fenced,
    /// GROUP_CLASSIC_MODE: a classic-only member is in the group.
    ClassicMode,
    /// The broker does not coordinate groups.
    Unsupported,
    /// Another refusal (UNRELEASED_INSTANCE_ID, ...), a lost request or no answer: try again
    /// at the next interval.
    NoAnswer,
}

/// What an answer changed for the consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcome {
    /// The target (assignment or mode) changed: rebalance now.
    pub changed: bool,
}

/// Settings of a [`CoordinatedMember`].
#[derive(Debug, Clone)]
pub struct MemberConfig {
    /// The group.
    pub group: String,
    /// Unique per consumer incarnation.
    pub member_id: String,
    /// A static instance id, if any.
    pub instance_id: Option<String>,
    /// The member's session timeout (sent in every heartbeat; also how long it keeps its
    /// queues without an answer), ms.
    pub session_timeout_ms: u64,
    /// Heartbeat interval until the coordinator names one, ms.
    pub interval_ms: u64,
}

/// What a coordinated member's pulls, commits and lock requests carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberStamp {
    /// The member id.
    pub member_id: String,
    /// Its member epoch.
    pub epoch: i32,
    /// The coordinator that gave the epoch (a broker fences only its own coordinator's).
    pub coordinator: Option<String>,
}

/// The membership. See the [module documentation](self).
#[derive(Debug)]
pub struct CoordinatedMember {
    config: MemberConfig,
    mode: MemberMode,
    epoch: i32,
    assignment: BTreeSet<MessageQueue>,
    /// The coordinator answered once since the last move: requests carry the member stamp.
    stamped: bool,
    last_ok: Option<u64>,
    interval_ms: u64,
    /// The coordinator the membership is with.
    coordinator: Option<String>,
    /// The epoch under the previous coordinator, until the new one answered (its epochs
    /// continue above it).
    last_epoch: Option<i32>,
    fences: u64,
    /// Coordinator moves so far.
    moves: u64,
    in_flight: bool,
    /// Woken while a heartbeat was in flight: heartbeat again after its answer.
    again: bool,
    next_at: u64,
    /// The queues last reported held (a queue leaving it wakes the membership).
    held: Vec<MessageQueue>,
    /// The member epoch of the target the rebalancer had applied when it reported `held`.
    held_epoch: Option<i64>,
}

impl CoordinatedMember {
    /// A membership that heartbeats at once.
    pub fn new(config: MemberConfig, now_ms: u64) -> Self {
        Self {
            interval_ms: config.interval_ms,
            config,
            mode: MemberMode::Probing,
            epoch: JOIN_EPOCH,
            assignment: BTreeSet::new(),
            stamped: false,
            last_ok: None,
            coordinator: None,
            last_epoch: None,
            fences: 0,
            moves: 0,
            in_flight: false,
            again: false,
            next_at: now_ms,
            held: Vec::new(),
            held_epoch: None,
        }
    }

    // ---- reads ----

    /// The settings.
    pub fn config(&self) -> &MemberConfig {
        &self.config
    }

    /// The mode now.
    pub fn mode(&self) -> MemberMode {
        self.mode
    }

    /// The member epoch now.
    pub fn epoch(&self) -> i32 {
        self.epoch
    }

    /// The coordinator the membership is with.
    pub fn coordinator(&self) -> Option<&str> {
        self.coordinator.as_deref()
    }

    /// True when the coordinator decides the queues (no classic allocation).
    pub fn decides(&self) -> bool {
        matches!(self.mode, MemberMode::Coordinated | MemberMode::Probing)
    }

    /// The stamp the member's pulls, commits and locks carry, once a coordinator answered.
    pub fn stamp(&self) -> Option<MemberStamp> {
        self.stamped.then(|| MemberStamp {
            member_id: self.config.member_id.clone(),
            epoch: self.epoch,
            coordinator: self.coordinator.clone(),
        })
    }

    /// What the rebalancer should do now (see [`Directive`]).
    pub fn directive(&self) -> Directive {
        let source = match self.mode {
            MemberMode::Probing => TargetSource::Waiting,
            MemberMode::Coordinated => TargetSource::Coordinator {
                epoch: self.epoch,
                queues: self.assignment.clone(),
            },
            MemberMode::Classic | MemberMode::Unsupported => TargetSource::Classic,
        };
        Directive {
            fences: self.fences,
            moves: self.moves,
            source,
        }
    }

    /// The assigned queues of one topic.
    pub fn assignment_of(&self, topic: &str) -> BTreeSet<MessageQueue> {
        if self.mode != MemberMode::Coordinated {
            return BTreeSet::new();
        }
        self.assignment
            .iter()
            .filter(|q| q.topic == topic)
            .cloned()
            .collect()
    }

    /// The member's epoch under the group's previous coordinator, while it joins a new one.
    pub fn last_epoch(&self) -> Option<i32> {
        self.last_epoch
    }

    /// Fences so far.
    pub fn fences(&self) -> u64 {
        self.fences
    }

    // ---- inputs ----

    /// Heartbeat now (or right after the heartbeat in flight): a notice came, or queues were
    /// released.
    pub fn handle_wake(&mut self, now_ms: u64) {
        if self.in_flight {
            self.again = true;
        } else {
            self.next_at = self.next_at.min(now_ms);
        }
    }

    /// The queues the consumer holds now (every queue it may still deliver or is still
    /// releasing, but none whose unlock is on its way), and the member epoch of the target its
    /// rebalancer had applied then ([`Rebalancer::target_epoch`]). A release wakes the
    /// membership: the coordinator gives a queue to its next owner only once it hears of it.
    pub fn handle_held(
        &mut self,
        now_ms: u64,
        held: Vec<MessageQueue>,
        applied_epoch: Option<i64>,
    ) {
        let released = self.held.iter().any(|q| !held.contains(q));
        self.held = held;
        self.held_epoch = applied_epoch;
        if released && self.mode == MemberMode::Coordinated {
            self.handle_wake(now_ms);
        }
    }

    /// The group's coordinator by the current routes. When it moved away from the one the
    /// membership is with, the member joins the new one at once (epoch 0, reporting the queues
    /// it holds, which it keeps consuming) and the old coordinator's address is returned: leave
    /// it.
    #[must_use]
    pub fn handle_coordinator(&mut self, now_ms: u64, addr: &str) -> Option<String> {
        match self.coordinator.clone() {
            Some(c) if c != addr && self.mode == MemberMode::Coordinated => {
                self.coordinator = Some(addr.to_string());
                if self.epoch != JOIN_EPOCH {
                    self.last_epoch = Some(self.epoch);
                }
                self.epoch = JOIN_EPOCH;
                self.moves += 1;
                // The old coordinator's epoch means nothing to the new one.
                self.stamped = false;
                self.handle_wake(now_ms);
                Some(c)
            }
            _ => None,
        }
    }

    /// The queues a heartbeat names as owned: those held, and while the rebalancer has not
    /// applied the current assignment yet, that assignment too. A queue just assigned may be
    /// locked at any moment; leaving it out would tell the coordinator it was released (it
    /// would give it to another member and fence this one when it names it).
    pub fn report(&self) -> Vec<MessageQueue> {
        let applied = self.held_epoch == Some(i64::from(self.epoch));
        if applied || self.mode != MemberMode::Coordinated {
            return self.held.clone();
        }
        let mut all: BTreeSet<MessageQueue> = self.held.iter().cloned().collect();
        all.extend(self.assignment.iter().cloned());
        all.into_iter().collect()
    }

    /// The heartbeat to send now, if one is due: the member epoch it carries (the held
    /// queues are [`Self::handle_held`]'s). Marks it in flight until [`Self::handle_answer`].
    #[must_use]
    pub fn poll_heartbeat(&mut self, now_ms: u64) -> Option<i32> {
        if self.in_flight || self.next_at > now_ms {
            return None;
        }
        self.in_flight = true;
        self.again = false;
        self.next_at = now_ms.saturating_add(self.interval_ms);
        Some(self.epoch)
    }

    /// When the next heartbeat is due (none while one is in flight).
    #[must_use]
    pub fn poll_timeout(&self) -> Option<u64> {
        (!self.in_flight).then_some(self.next_at)
    }

    /// The answer to the heartbeat sent at `sent_epoch`, from the coordinator at `addr`.
    pub fn handle_answer(
        &mut self,
        now_ms: u64,
        addr: Option<&str>,
        sent_epoch: i32,
        answer: MemberAnswer,
    ) -> Outcome {
        self.in_flight = false;
        let mut again = std::mem::take(&mut self.again);
        let before = (self.mode, self.assignment.clone());
        match answer {
            MemberAnswer::Assigned {
                epoch,
                queues,
                interval_ms,
            } => {
                self.mode = MemberMode::Coordinated;
                self.last_epoch = None;
                if let Some(a) = addr {
                    self.coordinator = Some(a.to_string());
                }
                self.epoch = epoch;
                self.assignment = queues.into_iter().collect();
                self.stamped = true;
                self.last_ok = Some(now_ms);
                self.interval_ms = interval_ms.clamp(INTERVAL_RANGE_MS.0, INTERVAL_RANGE_MS.1);
            }
            MemberAnswer::Fenced => {
                self.epoch = JOIN_EPOCH;
                self.assignment.clear();
                self.fences += 1;
                // Rejoin at once (a join that is fenced waits for the interval).
                again |= sent_epoch != JOIN_EPOCH;
            }
            MemberAnswer::ClassicMode => {
                self.mode = MemberMode::Classic;
                self.epoch = JOIN_EPOCH;
                self.assignment.clear();
                self.stamped = false;
            }
            MemberAnswer::Unsupported => {
                self.mode = MemberMode::Unsupported;
                self.assignment.clear();
                self.stamped = false;
            }
            MemberAnswer::NoAnswer => {
                // The queues stay: their broker locks' leases decide how long they may still
                // be consumed, not the coordinator's silence.
            }
        }
        self.next_at = now_ms.saturating_add(self.interval_ms);
        if again {
            self.next_at = now_ms;
        }
        Outcome {
            changed: before != (self.mode, self.assignment.clone()),
        }
    }

    /// The member left the group (after releasing everything): its requests carry no stamp.
    pub fn handle_left(&mut self) {
        self.stamped = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member() -> CoordinatedMember {
        CoordinatedMember::new(
            MemberConfig {
                group: "G".into(),
                member_id: "m1".into(),
                instance_id: None,
                session_timeout_ms: 3_000,
                interval_ms: 1_000,
            },
            0,
        )
    }

    fn q(i: i32) -> MessageQueue {
        MessageQueue::new("T", "b", i)
    }

    fn assigned(epoch: i32, qs: &[i32]) -> MemberAnswer {
        MemberAnswer::Assigned {
            epoch,
            queues: qs.iter().map(|i| q(*i)).collect(),
            interval_ms: 1_000,
        }
    }

    #[test]
    fn heartbeats_at_once_then_every_interval_and_when_woken() {
        let mut m = member();
        assert_eq!(m.poll_heartbeat(0), Some(0));
        assert_eq!(m.poll_heartbeat(0), None, "one in flight");
        assert!(
            m.handle_answer(5, Some("b1"), 0, assigned(1, &[0, 1]))
                .changed
        );
        assert_eq!(
            m.stamp().map(|s| (s.member_id, s.epoch)),
            Some(("m1".into(), 1))
        );
        assert_eq!(m.poll_timeout(), Some(1_005));
        assert_eq!(m.poll_heartbeat(500), None);
        m.handle_wake(500);
        assert_eq!(m.poll_heartbeat(500), Some(1));
        // A wake while in flight: again right after the answer.
        m.handle_wake(510);
        let _ = m.handle_answer(520, Some("b1"), 1, assigned(1, &[0, 1]));
        assert_eq!(m.poll_timeout(), Some(520));
    }

    #[test]
    fn a_fence_drops_everything_and_rejoins_at_once() {
        let mut m = member();
        let _ = m.poll_heartbeat(0);
        let _ = m.handle_answer(1, Some("b1"), 0, assigned(3, &[0]));
        let _ = m.poll_heartbeat(1_001);
        assert!(
            m.handle_answer(1_002, Some("b1"), 3, MemberAnswer::Fenced)
                .changed
        );
        let d = m.directive();
        assert_eq!(d.fences, 1);
        assert_eq!(
            d.source,
            TargetSource::Coordinator {
                epoch: 0,
                queues: BTreeSet::new()
            }
        );
        assert_eq!(
            m.stamp().map(|s| (s.member_id, s.epoch)),
            Some(("m1".into(), 0))
        );
        assert_eq!(m.poll_heartbeat(1_002), Some(0));
    }

    /// The coordinator's silence takes nothing away: the broker locks' leases decide.
    #[test]
    fn no_answer_keeps_the_queues() {
        let mut m = member();
        let _ = m.poll_heartbeat(0);
        let _ = m.handle_answer(0, Some("b1"), 0, assigned(1, &[0]));
        for t in [1_000, 2_000, 3_000, 10_000] {
            let _ = m.poll_heartbeat(t);
            assert!(!m.handle_answer(t, None, 1, MemberAnswer::NoAnswer).changed);
        }
        assert_eq!(m.directive().fences, 0);
        assert_eq!(m.assignment_of("T").len(), 1);
    }

    /// A moved coordinator is joined at once, the queues kept meanwhile.
    #[test]
    fn a_moved_coordinator_is_joined_at_once_keeping_the_queues() {
        let mut m = member();
        let _ = m.poll_heartbeat(0);
        let _ = m.handle_answer(0, Some("b1"), 0, assigned(2, &[0, 1]));
        m.handle_held(0, vec![q(0), q(1)], Some(2));
        assert_eq!(m.stamp().and_then(|s| s.coordinator).as_deref(), Some("b1"));
        assert_eq!(m.handle_coordinator(10, "b2").as_deref(), Some("b1"));
        assert_eq!(
            m.stamp(),
            None,
            "the old coordinator's epoch is not carried"
        );
        assert_eq!(
            m.directive().source,
            TargetSource::Coordinator {
                epoch: 0,
                queues: [q(0), q(1)].into()
            }
        );
        assert_eq!(m.poll_heartbeat(10), Some(0), "joins the new one at once");
        assert_eq!(m.last_epoch(), Some(2), "and tells it the epoch it had");
        let _ = m.handle_answer(11, Some("b2"), 0, assigned(1, &[0, 1]));
        assert_eq!(m.coordinator(), Some("b2"));
        assert_eq!(m.directive().fences, 0);
        assert_eq!(
            m.directive().moves,
            1,
            "a new lineage of epochs for the rebalancer"
        );
    }

    #[test]
    fn classic_and_unsupported_brokers_mean_client_side_allocation() {
        let mut m = member();
        let _ = m.poll_heartbeat(0);
        let _ = m.handle_answer(0, Some("b1"), 0, MemberAnswer::ClassicMode);
        assert_eq!(m.directive().source, TargetSource::Classic);
        assert!(!m.decides());
        let _ = m.poll_heartbeat(1_000);
        let _ = m.handle_answer(1_000, Some("b1"), 0, MemberAnswer::Unsupported);
        assert_eq!(m.mode(), MemberMode::Unsupported);
    }
}
