//! Coordinated mode, client side: the consumer's membership in a group that a Shoal broker
//! coordinates (`shoal_group::coordinator`).
//!
//! One [`Membership`] per clustering consumer whose [`GroupProtocol`] is not `Classic`: the
//! async driver of the sans-IO [`CoordinatedMember`] (`shoal_group::member`, which also runs in
//! the simulator). Its task heartbeats the group's coordinator (GROUP_HEARTBEAT) with the
//! queues the consumer holds, when the coordinator says its assignment changed
//! (GROUP_ASSIGNMENT_CHANGED), after the consumer released queues, and every heartbeat
//! interval otherwise; what the answers mean (assignment, fences, classic mode, a moved
//! coordinator, a session without answers) is the core's to decide.

use crate::instance::ClientInstance;
use parking_lot::Mutex;
use shoal_group::member::{CoordinatedMember, MemberAnswer, MemberConfig};
use shoal_proto::code::response_code as resp;
use shoal_proto::coordinated::{
    request_code as crc, response_code as cresp, GroupHeartbeatRequest, GroupHeartbeatResponse,
    GroupLeaveRequest,
};
use shoal_proto::{MessageQueue, RemotingCommand};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tracing::{debug, info, warn};

pub use shoal_group::member::{Directive, MemberMode, TargetSource};

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

/// What a heartbeat changed, for the consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcome {
    /// The target (assignment or mode) changed: rebalance now.
    pub changed: bool,
    /// Heartbeat again at once (rejoin after a fence).
    pub again: bool,
}

/// The default session timeout of a member: Kafka's.
const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(45);

/// How long a member waits for a new master of its coordinator's broker group (a replicated
/// group in a failover, whose coordinator state the new master takes over) before it picks a
/// coordinator among the broker groups that have a master. Liveness only: an election takes
/// about a second; the member's session (45 s) is far longer.
const MASTERLESS_WAIT_MS: u64 = 10_000;

/// The coordinator's broker group among `groups` (broker name, whether it has a master now),
/// sorted by name: the one at the group name's Java hash modulo their count.
fn choose_coordinator<'a>(group: &str, groups: &'a [(String, bool)]) -> Option<&'a (String, bool)> {
    if groups.is_empty() {
        return None;
    }
    let h = shoal_proto::hash::java_string_hash(group).unsigned_abs() as usize;
    groups.get(h % groups.len())
}

/// The coordinator to heartbeat now: the chosen broker group's master; none while that group
/// has no master, for up to [`MASTERLESS_WAIT_MS`] from `since` (when it was first seen
/// without one; set here), then one among the groups that have a master.
fn coordinator_now(
    group: &str,
    groups: &[(String, bool)],
    masterless: &mut Option<(String, u64)>,
    now_ms: u64,
) -> Option<String> {
    let (name, has_master) = choose_coordinator(group, groups)?;
    if *has_master {
        *masterless = None;
        return Some(name.clone());
    }
    let since = match masterless {
        Some((n, t)) if n == name => *t,
        _ => {
            *masterless = Some((name.clone(), now_ms));
            now_ms
        }
    };
    if now_ms.saturating_sub(since) < MASTERLESS_WAIT_MS {
        return None;
    }
    let with_master: Vec<(String, bool)> = groups.iter().filter(|g| g.1).cloned().collect();
    choose_coordinator(group, &with_master).map(|(n, _)| n.clone())
}

/// A consumer's membership of a coordinated group. See the [module documentation](self).
#[derive(Debug)]
pub struct Membership {
    group: String,
    protocol: GroupProtocol,
    /// The assignor asked for; `None`: the coordinator's default.
    assignor: Option<String>,
    rebalance_timeout_ms: u64,
    core: Mutex<CoordinatedMember>,
    wake: Notify,
    /// The core's clock starts here.
    started: Instant,
    /// Leaves begun: a heartbeat answered after a leave that began while it was in flight
    /// (a held heartbeat, answered when the member left) speaks of the member that left.
    leaves: std::sync::atomic::AtomicU64,
    /// The coordinator's broker group while it has no master, and since when (core clock).
    masterless: Mutex<Option<(String, u64)>>,
}

impl Membership {
    /// A membership of `group`; `member_id` is unique per consumer incarnation.
    pub fn new(
        group: &str,
        member_id: String,
        instance_id: Option<String>,
        protocol: GroupProtocol,
        assignor: Option<&str>,
    ) -> Self {
        let config = MemberConfig {
            group: group.to_string(),
            member_id,
            instance_id,
            session_timeout_ms: DEFAULT_SESSION_TIMEOUT.as_millis() as u64,
            interval_ms: 5_000,
        };
        Self {
            group: group.to_string(),
            protocol,
            assignor: assignor.map(str::to_string),
            rebalance_timeout_ms: 60_000,
            core: Mutex::new(CoordinatedMember::new(config, 0)),
            wake: Notify::new(),
            started: Instant::now(),
            leaves: std::sync::atomic::AtomicU64::new(0),
            masterless: Mutex::new(None),
        }
    }

    /// The consumer's session timeout: sent in every group heartbeat (the coordinator
    /// removes the member after this long without one), and how long the member keeps its
    /// queues without an answer. 45 s (Kafka's default) unless set.
    pub fn with_session_timeout(self, timeout: Duration) -> Self {
        let mut config = self.core.lock().config().clone();
        config.session_timeout_ms = timeout.as_millis() as u64;
        let now = self.now_ms();
        *self.core.lock() = CoordinatedMember::new(config, now);
        self
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The member id.
    pub fn member_id(&self) -> String {
        self.core.lock().config().member_id.clone()
    }

    /// The static instance id, if any.
    pub fn instance_id(&self) -> Option<String> {
        self.core.lock().config().instance_id.clone()
    }

    /// The mode now.
    pub fn mode(&self) -> MemberMode {
        self.core.lock().mode()
    }

    /// The member epoch now.
    pub fn epoch(&self) -> i32 {
        self.core.lock().epoch()
    }

    /// True when the coordinator decides the queues (no classic allocation).
    pub fn decides(&self) -> bool {
        self.core.lock().decides()
    }

    /// What the rebalancer should do now (see [`Directive`]).
    pub fn directive(&self) -> Directive {
        self.core.lock().directive()
    }

    /// The assigned queues of one topic.
    pub fn assignment_of(&self, topic: &str) -> BTreeSet<MessageQueue> {
        self.core.lock().assignment_of(topic)
    }

    /// Heartbeat now (a notice came).
    pub fn wake(&self) {
        let now = self.now_ms();
        self.core.lock().handle_wake(now);
        self.wake.notify_one();
    }

    /// The queues the consumer holds now; a release is reported to the coordinator at once.
    /// `applied_epoch` is the member epoch of the target the rebalancer had applied.
    pub fn report_held(&self, held: Vec<MessageQueue>, applied_epoch: Option<i64>) {
        let now = self.now_ms();
        let due = {
            let mut c = self.core.lock();
            c.handle_held(now, held, applied_epoch);
            c.poll_timeout().is_some_and(|t| t <= now)
        };
        if due {
            self.wake.notify_one();
        }
    }

    /// Waits for a wake-up or the next heartbeat's time.
    pub async fn wait(&self) {
        let now = self.now_ms();
        let due = self.core.lock().poll_timeout();
        let sleep = due.map_or(DEFAULT_SESSION_TIMEOUT, |t| {
            Duration::from_millis(t.saturating_sub(now))
        });
        tokio::select! {
            _ = self.wake.notified() => {}
            _ = tokio::time::sleep(sleep) => {}
        }
    }

    /// The coordinator of the group: a deterministic choice among the broker groups serving
    /// the group's topics (sorted broker names, index by the group name's Java hash), so every
    /// member finds the same one; recomputed from the current routes at every heartbeat. While
    /// the chosen group has no master (a replicated group's failover: its new master takes the
    /// coordinator's state over) there is none, for up to [`MASTERLESS_WAIT_MS`]; then the
    /// choice is made among the groups that have a master.
    pub fn coordinator_addr(&self, instance: &ClientInstance, topics: &[String]) -> Option<String> {
        let mut groups: BTreeMap<String, bool> = BTreeMap::new();
        for t in topics
            .iter()
            .filter(|t| !t.starts_with(shoal_proto::constants::RETRY_GROUP_TOPIC_PREFIX))
        {
            if let Some(r) = instance.cached_route(t) {
                for b in r.broker_datas.iter().filter(|b| !b.broker_addrs.is_empty()) {
                    let has = groups.entry(b.broker_name.clone()).or_default();
                    *has |= b.master_addr().is_some();
                }
            }
        }
        let groups: Vec<(String, bool)> = groups.into_iter().collect();
        let now = self.now_ms();
        let name = coordinator_now(&self.group, &groups, &mut self.masterless.lock(), now)?;
        instance.master_addr(&name)
    }

    /// One heartbeat to the coordinator at `addr` reporting `owned`.
    pub async fn heartbeat(
        &self,
        instance: &ClientInstance,
        addr: &str,
        subscriptions: Vec<String>,
        held: Vec<MessageQueue>,
        applied_epoch: Option<i64>,
    ) -> Outcome {
        let leaves = self.leaves.load(std::sync::atomic::Ordering::Acquire);
        if leaves > 0 {
            // The member left (the consumer shuts down): a heartbeat now would be answered for
            // a member that is gone, and the rebalancer's task may still wake once.
            debug!(group = %self.group, "heartbeat after the member left: not sent");
            return Outcome::default();
        }
        let now = self.now_ms();
        let (moved, sent, member_id, instance_id, last_epoch, owned) = {
            let mut c = self.core.lock();
            c.handle_held(now, held, applied_epoch);
            let moved = c.handle_coordinator(now, addr);
            c.handle_wake(now);
            (
                moved,
                c.poll_heartbeat(now),
                c.config().member_id.clone(),
                c.config().instance_id.clone(),
                c.last_epoch(),
                c.report(),
            )
        };
        if let Some(old) = &moved {
            // The queues stay: the new coordinator adopts what nobody else owns, and their
            // broker locks keep them exclusive meanwhile.
            info!(group = %self.group, from = %old, to = %addr, "the group's coordinator moved: joining the new one with the queues held");
            instance.set_member_stamp(&self.group, None);
        }
        let Some(epoch) = sent else {
            return Outcome::default();
        };
        let mut answer = self
            .exchange(
                instance,
                addr,
                epoch,
                &member_id,
                instance_id,
                last_epoch,
                subscriptions,
                owned,
            )
            .await;
        if self.leaves.load(std::sync::atomic::Ordering::Acquire) != leaves {
            // The member left meanwhile: its coordinator answered for a member that is gone
            // (UNKNOWN_MEMBER_ID), not a fence. Taken as no answer.
            debug!(group = %self.group, "heartbeat answered after the member left: ignored");
            answer = MemberAnswer::NoAnswer;
        }
        let out = self.answered(instance, addr, epoch, answer);
        if let Some(old) = moved {
            // After the join: a dead old coordinator must not delay it.
            self.leave_at(instance, &old, true).await;
        }
        out
    }

    /// Sends one heartbeat and reads its answer (Apache RocketMQ brokers and Shoal brokers
    /// that do not coordinate get no GROUP_HEARTBEAT: the consumer allocates client-side).
    #[allow(clippy::too_many_arguments)]
    async fn exchange(
        &self,
        instance: &ClientInstance,
        addr: &str,
        epoch: i32,
        member_id: &str,
        instance_id: Option<String>,
        last_epoch: Option<i32>,
        subscriptions: Vec<String>,
        owned: Vec<MessageQueue>,
    ) -> MemberAnswer {
        match instance.broker_kind(addr).await {
            Ok(kind) if !kind.has_coordinator() => return MemberAnswer::Unsupported,
            Ok(_) => {}
            Err(e) => {
                debug!(coordinator = %addr, error = %e, "broker features not known");
                return MemberAnswer::NoAnswer;
            }
        }
        let body = GroupHeartbeatRequest {
            assignor: self.assignor.clone(),
            client_id: instance.client_id().to_string(),
            group: self.group.clone(),
            instance_id,
            last_epoch,
            member_epoch: epoch,
            member_id: member_id.to_string(),
            owned,
            rebalance_timeout_ms: Some(self.rebalance_timeout_ms),
            session_timeout_ms: Some(self.core.lock().config().session_timeout_ms),
            subscriptions,
        };
        let req = match RemotingCommand::request(crc::GROUP_HEARTBEAT).with_json_body(&body) {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "group heartbeat could not be encoded");
                return MemberAnswer::NoAnswer;
            }
        };
        let timeout = instance.config().rpc_timeout;
        let r = match instance.invoke(addr, req, timeout).await {
            Ok(r) => r,
            Err(e) => {
                debug!(coordinator = %addr, error = %e, "group heartbeat failed");
                return MemberAnswer::NoAnswer;
            }
        };
        match r.code {
            resp::SUCCESS => match r.decode_json_body::<GroupHeartbeatResponse>() {
                Ok(a) => MemberAnswer::Assigned {
                    epoch: a.member_epoch,
                    queues: a.assignment,
                    interval_ms: a.heartbeat_interval_ms,
                },
                Err(e) => {
                    warn!(error = %e, "group heartbeat answer could not be decoded");
                    MemberAnswer::NoAnswer
                }
            },
            cresp::FENCED_MEMBER_EPOCH | cresp::UNKNOWN_MEMBER_ID => {
                info!(group = %self.group, member = %member_id, code = r.code, remark = ?r.remark, "fenced by the coordinator: dropping every queue and rejoining");
                MemberAnswer::Fenced
            }
            cresp::GROUP_CLASSIC_MODE => MemberAnswer::ClassicMode,
            resp::REQUEST_CODE_NOT_SUPPORTED => MemberAnswer::Unsupported,
            cresp::UNRELEASED_INSTANCE_ID => {
                warn!(group = %self.group, instance = ?self.instance_id(), remark = ?r.remark, "instance id held by a live member; retrying");
                MemberAnswer::NoAnswer
            }
            code => {
                warn!(group = %self.group, code, remark = ?r.remark, "group heartbeat refused");
                MemberAnswer::NoAnswer
            }
        }
    }

    /// Gives an answer to the core; the member stamp follows.
    fn answered(
        &self,
        instance: &ClientInstance,
        addr: &str,
        epoch: i32,
        answer: MemberAnswer,
    ) -> Outcome {
        let now = self.now_ms();
        let mut c = self.core.lock();
        let (mode, fences) = (c.mode(), c.fences());
        let out = c.handle_answer(now, Some(addr), epoch, answer);
        if c.mode() != mode {
            match c.mode() {
                MemberMode::Coordinated => {
                    info!(group = %self.group, member = %c.config().member_id, epoch = c.epoch(), "coordinated mode")
                }
                MemberMode::Classic => {
                    info!(group = %self.group, "the group runs in classic mode (a classic-only member is in it)")
                }
                MemberMode::Unsupported => {
                    info!(group = %self.group, coordinator = %addr, "the broker does not coordinate groups: classic mode")
                }
                MemberMode::Probing => {}
            }
        } else if c.fences() > fences && mode == MemberMode::Coordinated {
            warn!(group = %self.group, member = %c.config().member_id, "fenced by the coordinator: dropping every queue");
        }
        instance.set_member_stamp(&self.group, c.stamp());
        Outcome {
            changed: out.changed,
            again: c.poll_timeout().is_some_and(|t| t <= now),
        }
    }

    /// Leaves the group (after the consumer released its queues).
    pub async fn leave(&self, instance: &ClientInstance, addr: &str) {
        let addr = {
            let c = self.core.lock();
            if c.mode() != MemberMode::Coordinated {
                return;
            }
            c.coordinator().unwrap_or(addr).to_string()
        };
        self.leave_at(instance, &addr, false).await;
    }

    async fn leave_at(&self, instance: &ClientInstance, addr: &str, permanent: bool) {
        if !permanent {
            self.leaves
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        let body = GroupLeaveRequest {
            group: self.group.clone(),
            member_id: self.member_id(),
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
        if !permanent {
            self.core.lock().handle_left();
            instance.set_member_stamp(&self.group, None);
        }
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use super::*;
    use crate::config::ClientConfig;
    use shoal_net::Server;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A coordinator stand-in: the first heartbeat is assigned epoch 1; later ones wait until
    /// the member leaves and are then answered UNKNOWN_MEMBER_ID, as a coordinator answers for
    /// a member that left.
    async fn coordinator(beats: Arc<AtomicUsize>) -> Server {
        let left = Arc::new(tokio::sync::Semaphore::new(0));
        Server::bind(
            "127.0.0.1:0",
            Arc::new(shoal_net::processor_fn(move |_ctx, req| {
                let (beats, left) = (beats.clone(), left.clone());
                async move {
                    let ok = |r: RemotingCommand| Ok(Some(r));
                    match req.code {
                        shoal_proto::ext::request_code::GET_BROKER_FEATURES => {
                            ok(RemotingCommand::response(resp::SUCCESS, None)
                                .with_json_body(&shoal_proto::ext::BrokerFeatures {
                                    features: vec![
                                        shoal_proto::ext::feature::COORDINATOR.to_string()
                                    ],
                                    min_session_timeout_ms: 1_000,
                                    max_session_timeout_ms: 300_000,
                                })
                                .unwrap())
                        }
                        crc::GROUP_HEARTBEAT => {
                            if beats.fetch_add(1, Ordering::SeqCst) == 0 {
                                return ok(RemotingCommand::response(resp::SUCCESS, None)
                                    .with_json_body(&GroupHeartbeatResponse {
                                        member_epoch: 1,
                                        member_id: "m1".into(),
                                        heartbeat_interval_ms: 1,
                                        ..Default::default()
                                    })
                                    .unwrap());
                            }
                            let _ = left.acquire().await.unwrap();
                            ok(RemotingCommand::response(
                                cresp::UNKNOWN_MEMBER_ID,
                                Some("m1 left".into()),
                            ))
                        }
                        crc::GROUP_LEAVE => {
                            left.add_permits(1);
                            ok(RemotingCommand::response(resp::SUCCESS, None))
                        }
                        _ => ok(RemotingCommand::response(resp::SYSTEM_ERROR, None)),
                    }
                }
            })),
        )
        .await
        .unwrap()
    }

    /// A heartbeat in flight when the consumer leaves at shutdown is answered for a member
    /// that is gone: not a fence (no warning, no queues dropped again).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_heartbeat_answered_after_the_member_left_is_not_a_fence() {
        let beats = Arc::new(AtomicUsize::new(0));
        let server = coordinator(beats.clone()).await;
        let addr = server.local_addr().to_string();
        let instance = ClientInstance::start(ClientConfig::new("127.0.0.1:1")).unwrap();
        let m = Arc::new(Membership::new(
            "G",
            "m1".into(),
            None,
            GroupProtocol::Coordinated,
            None,
        ));
        m.heartbeat(&instance, &addr, vec!["T".into()], Vec::new(), None)
            .await;
        assert_eq!(
            m.core.lock().mode(),
            shoal_group::member::MemberMode::Coordinated
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        let in_flight = tokio::spawn({
            let (m, instance, addr) = (m.clone(), instance.clone(), addr.clone());
            async move {
                m.heartbeat(&instance, &addr, vec!["T".into()], Vec::new(), None)
                    .await
            }
        });
        while beats.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        m.leave(&instance, &addr).await;
        in_flight.await.unwrap();
        assert_eq!(
            m.core.lock().fences(),
            0,
            "the answer after the leave is no fence"
        );
        // A heartbeat that starts after the leave is not sent at all.
        let before = beats.load(Ordering::SeqCst);
        m.heartbeat(&instance, &addr, vec!["T".into()], Vec::new(), None)
            .await;
        assert_eq!(
            beats.load(Ordering::SeqCst),
            before,
            "nothing sent after the leave"
        );
        assert_eq!(m.core.lock().fences(), 0);
    }

    /// While the chosen broker group has no master (a failover), members wait for its new
    /// master instead of moving to another group's coordinator and back; only a group
    /// masterless for longer than [`MASTERLESS_WAIT_MS`] gives way to one that has a master.
    #[test]
    fn a_coordinator_without_a_master_is_waited_for_then_replaced() {
        let group = "G";
        let both = vec![
            ("broker-a".to_string(), true),
            ("broker-b".to_string(), true),
        ];
        let chosen = choose_coordinator(group, &both).unwrap().0.clone();
        let other = if chosen == "broker-a" {
            "broker-b"
        } else {
            "broker-a"
        };
        let mut masterless = None;
        assert_eq!(
            coordinator_now(group, &both, &mut masterless, 0),
            Some(chosen.clone())
        );
        // The chosen group's master dies: no coordinator for a while.
        let failing: Vec<(String, bool)> = both
            .iter()
            .map(|(n, _)| (n.clone(), *n != chosen))
            .collect();
        assert_eq!(
            coordinator_now(group, &failing, &mut masterless, 1_000),
            None
        );
        assert_eq!(
            coordinator_now(group, &failing, &mut masterless, 10_999),
            None
        );
        // Its new master registers in time: the same group again.
        assert_eq!(
            coordinator_now(group, &both, &mut masterless, 11_000),
            Some(chosen.clone())
        );
        // Masterless for longer than the wait: another group's master.
        assert_eq!(
            coordinator_now(group, &failing, &mut masterless, 20_000),
            None
        );
        assert_eq!(
            coordinator_now(group, &failing, &mut masterless, 30_000),
            Some(other.to_string())
        );
        assert_eq!(coordinator_now(group, &[], &mut None, 0), None);
    }
}
