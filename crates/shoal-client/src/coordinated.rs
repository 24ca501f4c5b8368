//! Coordinated mode, client side: the consumer's membership in a group that a Shoal broker
//! coordinates (`shoal_group::coordinator`).
//!
//! One [`Membership`] per clustering consumer whose [`GroupProtocol`] is not `Classic`. Its
//! task heartbeats the group's coordinator (GROUP_HEARTBEAT) with the queues the consumer holds,
//! when the coordinator says its assignment changed (GROUP_ASSIGNMENT_CHANGED), after the
//! consumer released queues, and every heartbeat interval otherwise. The assignment is the
//! consumer's target; the consumer's rebalance hands queues over as it always does (stop,
//! commit synchronously, unlock), and the coordinator gives a queue to its next owner only once
//! this member reported it released.
//!
//! Mode rules (`docs/rebalance.md`): against a broker that does not know the requests (Apache
//! RocketMQ answers REQUEST_CODE_NOT_SUPPORTED) `Auto` falls back to classic allocation; a
//! group with a classic-only member is answered GROUP_CLASSIC_MODE and the member allocates
//! client-side until the broker says otherwise. Fenced or unknown: drop every queue, rejoin
//! with epoch 0. No successful heartbeat for a session timeout: drop every queue (the
//! coordinator has given them away by then).

use crate::instance::ClientInstance;
use parking_lot::Mutex;
use shoal_proto::code::response_code as resp;
use shoal_proto::coordinated::{
    request_code as crc, response_code as cresp, GroupHeartbeatRequest, GroupHeartbeatResponse,
    GroupLeaveRequest,
};
use shoal_proto::{MessageQueue, RemotingCommand};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tracing::{debug, info, warn};

/// Which group protocol a consumer speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GroupProtocol {
    /// Coordinated where the broker supports it, classic against RocketMQ brokers and in
    /// groups with classic-only members.
    #[default]
    Auto,
    /// Coordinated; a broker that does not support it is an error at start.
    Coordinated,
    /// RocketMQ's client-side allocation only.
    Classic,
}

impl std::str::FromStr for GroupProtocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "coordinated" => Ok(Self::Coordinated),
            "classic" => Ok(Self::Classic),
            other => Err(format!(
                "unknown group protocol {other:?} (auto, coordinated, classic)"
            )),
        }
    }
}

/// Where the membership stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberMode {
    /// No answer from a coordinator yet.
    Probing,
    /// The coordinator assigns the queues.
    Coordinated,
    /// The group runs classic (a classic-only member is in it).
    Classic,
    /// The broker does not support coordinated mode.
    Unsupported,
}

#[derive(Debug)]
struct State {
    mode: MemberMode,
    epoch: i32,
    assignment: BTreeSet<MessageQueue>,
    last_ok: Option<Instant>,
    interval: Duration,
    /// The coordinator the membership is with.
    coordinator: Option<String>,
    /// The group's coordinator changed (routes changed): leave the old one, drop every queue,
    /// join the new one only once nothing is held, so no queue is consumed twice across
    /// coordinators.
    moving_to: Option<String>,
    /// Fences so far (the coordinator fenced us, or the session ran out): each one drops
    /// every queue at once.
    fences: u64,
    /// Coordinator moves so far: each one releases every queue gracefully.
    rejoins: u64,
}

/// What the membership tells the consumer's rebalancer (`shoal_group::rebalance`): its
/// target source, and how many fences and rejoins happened so far (each is applied once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Directive {
    /// Fences so far ([`shoal_group::rebalance::Rebalancer::handle_fenced`]).
    pub fences: u64,
    /// Rejoins so far ([`shoal_group::rebalance::Rebalancer::handle_rejoin`]).
    pub rejoins: u64,
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

/// What a heartbeat changed, for the consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcome {
    /// The target (assignment or mode) changed: rebalance now.
    pub changed: bool,
    /// Heartbeat again at once (rejoin after a fence).
    pub again: bool,
}

/// A consumer's membership of a coordinated group. See the [module documentation](self).
#[derive(Debug)]
pub struct Membership {
    group: String,
    member_id: String,
    instance_id: Option<String>,
    protocol: GroupProtocol,
    assignor: String,
    session_timeout: Duration,
    rebalance_timeout_ms: u64,
    state: Mutex<State>,
    wake: Notify,
}

impl Membership {
    /// A membership of `group`; `member_id` is unique per consumer incarnation.
    pub fn new(
        group: &str,
        member_id: String,
        instance_id: Option<String>,
        protocol: GroupProtocol,
        assignor: &str,
    ) -> Self {
        Self {
            group: group.to_string(),
            member_id,
            instance_id,
            protocol,
            assignor: assignor.to_string(),
            session_timeout: Duration::from_secs(45),
            rebalance_timeout_ms: 60_000,
            state: Mutex::new(State {
                mode: MemberMode::Probing,
                epoch: 0,
                assignment: BTreeSet::new(),
                last_ok: None,
                interval: Duration::from_secs(5),
                coordinator: None,
                moving_to: None,
                fences: 0,
                rejoins: 0,
            }),
            wake: Notify::new(),
        }
    }

    /// The consumer's session timeout: sent in every group heartbeat (the coordinator
    /// removes the member after this long without one), and how long the member keeps its
    /// queues without an answer. 45 s (Kafka's default) unless set.
    pub fn with_session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// The group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The member id.
    pub fn member_id(&self) -> &str {
        &self.member_id
    }

    /// The static instance id, if any.
    pub fn instance_id(&self) -> Option<&str> {
        self.instance_id.as_deref()
    }

    /// The mode now.
    pub fn mode(&self) -> MemberMode {
        self.state.lock().mode
    }

    /// The member epoch now.
    pub fn epoch(&self) -> i32 {
        self.state.lock().epoch
    }

    /// True when the coordinator decides the queues (no classic allocation).
    pub fn decides(&self) -> bool {
        matches!(self.mode(), MemberMode::Coordinated | MemberMode::Probing)
    }

    /// What the rebalancer should do now (see [`Directive`]).
    pub fn directive(&self) -> Directive {
        let s = self.state.lock();
        let source = match s.mode {
            MemberMode::Probing => TargetSource::Waiting,
            MemberMode::Coordinated if s.moving_to.is_some() => TargetSource::Waiting,
            MemberMode::Coordinated => TargetSource::Coordinator {
                epoch: s.epoch,
                queues: s.assignment.clone(),
            },
            MemberMode::Classic | MemberMode::Unsupported => TargetSource::Classic,
        };
        Directive {
            fences: s.fences,
            rejoins: s.rejoins,
            source,
        }
    }

    /// The assigned queues of one topic.
    pub fn assignment_of(&self, topic: &str) -> BTreeSet<MessageQueue> {
        let s = self.state.lock();
        if s.mode != MemberMode::Coordinated {
            return BTreeSet::new();
        }
        s.assignment
            .iter()
            .filter(|q| q.topic == topic)
            .cloned()
            .collect()
    }

    /// Heartbeat now (a notice came, or queues were released).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Waits for a wake-up or the heartbeat interval.
    pub async fn wait(&self) {
        let interval = self.state.lock().interval;
        tokio::select! {
            _ = self.wake.notified() => {}
            _ = tokio::time::sleep(interval) => {}
        }
    }

    /// The coordinator of the group: a deterministic choice among the masters serving the
    /// group's topics (sorted broker names, index by the group name's Java hash), so every
    /// member finds the same one; recomputed from the current routes at every heartbeat.
    pub fn coordinator_addr(
        instance: &ClientInstance,
        group: &str,
        topics: &[String],
    ) -> Option<String> {
        let mut names: BTreeSet<String> = BTreeSet::new();
        for t in topics
            .iter()
            .filter(|t| !t.starts_with(shoal_proto::constants::RETRY_GROUP_TOPIC_PREFIX))
        {
            if let Some(r) = instance.cached_route(t) {
                for b in &r.broker_datas {
                    if b.master_addr().is_some() {
                        names.insert(b.broker_name.clone());
                    }
                }
            }
        }
        if names.is_empty() {
            return None;
        }
        let names: Vec<String> = names.into_iter().collect();
        let h = shoal_proto::hash::java_string_hash(group).unsigned_abs() as usize;
        let name = names.get(h % names.len())?;
        instance.master_addr(name)
    }

    /// One heartbeat to the coordinator at `addr` reporting `owned`.
    pub async fn heartbeat(
        &self,
        instance: &ClientInstance,
        addr: &str,
        subscriptions: Vec<String>,
        owned: Vec<MessageQueue>,
    ) -> Outcome {
        let old = {
            let mut s = self.state.lock();
            match s.coordinator.clone() {
                Some(c) if c != addr && s.mode == MemberMode::Coordinated => {
                    info!(group = %self.group, from = %c, to = %addr, "the group's coordinator moved: dropping every queue, then joining the new one");
                    s.moving_to = Some(addr.to_string());
                    s.coordinator = None;
                    s.assignment.clear();
                    s.epoch = 0;
                    s.rejoins += 1;
                    instance.set_member_stamp(&self.group, None);
                    Some(c)
                }
                _ => None,
            }
        };
        if let Some(c) = old {
            self.leave_at(instance, &c, true).await;
            return Outcome {
                changed: true,
                again: false,
            };
        }
        if self.state.lock().moving_to.is_some() {
            if !owned.is_empty() {
                // Still releasing; the release wakes us again.
                return Outcome::default();
            }
            self.state.lock().moving_to = None;
        }
        // Coordinated only with a broker that lists `coordinator` (GET_BROKER_FEATURES, asked
        // once per address): Apache RocketMQ brokers and Shoal brokers that do not coordinate
        // get no GROUP_HEARTBEAT, the consumer allocates client-side.
        match instance.broker_kind(addr).await {
            Ok(kind) if !kind.has_coordinator() => {
                let mut s = self.state.lock();
                let before = (s.mode, s.assignment.clone());
                self.unsupported(&mut s, instance, addr);
                return Outcome {
                    changed: before != (s.mode, s.assignment.clone()),
                    again: false,
                };
            }
            Ok(_) => {}
            Err(e) => {
                debug!(coordinator = %addr, error = %e, "broker features not known");
                return self.check_session(instance);
            }
        }
        let epoch = self.epoch();
        let body = GroupHeartbeatRequest {
            assignor: Some(self.assignor.clone()),
            client_id: instance.client_id().to_string(),
            group: self.group.clone(),
            instance_id: self.instance_id.clone(),
            member_epoch: epoch,
            member_id: self.member_id.clone(),
            owned,
            rebalance_timeout_ms: Some(self.rebalance_timeout_ms),
            session_timeout_ms: Some(self.session_timeout.as_millis() as u64),
            subscriptions,
        };
        let req = match RemotingCommand::request(crc::GROUP_HEARTBEAT).with_json_body(&body) {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "group heartbeat could not be encoded");
                return Outcome::default();
            }
        };
        let timeout = instance.config().rpc_timeout;
        let r = match instance.invoke(addr, req, timeout).await {
            Ok(r) => r,
            Err(e) => {
                debug!(coordinator = %addr, error = %e, "group heartbeat failed");
                return self.check_session(instance);
            }
        };
        let mut s = self.state.lock();
        let before = (s.mode, s.assignment.clone());
        let mut again = false;
        match r.code {
            resp::SUCCESS => match r.decode_json_body::<GroupHeartbeatResponse>() {
                Ok(a) => {
                    if s.mode != MemberMode::Coordinated {
                        info!(group = %self.group, member = %self.member_id, epoch = a.member_epoch, "coordinated mode");
                    }
                    s.mode = MemberMode::Coordinated;
                    s.coordinator = Some(addr.to_string());
                    s.epoch = a.member_epoch;
                    s.assignment = a.assignment.into_iter().collect();
                    s.last_ok = Some(Instant::now());
                    s.interval = Duration::from_millis(a.heartbeat_interval_ms.clamp(100, 60_000));
                    instance.set_member_stamp(&self.group, Some((self.member_id.clone(), s.epoch)));
                }
                Err(e) => warn!(error = %e, "group heartbeat answer could not be decoded"),
            },
            cresp::FENCED_MEMBER_EPOCH | cresp::UNKNOWN_MEMBER_ID => {
                info!(group = %self.group, member = %self.member_id, code = r.code, remark = ?r.remark, "fenced by the coordinator: dropping every queue and rejoining");
                s.epoch = 0;
                s.assignment.clear();
                s.fences += 1;
                instance.set_member_stamp(&self.group, Some((self.member_id.clone(), 0)));
                again = epoch != 0;
            }
            cresp::GROUP_CLASSIC_MODE => {
                if s.mode != MemberMode::Classic {
                    info!(group = %self.group, "the group runs in classic mode (a classic-only member is in it)");
                }
                s.mode = MemberMode::Classic;
                s.epoch = 0;
                s.assignment.clear();
                instance.set_member_stamp(&self.group, None);
            }
            resp::REQUEST_CODE_NOT_SUPPORTED => self.unsupported(&mut s, instance, addr),
            cresp::UNRELEASED_INSTANCE_ID => {
                warn!(group = %self.group, instance = ?self.instance_id, remark = ?r.remark, "instance id held by a live member; retrying");
                drop(s);
                return self.check_session(instance);
            }
            code => {
                warn!(group = %self.group, code, remark = ?r.remark, "group heartbeat refused");
                drop(s);
                return self.check_session(instance);
            }
        }
        Outcome {
            changed: before != (s.mode, s.assignment.clone()),
            again,
        }
    }

    /// The broker does not coordinate groups: classic allocation.
    fn unsupported(&self, s: &mut State, instance: &ClientInstance, addr: &str) {
        if s.mode != MemberMode::Unsupported {
            info!(group = %self.group, coordinator = %addr, "the broker does not coordinate groups: classic mode");
        }
        s.mode = MemberMode::Unsupported;
        s.assignment.clear();
        instance.set_member_stamp(&self.group, None);
    }

    /// No successful heartbeat within the session timeout: the coordinator has given our
    /// queues away; drop them (the lease of coordinated mode).
    fn check_session(&self, instance: &ClientInstance) -> Outcome {
        let mut s = self.state.lock();
        let expired = s.mode == MemberMode::Coordinated
            && s.last_ok
                .is_some_and(|t| t.elapsed() >= self.session_timeout);
        if expired && !s.assignment.is_empty() {
            warn!(group = %self.group, member = %self.member_id, "no heartbeat answer within the session timeout: dropping every queue");
            s.assignment.clear();
            s.epoch = 0;
            s.fences += 1;
            instance.set_member_stamp(&self.group, Some((self.member_id.clone(), 0)));
            return Outcome {
                changed: true,
                again: false,
            };
        }
        Outcome::default()
    }

    /// Leaves the group (after the consumer released its queues).
    pub async fn leave(&self, instance: &ClientInstance, addr: &str) {
        if self.mode() != MemberMode::Coordinated {
            return;
        }
        let addr = self
            .state
            .lock()
            .coordinator
            .clone()
            .unwrap_or_else(|| addr.to_string());
        self.leave_at(instance, &addr, false).await;
    }

    async fn leave_at(&self, instance: &ClientInstance, addr: &str, permanent: bool) {
        let body = GroupLeaveRequest {
            group: self.group.clone(),
            member_id: self.member_id.clone(),
            permanent,
        };
        let Ok(req) = RemotingCommand::request(crc::GROUP_LEAVE).with_json_body(&body) else {
            return;
        };
        if let Err(e) = instance
            .invoke(addr, req, instance.config().rpc_timeout)
            .await
        {
            debug!(error = %e, "group leave failed");
        }
        instance.set_member_stamp(&self.group, None);
    }

    /// The protocol asked for.
    pub fn protocol(&self) -> GroupProtocol {
        self.protocol
    }
}

/// A member id unique per consumer incarnation: the client id, the process start and a
/// counter.
pub fn new_member_id(client_id: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{client_id}#{}-{n}", crate::now_ms_u64())
}

/// Shared handle used by the consumer.
pub type SharedMembership = Arc<Membership>;
