//! The seeded simulator of `shoal-group` (`shoal_group::sim`) on this broker's own request
//! handlers: [`RealBroker`] is a [`BrokerModel`] whose requests go through the handlers that
//! serve clients (HEART_BEAT, LOCK_BATCH_MQ and UNLOCK_BATCH_MQ, QUERY_CONSUMER_OFFSET,
//! UPDATE_CONSUMER_OFFSET, PULL_MESSAGE, SEND_MESSAGE_V2, UNREGISTER_CLIENT, GROUP_HEARTBEAT,
//! GROUP_LEAVE, UPDATE_AND_CREATE_TOPIC, GET_CONSUMER_LIST_BY_GROUP), on the simulator's
//! virtual time (a manual clock), with no socket: the store is a real one in a temporary
//! directory, notices to clients are recorded instead of sent.
//!
//! `cargo test -p shoal-broker --lib harness` runs `SHOAL_SIM_BROKER_SCHEDULES` classic and
//! coordinated schedules (default 40 each); a failing seed replays with
//! `SHOAL_SIM_SEED=N SHOAL_SIM_MODE=classic|coordinated|graceful cargo test -p shoal-broker
//! --lib harness::replay -- --nocapture`.

use crate::broker::{assemble, Assembly};
use crate::caller::Caller;
use crate::clock::BrokerClock;
use crate::config::BrokerConfig;
use crate::connections::NoticeSink;
use crate::reply::Handled;
use crate::shared::Shared;
use parking_lot::Mutex;
use shoal_group::coordinator::GroupDescription;
use shoal_group::rebalance::StartOffset;
use shoal_group::sim::{
    coordinator_config, mq, Answer, BrokerModel, GroupAnswer, MemberListNotice, Outbox, Reply, Req,
    SimConfig, BROKER, GROUP, PULL_BATCH, TOPIC,
};
use shoal_proto::body::{
    ConsumeFromWhere, ConsumeType, ConsumerData, GetConsumerListByGroupResponseBody, HeartbeatData,
    LockBatchRequestBody, LockBatchResponseBody, MessageModel, SubscriptionData,
    UnlockBatchRequestBody,
};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::coordinated::{
    request_code as crc, response_code as cresp, GroupHeartbeatRequest, GroupHeartbeatResponse,
    GroupLeaveRequest,
};
use shoal_proto::ext::{self, field, ConsumerIdsNotice, LockFreedBody};
use shoal_proto::header::{
    GetConsumerListByGroupRequestHeader, PullMessageRequestHeader,
    QueryConsumerOffsetRequestHeader, SendMessageRequestHeader, SendMessageRequestHeaderV2,
    UnregisterClientRequestHeader, UpdateConsumerOffsetRequestHeader,
};
use shoal_proto::message::{decode_records, DecodeOptions};
use shoal_proto::{MessageQueue, RemotingCommand};
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Notices the broker sends, kept for the simulator to deliver.
#[derive(Debug, Default)]
struct Recorded(Mutex<Vec<(u64, RemotingCommand)>>);

impl NoticeSink for Recorded {
    fn notify(&self, conn_id: u64, req: RemotingCommand) -> bool {
        self.0.lock().push((conn_id, req));
        true
    }
}

/// The connection the simulated producer sends on.
const PRODUCER_CONN: u64 = u64::MAX;

/// See the [module documentation](self).
#[derive(Debug)]
pub(crate) struct RealBroker {
    shared: Arc<Shared>,
    elapsed: Arc<AtomicU64>,
    notices: Arc<Recorded>,
    rt: tokio::runtime::Runtime,
    extensions: bool,
    coordinated: bool,
    session_timeout_ms: u64,
    rebalance_timeout_ms: u64,
    assignor: String,
    _dir: tempfile::TempDir,
}

fn peer() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 1))
}

impl RealBroker {
    /// A broker with `queues` queues of the simulated topic, for a run of `cfg`.
    pub(crate) fn new(queues: i32, cfg: &SimConfig) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut config = BrokerConfig {
            data_dir: dir.path().to_path_buf(),
            broker_name: BROKER.into(),
            namesrv_addrs: Vec::new(),
            announce_addr: Some(peer().to_string()),
            commit_log_segment_bytes: 16 * 1024 * 1024,
            ..BrokerConfig::default()
        };
        config.coordinator =
            coordinator_config(cfg.heartbeat_ms, cfg.rebalance_timeout_ms, &cfg.strategy);
        config.min_session_timeout_ms = 1;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        let (store, _) = rt
            .block_on(crate::broker::open_store(&config))
            .expect("the store opens");
        let elapsed = Arc::new(AtomicU64::new(0));
        let notices = Arc::new(Recorded::default());
        let delay_levels_ms = crate::config::parse_delay_levels(&config.delay_levels)
            .expect("the default delay levels");
        let shared = assemble(Assembly {
            config,
            store,
            delay_levels_ms,
            net_stats: Arc::new(shoal_net::NetStats::default()),
            namesrv_tls: None,
            clock: BrokerClock::manual(1_000_000, elapsed.clone()),
            sink: Some(notices.clone()),
        })
        .expect("the broker assembles");
        let mut b = Self {
            shared,
            elapsed,
            notices,
            rt,
            extensions: cfg.extensions,
            coordinated: cfg.coordinated,
            session_timeout_ms: cfg.session_timeout_ms,
            rebalance_timeout_ms: cfg.rebalance_timeout_ms,
            assignor: cfg.strategy.clone(),
            _dir: dir,
        };
        b.set_queues(0, queues);
        b
    }

    fn at(&self, now: u64) {
        self.elapsed.store(now, Ordering::Relaxed);
    }

    fn run<F: Future<Output = Handled>>(&self, f: F) -> RemotingCommand {
        answer(self.rt.block_on(f))
    }

    /// UPDATE_AND_CREATE_TOPIC with `queues` read and write queues.
    fn set_queues(&mut self, now: u64, queues: i32) {
        self.at(now);
        let h = shoal_proto::header::CreateTopicRequestHeader {
            topic: TOPIC.into(),
            default_topic: "TBW102".into(),
            read_queue_nums: queues,
            write_queue_nums: queues,
            perm: 6,
            topic_filter_type: "SINGLE_TAG".into(),
            ..Default::default()
        };
        let req = RemotingCommand::request_with_header(rc::UPDATE_AND_CREATE_TOPIC, &h);
        let r = self.run(crate::admin::create_topic(&self.shared, &req));
        assert_eq!(r.code, resp::SUCCESS, "topic update: {:?}", r.remark);
    }

    /// Notices the handlers sent, as the simulated network carries them.
    fn drain(&self, out: &mut Outbox) {
        for (conn, n) in std::mem::take(&mut *self.notices.0.lock()) {
            match n.code {
                rc::NOTIFY_CONSUMER_IDS_CHANGED => {
                    let list = n
                        .body
                        .as_ref()
                        .filter(|_| self.extensions)
                        .and_then(|_| n.decode_json_body::<ConsumerIdsNotice>().ok())
                        .map(|l| MemberListNotice {
                            version: l.version,
                            client_ids: l.consumer_id_list,
                        });
                    out.notify.push((conn, list));
                }
                ext::request_code::NOTIFY_LOCK_FREED => {
                    if let Ok(b) = n.decode_json_body::<LockFreedBody>() {
                        out.freed.push((conn, b.mq_set));
                    }
                }
                crc::GROUP_ASSIGNMENT_CHANGED => out.assign.push(conn),
                _ => {}
            }
        }
    }

    fn heartbeat(&self, conn: u64, client_id: &str, session_timeout_ms: Option<u64>) -> Reply {
        let data = HeartbeatData {
            client_id: client_id.to_string(),
            consumer_data_set: vec![ConsumerData {
                group_name: GROUP.into(),
                consume_type: ConsumeType::ConsumePassively,
                message_model: MessageModel::Clustering,
                consume_from_where: ConsumeFromWhere::ConsumeFromFirstOffset,
                subscription_data_set: vec![SubscriptionData::from_tag_expression(TOPIC, "*", 1)],
                unit_mode: false,
            }],
            ..Default::default()
        };
        let mut req = RemotingCommand::request(rc::HEART_BEAT)
            .with_json_body(&data)
            .expect("a heartbeat body");
        let e = req.ext_fields.get_or_insert_with(Default::default);
        if let Some(ms) = session_timeout_ms {
            e.insert(field::SESSION_TIMEOUT_MS, ms.to_string());
        }
        if self.coordinated {
            e.insert("shoalCoordinatedGroups", GROUP);
        }
        let caller = Caller::detached(conn, peer());
        let r = answer(crate::client::heartbeat(
            &self.shared.group_ctx(),
            &caller,
            &req,
        ));
        let session = r
            .ext(field::SESSIONS)
            .map(ext::decode_sessions)
            .and_then(|s| s.into_iter().find(|(g, _)| g == GROUP).map(|(_, s)| s));
        Reply::Heartbeat(session.unwrap_or(0))
    }

    fn view(&self) -> Reply {
        let req = RemotingCommand::request_with_header(
            rc::GET_CONSUMER_LIST_BY_GROUP,
            &GetConsumerListByGroupRequestHeader {
                consumer_group: GROUP.into(),
                ..Default::default()
            },
        );
        let r = answer(crate::client::consumer_list(&self.shared.group_ctx(), &req));
        let ids = r
            .decode_json_body::<GetConsumerListByGroupResponseBody>()
            .map(|b| b.consumer_id_list)
            .unwrap_or_default();
        Reply::View(self.queues(), ids)
    }

    fn lock(
        &self,
        conn: u64,
        client_id: &str,
        queues: &[MessageQueue],
        stamp: Option<&(String, i32)>,
    ) -> Reply {
        let body = LockBatchRequestBody {
            consumer_group: GROUP.into(),
            client_id: client_id.to_string(),
            mq_set: queues.to_vec(),
            ..Default::default()
        };
        let mut req = RemotingCommand::request(rc::LOCK_BATCH_MQ)
            .with_json_body(&body)
            .expect("a lock body");
        let e = req.ext_fields.get_or_insert_with(Default::default);
        e.insert(field::LEASE, "true");
        if self.extensions {
            e.insert(field::WANT_OFFSETS, "true");
        }
        stamped(&mut req, stamp);
        let caller = Caller::detached(conn, peer());
        let r = answer(crate::lease::lock_batch(
            &self.shared.group_ctx(),
            &caller,
            &req,
        ));
        if is_fenced(&r) {
            return Reply::Fenced;
        }
        let granted = r
            .decode_json_body::<LockBatchResponseBody>()
            .map(|b| b.lock_ok_mq_set)
            .unwrap_or_default();
        let session = r.ext(field::SESSION).and_then(|s| s.parse().ok());
        let committed: BTreeMap<MessageQueue, i64> = r
            .ext(field::COMMITTED_OFFSETS)
            .map(ext::decode_queue_offsets)
            .unwrap_or_default()
            .into_iter()
            .map(|(t, q, o)| (MessageQueue::new(t, BROKER, q), o))
            .collect();
        Reply::Lock(granted, session, committed)
    }

    fn unlock(
        &self,
        conn: u64,
        client_id: &str,
        queues: &[MessageQueue],
        commit: Option<i64>,
        stamp: Option<&(String, i32)>,
    ) -> Reply {
        let body = UnlockBatchRequestBody {
            consumer_group: GROUP.into(),
            client_id: client_id.to_string(),
            mq_set: queues.to_vec(),
            ..Default::default()
        };
        let mut req = RemotingCommand::request(rc::UNLOCK_BATCH_MQ)
            .with_json_body(&body)
            .expect("an unlock body");
        if let (Some(o), Some(q)) = (commit, queues.first()) {
            req.ext_fields.get_or_insert_with(Default::default).insert(
                field::COMMIT,
                ext::encode_queue_offsets([(q.topic.as_str(), q.queue_id, o)]),
            );
        }
        stamped(&mut req, stamp);
        let _ = answer(crate::lease::unlock_batch(
            &self.shared.group_ctx(),
            conn,
            &req,
        ));
        Reply::Unlocked
    }

    fn query_offset(&self, q: &MessageQueue) -> Reply {
        let req = RemotingCommand::request_with_header(
            rc::QUERY_CONSUMER_OFFSET,
            &QueryConsumerOffsetRequestHeader {
                consumer_group: GROUP.into(),
                topic: TOPIC.into(),
                queue_id: q.queue_id,
                set_zero_if_not_found: Some(false),
                ..Default::default()
            },
        );
        let r = answer(crate::offsets::query_consumer_offset(&self.shared, &req));
        if r.code != resp::SUCCESS {
            return Reply::Offset(StartOffset::Resolved(0));
        }
        let h: shoal_proto::header::QueryConsumerOffsetResponseHeader =
            r.decode_command_header().expect("an offset header");
        Reply::Offset(StartOffset::Committed(h.offset))
    }

    fn commit_offset(
        &self,
        conn: u64,
        q: &MessageQueue,
        offset: i64,
        stamp: Option<&(String, i32)>,
    ) -> Reply {
        let mut req = RemotingCommand::request_with_header(
            rc::UPDATE_CONSUMER_OFFSET,
            &UpdateConsumerOffsetRequestHeader {
                consumer_group: GROUP.into(),
                topic: TOPIC.into(),
                queue_id: q.queue_id,
                commit_offset: offset,
                ..Default::default()
            },
        );
        stamped(&mut req, stamp);
        let caller = Caller::detached(conn, peer());
        let r = self.run(crate::offsets::update_consumer_offset(
            &self.shared,
            &caller,
            &req,
        ));
        if is_fenced(&r) {
            return Reply::Fenced;
        }
        Reply::Committed(r.code == resp::SUCCESS)
    }

    fn pull(
        &self,
        conn: u64,
        q: &MessageQueue,
        offset: i64,
        stamp: Option<&(String, i32)>,
    ) -> Answer {
        let mut req = RemotingCommand::request_with_header(
            rc::PULL_MESSAGE,
            &PullMessageRequestHeader {
                consumer_group: GROUP.into(),
                topic: TOPIC.into(),
                queue_id: q.queue_id,
                queue_offset: offset,
                max_msg_nums: PULL_BATCH as i32,
                sys_flag: shoal_proto::constants::pull_sys_flag::SUSPEND
                    | shoal_proto::constants::pull_sys_flag::SUBSCRIPTION,
                suspend_timeout_millis: 500,
                subscription: Some("*".into()),
                expression_type: Some("TAG".into()),
                ..Default::default()
            },
        );
        stamped(&mut req, stamp);
        let caller = Caller::detached(conn, peer());
        let b = &self.shared;
        let now = crate::pull::prepare(b, &caller, &req).and_then(|plan| {
            if b.tables_dirty() {
                b.persist_tables_now()
                    .map_err(crate::reply::Reject::system)?;
            }
            crate::pull::pull_now(b, &caller, &req, plan)
        });
        match now {
            Ok(crate::pull::PullNow::Hold(..)) => Answer::Hold,
            Ok(crate::pull::PullNow::Answer(r)) => Answer::Reply(Reply::Pull(queue_offsets(&r))),
            Err(r) if fenced_code(r.code) => Answer::Reply(Reply::Fenced),
            Err(_) => Answer::Reply(Reply::Pull(Vec::new())),
        }
    }

    fn group_heartbeat(&self, conn: u64, client_id: &str, req: &Req) -> Reply {
        let Req::GroupHeartbeat {
            member_id,
            epoch,
            instance_id,
            owned,
        } = req
        else {
            return Reply::Done;
        };
        let body = GroupHeartbeatRequest {
            assignor: Some(self.assignor.clone()),
            client_id: client_id.to_string(),
            group: GROUP.into(),
            instance_id: instance_id.clone(),
            last_epoch: None,
            member_epoch: *epoch,
            member_id: member_id.clone(),
            owned: owned.clone(),
            rebalance_timeout_ms: Some(self.rebalance_timeout_ms),
            session_timeout_ms: Some(self.session_timeout_ms),
            subscriptions: vec![TOPIC.into()],
        };
        let req = RemotingCommand::request(crc::GROUP_HEARTBEAT)
            .with_json_body(&body)
            .expect("a group heartbeat body");
        let caller = Caller::detached(conn, peer());
        let cx = self.shared.group_ctx();
        let r = self.run(crate::coordinated::heartbeat(&cx, &caller, &req));
        Reply::Group(match r.code {
            resp::SUCCESS => match r.decode_json_body::<GroupHeartbeatResponse>() {
                Ok(a) => GroupAnswer::Assigned {
                    epoch: a.member_epoch,
                    queues: a.assignment,
                    interval: a.heartbeat_interval_ms,
                },
                Err(_) => GroupAnswer::Refused,
            },
            cresp::FENCED_MEMBER_EPOCH | cresp::UNKNOWN_MEMBER_ID => {
                GroupAnswer::Fenced(r.remark.unwrap_or_default())
            }
            _ => GroupAnswer::Refused,
        })
    }

    fn group_leave(&self, member_id: &str) -> Reply {
        let req = RemotingCommand::request(crc::GROUP_LEAVE)
            .with_json_body(&GroupLeaveRequest {
                group: GROUP.into(),
                member_id: member_id.to_string(),
                permanent: false,
            })
            .expect("a leave body");
        let _ = answer(crate::coordinated::leave(&self.shared.group_ctx(), &req));
        Reply::Done
    }

    fn unregister(&self, conn: u64, client_id: &str) -> Reply {
        let req = RemotingCommand::request_with_header(
            rc::UNREGISTER_CLIENT,
            &UnregisterClientRequestHeader {
                client_id: client_id.to_string(),
                consumer_group: Some(GROUP.into()),
                ..Default::default()
            },
        );
        let caller = Caller::detached(conn, peer());
        let _ = answer(crate::client::unregister_client(
            &self.shared.group_ctx(),
            &caller,
            &req,
        ));
        Reply::Done
    }
}

/// A handler's outcome as the client would read it.
fn answer(h: Handled) -> RemotingCommand {
    match h {
        Ok(Some(r)) => r,
        Ok(None) => RemotingCommand::response(resp::SUCCESS, None),
        Err(r) => RemotingCommand::response(r.code, Some(r.remark)),
    }
}

fn fenced_code(code: i32) -> bool {
    matches!(
        code,
        cresp::FENCED_MEMBER_EPOCH | cresp::UNKNOWN_MEMBER_ID | cresp::QUEUE_NOT_ASSIGNED
    )
}

/// Refused by the member-epoch fence.
fn is_fenced(r: &RemotingCommand) -> bool {
    fenced_code(r.code)
}

/// A coordinated member's stamp on a request.
fn stamped(req: &mut RemotingCommand, stamp: Option<&(String, i32)>) {
    if let Some((member, epoch)) = stamp {
        shoal_proto::coordinated::stamp(req, member, *epoch);
    }
}

/// Queue offsets of the messages of a pull answer.
fn queue_offsets(r: &RemotingCommand) -> Vec<i64> {
    if r.code != resp::SUCCESS {
        return Vec::new();
    }
    let Some(body) = &r.body else {
        return Vec::new();
    };
    decode_records(body, &DecodeOptions::default())
        .messages
        .iter()
        .map(|m| m.queue_offset)
        .collect()
}

impl BrokerModel for RealBroker {
    fn handle(
        &mut self,
        now: u64,
        conn: u64,
        client_id: &str,
        req: &Req,
        stamp: Option<&(String, i32)>,
        out: &mut Outbox,
    ) -> Answer {
        self.at(now);
        let reply = match req {
            Req::Heartbeat { session_timeout_ms } => {
                self.heartbeat(conn, client_id, *session_timeout_ms)
            }
            Req::View => self.view(),
            Req::Lock(queues) => self.lock(conn, client_id, queues, stamp),
            Req::Unlock(queues) => self.unlock(conn, client_id, queues, None, stamp),
            Req::CommitUnlock(q, o) => {
                self.unlock(conn, client_id, std::slice::from_ref(q), Some(*o), stamp)
            }
            Req::QueryOffset(q) => self.query_offset(q),
            Req::Commit(q, o) => self.commit_offset(conn, q, *o, stamp),
            Req::Pull(q, offset) => {
                let a = self.pull(conn, q, *offset, stamp);
                self.drain(out);
                return a;
            }
            Req::Unregister => self.unregister(conn, client_id),
            Req::GroupHeartbeat { .. } => self.group_heartbeat(conn, client_id, req),
            Req::GroupLeave { member_id } => self.group_leave(member_id),
        };
        self.drain(out);
        Answer::Reply(reply)
    }

    fn committed_offset(&self, queue: &MessageQueue) -> Option<i64> {
        self.shared.store.query_offset(GROUP, TOPIC, queue.queue_id)
    }

    fn connection_closed(&mut self, now: u64, conn: u64, out: &mut Outbox) {
        self.at(now);
        self.shared.connection_closed(conn);
        self.drain(out);
    }

    fn tick(&mut self, now: u64, out: &mut Outbox) {
        self.at(now);
        self.shared.group_timers();
        self.drain(out);
    }

    fn produce(&mut self, now: u64, queue: i32) {
        self.at(now);
        let h = SendMessageRequestHeader {
            producer_group: "PG".into(),
            topic: TOPIC.into(),
            default_topic: "TBW102".into(),
            default_topic_queue_nums: 4,
            queue_id: queue,
            born_timestamp: 1_700_000_000_000,
            properties: Some(String::new()),
            ..Default::default()
        };
        let req = RemotingCommand::request_with_header(
            rc::SEND_MESSAGE_V2,
            &SendMessageRequestHeaderV2::from(h),
        )
        .with_body(bytes::Bytes::from_static(b"m"));
        let caller = Caller::detached(PRODUCER_CONN, peer());
        let r = self.run(crate::send::send_message(&self.shared, &caller, &req));
        assert_eq!(r.code, resp::SUCCESS, "send: {:?}", r.remark);
    }

    fn add_queues(&mut self, now: u64, more: i32, out: &mut Outbox) {
        let n = self.queues().len() as i32;
        self.set_queues(now, n + more);
        self.drain(out);
    }

    fn queues(&self) -> Vec<MessageQueue> {
        let n = self
            .shared
            .topics
            .read(TOPIC, |c| c.map_or(0, |c| c.read_queue_nums));
        (0..n).map(mq).collect()
    }

    fn max_offset(&self, queue: &MessageQueue) -> i64 {
        self.shared.store.max_offset(TOPIC, queue.queue_id) as i64
    }

    fn read(&mut self, queue: &MessageQueue, offset: i64, max: i64) -> Vec<i64> {
        let end = self.max_offset(queue);
        (offset.max(0)..end.min(offset.max(0) + max)).collect()
    }

    fn check_coordinator(&self) -> Result<(), String> {
        self.shared
            .groups
            .read(|g, _| g.coordinator().check_invariants())
    }

    fn describe_group(&self, _now: u64) -> Option<GroupDescription> {
        self.shared
            .groups
            .read(|g, now| g.coordinator().describe(GROUP, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_group::sim::{run_on, SimReport};

    fn env_u64(name: &str, default: u64) -> u64 {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    fn on_real_broker(cfg: &SimConfig) -> SimReport {
        run_on(cfg, |queues, cfg| Box::new(RealBroker::new(queues, cfg)))
    }

    fn run_many(what: &str, make: fn(u64) -> SimConfig, mode: &str) {
        let n = env_u64("SHOAL_SIM_BROKER_SCHEDULES", 40);
        let first = env_u64("SHOAL_SIM_FIRST", 0);
        let mut failed = Vec::new();
        let (mut produced, mut dups) = (0, 0);
        for seed in first..first + n {
            let r = on_real_broker(&make(seed));
            produced += r.produced;
            dups += r.duplicates;
            if !r.violations.is_empty() {
                println!("{what}: seed {seed} FAILED: {:?}", r.schedule);
                for v in &r.violations {
                    println!("  {v}");
                }
                println!("  replay: SHOAL_SIM_SEED={seed} SHOAL_SIM_MODE={mode} cargo test -p shoal-broker --lib harness::tests::replay -- --nocapture");
                failed.push(seed);
            }
        }
        println!("{what} on the broker's handlers: {n} schedules, {produced} messages, {dups} duplicates");
        assert!(failed.is_empty(), "seeds with violations: {failed:?}");
    }

    #[test]
    fn classic_schedules_on_the_broker_hold_every_invariant() {
        run_many("classic", SimConfig::for_seed, "classic");
    }

    #[test]
    fn coordinated_schedules_on_the_broker_hold_every_invariant() {
        run_many(
            "coordinated",
            SimConfig::coordinated_for_seed,
            "coordinated",
        );
    }

    #[test]
    fn graceful_coordinated_schedules_on_the_broker_fence_nobody() {
        run_many(
            "coordinated graceful",
            SimConfig::coordinated_graceful_for_seed,
            "graceful",
        );
    }

    /// Replays one seed with a trace of every step (`SHOAL_SIM_SEED`, `SHOAL_SIM_MODE`).
    #[test]
    fn replay() {
        let Ok(seed) = std::env::var("SHOAL_SIM_SEED") else {
            return;
        };
        let seed: u64 = seed.parse().expect("SHOAL_SIM_SEED is a number");
        let mut cfg = match std::env::var("SHOAL_SIM_MODE").as_deref() {
            Ok("coordinated") => SimConfig::coordinated_for_seed(seed),
            Ok("graceful") => SimConfig::coordinated_graceful_for_seed(seed),
            _ => SimConfig::for_seed(seed),
        };
        cfg.trace = true;
        let r = on_real_broker(&cfg);
        for v in &r.violations {
            println!("{v}");
        }
        assert!(r.violations.is_empty(), "seed {seed}: {:?}", r.violations);
    }
}
