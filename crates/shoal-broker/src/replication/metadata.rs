//! Metadata follows the data: the master writes its topic table, subscription groups,
//! consumer offsets, delay-level progress, queue locks, POP leases and request modes, and
//! group coordinator state into the group's own
//! commit log, as records of the system topic [`METADATA_TOPIC`]; replicas apply them in log
//! order as they become visible (below the confirmed offset). They are replicated,
//! acknowledged and truncated exactly as messages are, so a new master has the tables and
//! offsets the old one had confirmed.
//!
//! What is written: the whole topic table or subscription-group table when it changed (both
//! are small and change rarely), the consumer offsets and delay-level progress that changed
//! since the last round, the live queue locks when their holders changed, and the whole state
//! of every coordinated group that changed (and the
//! topics' queues the coordinator knows, when they changed); all of them on becoming master
//! and every [`FULL_ROUND_EVERY`] rounds, so that a replica restarted from an old log or a
//! trimmed one converges. One round every [`ROUND`], and one at once when a commit or a table
//! change waits for its answer ([`Replication::metadata_replicated`]): an offset committed
//! oneway to a master less than a round before it dies is not on the new master (its messages
//! are delivered again); an offset never moves below what a round carried.
//!
//! A replica keeps the coordinator's state aside ([`CoordinatorFollower`]; its own
//! coordinator decides nothing for members, who are refused until it is master). A new master
//! first applies every record its log holds (up to the end it became master at, once
//! confirmed), then takes over: its coordinator continues from the replicated state with every
//! group epoch moved forward (so epochs only grow across a failover), it adopts the old
//! master's queue locks (so no other member gets a queue while its holder may still consume
//! it under its lease), it adopts the old master's POP leases (`super::pop`), its transaction
//! decisions are rebuilt from its log's op queue, and only then does it answer members and
//! END_TRANSACTION, check transactions, deliver delay levels
//! ([`Replication::serves_as_master`]) and write its own records: its own tables never go back
//! to an older master's.

use super::pop::{encode_lines, PopFollower, RECORDS_PER_METADATA};
use super::{Replication, RoleView};
use crate::group_config::SubscriptionGroupConfig;
use crate::pop::{PopChanges, RequestMode};
use crate::shared::Shared;
use serde::{Deserialize, Serialize};
use shoal_group::coordinator::{CoordinatorFollower, CoordinatorUpdate};
use shoal_group::lock::HeldLock;
use shoal_proto::body::TopicConfig;
use shoal_proto::message::{decode_records, DecodeOptions};
use shoal_store::MessageExtBrokerInner;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

/// The system topic the master writes its metadata to (queue 0). Clients may not send to it.
pub(crate) const METADATA_TOPIC: &str = "rmq_sys_SHOAL_REPLICATED_METADATA";

/// One round of writing (master) or applying (replica).
const ROUND: Duration = Duration::from_millis(500);

/// Every this many rounds the master writes every offset, changed or not.
const FULL_ROUND_EVERY: u64 = 1200;

/// Records applied per read at most.
const READ_BATCH: usize = 64;

/// Queue locks per record at most.
const LOCKS_PER_RECORD: usize = 2048;

/// Coordinated groups per record at most (fewer when their state is large).
const GROUPS_PER_RECORD: usize = 64;

/// A coordinator record's body at most (or `max_message_bytes`, when smaller); a single group
/// larger than this is not replicated (logged; its members rejoin after a failover).
const MAX_RECORD_BYTES: usize = 1 << 20;

/// One metadata record's body (JSON).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
enum MetadataRecord {
    /// The whole topic table.
    Topics { topics: Vec<TopicConfig> },
    /// The whole subscription-group table.
    Groups {
        groups: Vec<SubscriptionGroupConfig>,
    },
    /// Consumer offsets: (group, topic, queue id, offset).
    Offsets {
        offsets: Vec<(String, String, i32, i64)>,
    },
    /// Delay-level progress: (level, offset).
    Delay { levels: Vec<(i32, i64)> },
    /// The live queue locks: the first record of a set replaces the previous set, the others
    /// add to it.
    Locks { locks: Vec<HeldLock>, first: bool },
    /// The group coordinator's state: whole groups, groups gone, the topics' queues, or (a
    /// full round's end) the name of every group.
    Coordinator { update: CoordinatorUpdate },
    /// POP engine records in the journal's text form; `whole`: the first record of a whole
    /// state, which replaces the earlier one.
    Pop { lines: String, whole: bool },
    /// Every POP message request mode (SET_MESSAGE_REQUEST_MODE).
    PopModes { modes: Vec<RequestMode> },
}

/// What the master last wrote.
#[derive(Debug, Default)]
struct Written {
    topics: Option<Vec<TopicConfig>>,
    groups: Option<Vec<SubscriptionGroupConfig>>,
    offsets: BTreeMap<(String, String, i32), i64>,
    delay: BTreeMap<i32, i64>,
    /// The locks' holders written last: (group, queue, client id, orderly).
    locks: Option<Vec<(String, shoal_proto::MessageQueue, String, bool)>>,
    rounds: u64,
    /// Every coordinated group was written (false: the next round writes them all).
    coordinator_full: bool,
    /// The coordinator's topic map version written last (0: none).
    coordinator_topics: u64,
    /// The POP request modes written last.
    pop_modes: Option<Vec<RequestMode>>,
}

#[derive(Debug)]
struct Follower {
    /// The next record of [`METADATA_TOPIC`] to apply.
    next: u64,
    /// While master of this epoch: whether it has applied every record of its log.
    master_of: Option<(u32, u64, bool)>,
    written: Written,
    /// The master's coordinator state as its records carried it.
    coordinator: CoordinatorFollower,
    /// The master's queue locks as its records carried them.
    locks: Vec<HeldLock>,
    /// The master's POP state as its records carried it.
    pop: PopFollower,
}

/// Starts the task that writes (as master) or applies (as replica) the group's metadata.
pub(crate) fn start(b: Arc<Shared>, repl: Arc<Replication>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut f = Follower::new(&b);
        let mut tick = tokio::time::interval(ROUND);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Every round, or at once when a commit waits for its offsets to be replicated.
            tokio::select! {
                _ = tick.tick() => {}
                () = repl.round_wanted() => {}
            }
            f.round(&b, &repl).await;
        }
    })
}

impl Follower {
    fn new(b: &Shared) -> Self {
        Self {
            next: b.store.min_offset(METADATA_TOPIC, 0),
            master_of: None,
            written: Written::default(),
            coordinator: CoordinatorFollower::new(b.config.coordinator.max_groups),
            locks: Vec::new(),
            pop: PopFollower::new(b.pop.engine_config()),
        }
    }

    async fn round(&mut self, b: &Arc<Shared>, repl: &Replication) {
        match repl.view().role {
            RoleView::Master { epoch } => {
                let since = match self.master_of {
                    Some((e, end, done)) if e == epoch => (end, done),
                    _ => {
                        // Became master: what its log holds comes first.
                        let end = b.store.commit_log_max_offset();
                        self.master_of = Some((epoch, end, false));
                        self.written = Written::default();
                        b.pop.send_whole();
                        (end, false)
                    }
                };
                if !since.1 {
                    self.apply_visible(b).await;
                    // Dispatched, not only confirmed: a record confirmed but not yet in the
                    // metadata queue would be missed, and an older record applied before it
                    // (a topic table without a topic created since) would stand. Read before
                    // the queue's end, so that end includes every record up to `since.0`.
                    let dispatched = b.store.dispatched_offset();
                    let caught_up =
                        dispatched >= since.0 && self.next >= b.store.max_offset(METADATA_TOPIC, 0);
                    if !caught_up {
                        return;
                    }
                    self.take_over(b).await;
                    info!(
                        applied = self.next,
                        coordinated_groups = self.coordinator.len(),
                        "new master applied its log's metadata and took over; writing its own from now on"
                    );
                    self.master_of = Some((epoch, since.0, true));
                    repl.set_taken_over(epoch);
                }
                let n = repl.round_started();
                match self.write_changes(b).await {
                    Ok(()) => repl.round_done(n),
                    Err(e) => debug!(error = %e.remark, "metadata not written this round"),
                }
            }
            RoleView::Replica { .. } | RoleView::Joining => {
                self.master_of = None;
                // Its own coordinator's changes are not the group's.
                b.groups.take_changed();
                self.apply_visible(b).await;
            }
        }
        let c = &repl.counters;
        c.coordinator_groups
            .store(self.coordinator.len() as u64, Ordering::Relaxed);
        c.coordinator_groups_left_out
            .store(self.coordinator.left_out(), Ordering::Relaxed);
    }

    /// The new master takes over what its log replicated: the coordinator continues from the
    /// old master's state (epochs moved forward), the transaction decisions are rebuilt from
    /// the op queue (so a transaction the old master decided is not decided again).
    async fn take_over(&mut self, b: &Arc<Shared>) {
        if self.coordinator.applied() > 0 {
            if self.coordinator.left_out() > 0 {
                warn!(
                    left_out = self.coordinator.left_out(),
                    max_groups = b.config.coordinator.max_groups,
                    "coordinated groups beyond [coordinator] max_groups were not taken over"
                );
            }
            b.groups.take_over(self.coordinator.snapshot());
        }
        // They replace what this broker held when it was master before.
        let locks = std::mem::take(&mut self.locks);
        debug!(locks = locks.len(), "queue locks of the old master adopted");
        b.groups.with(|g, now| g.adopt_locks(now, locks));
        if let Some(records) = self.pop.snapshot() {
            let leases = records
                .iter()
                .filter(|r| matches!(r, shoal_group::pop::PopRecord::Grant { .. }))
                .count();
            match b.pop.adopt(records) {
                Ok(()) => debug!(leases, "POP leases of the old master adopted"),
                Err(e) => {
                    warn!(error = %e, leases, "POP leases adopted; the POP journal not rewritten")
                }
            }
        }
        match crate::transaction::service::rebuild_decisions(b).await {
            Ok(n) => debug!(
                decisions = n,
                "transaction decisions rebuilt from the op queue"
            ),
            Err(e) => warn!(error = %e.remark, "could not read the transaction op queue"),
        }
    }

    /// Applies every visible record from `next` on.
    async fn apply_visible(&mut self, b: &Arc<Shared>) {
        loop {
            let store = b.store.clone();
            let from = self.next;
            let got = crate::reply::blocking(move || {
                store
                    .get_messages(METADATA_TOPIC, 0, from, READ_BATCH, 16 << 20, &|_| true)
                    .map_err(crate::reply::Reject::system)
            })
            .await;
            let Ok(got) = got else { return };
            if got.message_count == 0 {
                // Trimmed by retention: start at what is left.
                if got.next_begin_offset > self.next {
                    self.next = got.next_begin_offset;
                    continue;
                }
                return;
            }
            let run = decode_records(&got.messages, &DecodeOptions::default());
            for msg in &run.messages {
                match serde_json::from_slice::<MetadataRecord>(&msg.body) {
                    Ok(MetadataRecord::Coordinator { update }) => self.coordinator.apply(update),
                    Ok(MetadataRecord::Locks { locks, first }) => {
                        if first {
                            self.locks.clear();
                        }
                        self.locks.extend(locks);
                    }
                    Ok(MetadataRecord::Pop { lines, whole }) => self.pop.apply(whole, &lines),
                    Ok(r) => apply(b, r),
                    Err(e) => warn!(offset = msg.queue_offset, error = %e,
                        "metadata record not understood; skipped"),
                }
            }
            self.next = got.next_begin_offset.max(self.next + 1);
            if let Err(e) = b.persist_tables().await {
                warn!(error = %e.remark, "replicated tables not written");
            }
        }
    }

    /// The master's changes since the last round, as records (each acknowledged by the
    /// in-sync set before the next is written).
    async fn write_changes(&mut self, b: &Arc<Shared>) -> Result<(), crate::reply::Reject> {
        let w = &mut self.written;
        w.rounds += 1;
        if w.rounds % FULL_ROUND_EVERY == 0 {
            w.offsets.clear();
            w.delay.clear();
            w.locks = None;
            w.pop_modes = None;
            b.pop.send_whole();
        }
        let topics = b.topics.all();
        if w.topics.as_ref() != Some(&topics) {
            put(
                b,
                &MetadataRecord::Topics {
                    topics: topics.clone(),
                },
            )
            .await?;
            w.topics = Some(topics);
        }
        let groups: Vec<SubscriptionGroupConfig> = b
            .sub_groups
            .names()
            .iter()
            .filter_map(|g| b.sub_groups.get(g))
            .collect();
        if w.groups.as_ref() != Some(&groups) {
            put(
                b,
                &MetadataRecord::Groups {
                    groups: groups.clone(),
                },
            )
            .await?;
            w.groups = Some(groups);
        }
        let offsets: Vec<(String, String, i32, i64)> = b
            .store
            .all_offsets()
            .into_iter()
            .filter(|(g, t, q, o)| w.offsets.get(&(g.clone(), t.clone(), *q)) != Some(o))
            .collect();
        for chunk in offsets.chunks(4096) {
            put(
                b,
                &MetadataRecord::Offsets {
                    offsets: chunk.to_vec(),
                },
            )
            .await?;
            for (g, t, q, o) in chunk {
                w.offsets.insert((g.clone(), t.clone(), *q), *o);
            }
        }
        let levels: Vec<(i32, i64)> = b
            .store
            .all_schedule_offsets()
            .into_iter()
            .filter(|(l, o)| w.delay.get(l) != Some(o))
            .collect();
        if !levels.is_empty() {
            put(
                b,
                &MetadataRecord::Delay {
                    levels: levels.clone(),
                },
            )
            .await?;
            w.delay.extend(levels);
        }
        let locks = b.groups.read(|g, now| g.held_locks(now));
        let holders: Vec<_> = locks
            .iter()
            .map(|l| {
                (
                    l.group.clone(),
                    l.queue.clone(),
                    l.client_id.clone(),
                    l.orderly,
                )
            })
            .collect();
        if w.locks.as_ref() != Some(&holders) {
            let mut first = true;
            for chunk in locks.chunks(LOCKS_PER_RECORD) {
                put(
                    b,
                    &MetadataRecord::Locks {
                        locks: chunk.to_vec(),
                        first,
                    },
                )
                .await?;
                first = false;
            }
            if first {
                put(
                    b,
                    &MetadataRecord::Locks {
                        locks: Vec::new(),
                        first,
                    },
                )
                .await?;
            }
            w.locks = Some(holders);
        }
        write_pop(b, w).await?;
        if let Err(e) = write_coordinator(b, w).await {
            // What was taken is gone from the changed set: all of it next round.
            w.coordinator_full = false;
            return Err(e);
        }
        Ok(())
    }
}

/// The POP engine's changes since the last round (the whole state when asked for), then the
/// request modes if they changed.
async fn write_pop(b: &Arc<Shared>, w: &mut Written) -> Result<(), crate::reply::Reject> {
    let (records, mut whole) = match b.pop.take_changes() {
        PopChanges::Whole(r) => (r, true),
        PopChanges::Since(r) => (r, false),
    };
    // A whole state with no queue still replaces what the replicas held.
    let empty_whole = whole && records.is_empty();
    let chunks = records
        .chunks(RECORDS_PER_METADATA)
        .chain(empty_whole.then_some(&[][..]));
    for chunk in chunks {
        let record = MetadataRecord::Pop {
            lines: encode_lines(chunk),
            whole,
        };
        if let Err(e) = put(b, &record).await {
            // What was taken is gone: the whole state next round.
            b.pop.send_whole();
            return Err(e);
        }
        whole = false;
    }
    let modes = b.pop.request_modes();
    if w.pop_modes.as_ref() != Some(&modes) {
        put(
            b,
            &MetadataRecord::PopModes {
                modes: modes.clone(),
            },
        )
        .await?;
        w.pop_modes = Some(modes);
    }
    Ok(())
}

/// The coordinator's changes since the last round (every group after a full-round reset),
/// then its topics' queues if they changed.
async fn write_coordinator(b: &Arc<Shared>, w: &mut Written) -> Result<(), crate::reply::Reject> {
    let changed = b.groups.take_changed();
    if w.rounds % FULL_ROUND_EVERY == 0 || changed.overflowed {
        w.coordinator_full = false;
    }
    if !w.coordinator_full {
        let names = b.groups.read(|g, _| g.coordinator().group_names());
        put_groups(b, &names).await?;
        let all = b.groups.read(|g, _| g.coordinator().names_update());
        put(b, &MetadataRecord::Coordinator { update: all }).await?;
        w.coordinator_full = true;
    } else if !changed.names.is_empty() {
        let names: Vec<String> = changed.names.into_iter().collect();
        put_groups(b, &names).await?;
    }
    let version = w.coordinator_topics;
    if let Some((update, v)) = b.groups.read(|g, _| g.coordinator().topics_update(version)) {
        put(b, &MetadataRecord::Coordinator { update }).await?;
        w.coordinator_topics = v;
    }
    Ok(())
}

/// The state of `names` as coordinator records of at most [`GROUPS_PER_RECORD`] groups and
/// [`MAX_RECORD_BYTES`] (halved until they fit).
async fn put_groups(b: &Arc<Shared>, names: &[String]) -> Result<(), crate::reply::Reject> {
    let limit = MAX_RECORD_BYTES.min(b.config.max_message_bytes);
    let mut todo: Vec<&[String]> = names.chunks(GROUPS_PER_RECORD).rev().collect();
    while let Some(chunk) = todo.pop() {
        let update = b
            .groups
            .read(|g, _| g.coordinator().update_for(chunk.iter().map(String::as_str)));
        let body = encode(&MetadataRecord::Coordinator { update })?;
        if body.len() > limit {
            if chunk.len() > 1 {
                let (first, second) = chunk.split_at(chunk.len() / 2);
                todo.push(second);
                todo.push(first);
            } else {
                warn!(group = ?chunk.first(), bytes = body.len(), limit,
                    "a coordinated group's state is too large for a metadata record; not replicated");
            }
            continue;
        }
        put_body(b, body).await?;
    }
    Ok(())
}

/// A record's body.
fn encode(record: &MetadataRecord) -> Result<Vec<u8>, crate::reply::Reject> {
    serde_json::to_vec(record).map_err(|e| crate::reply::Reject::system(e.to_string()))
}

/// Writes one record through the send path (the in-sync set acknowledges it).
async fn put(b: &Arc<Shared>, record: &MetadataRecord) -> Result<(), crate::reply::Reject> {
    put_body(b, encode(record)?).await
}

/// Writes one record's body through the send path.
async fn put_body(b: &Arc<Shared>, body: Vec<u8>) -> Result<(), crate::reply::Reject> {
    let msg = MessageExtBrokerInner {
        topic: METADATA_TOPIC.to_string(),
        queue_id: 0,
        flag: 0,
        sys_flag: 0,
        born_timestamp: crate::clock::wall_ms(),
        born_host: b.store_host,
        reconsume_times: 0,
        prepared_transaction_offset: 0,
        body: body.into(),
        properties: String::new(),
        known: None,
    };
    crate::send::put(b, vec![msg]).await.map(|_| ())
}

/// Applies one record to this broker's tables and offsets.
fn apply(b: &Shared, record: MetadataRecord) {
    match record {
        MetadataRecord::Topics { topics } => {
            let keep: BTreeSet<&str> = topics.iter().map(|t| t.topic_name.as_str()).collect();
            for t in b.topics.all() {
                if !keep.contains(t.topic_name.as_str()) {
                    b.topics.remove(&t.topic_name);
                }
            }
            for t in topics {
                if b.topics.get(&t.topic_name).as_ref() != Some(&t) {
                    if let Err(e) = b.topics.upsert(t) {
                        warn!(error = %e, "replicated topic not applied");
                    }
                }
            }
        }
        MetadataRecord::Groups { groups } => {
            let keep: BTreeSet<&str> = groups.iter().map(|g| g.group_name.as_str()).collect();
            for name in b.sub_groups.names() {
                if !keep.contains(name.as_str()) {
                    b.sub_groups.remove(&name);
                }
            }
            for g in groups {
                if b.sub_groups.get(&g.group_name).as_ref() != Some(&g) {
                    b.sub_groups.upsert(g);
                }
            }
        }
        MetadataRecord::Offsets { offsets } => {
            let waiting = b.replication.get();
            for (g, t, q, o) in offsets {
                let key = (g, t, q);
                // A commit made here that the master does not have yet stays.
                if waiting.is_some_and(|r| r.commits.above(&key, o).is_some()) {
                    continue;
                }
                b.store.commit_offset(&key.0, &key.1, key.2, o);
            }
        }
        MetadataRecord::Delay { levels } => {
            for (l, o) in levels {
                b.store.set_schedule_offset(l, o);
            }
        }
        MetadataRecord::PopModes { modes } => {
            if let Err(e) = b.pop.replace_request_modes(modes) {
                warn!(error = %e, "replicated POP request modes not written");
            }
        }
        // The task's follower keeps these (`Follower::apply_visible`).
        MetadataRecord::Coordinator { .. }
        | MetadataRecord::Locks { .. }
        | MetadataRecord::Pop { .. } => {}
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use super::*;
    use shoal_group::coordinator::{Coordinator, CoordinatorConfig, HeartbeatRequest};

    fn round_trip(r: &MetadataRecord) -> MetadataRecord {
        serde_json::from_slice(&encode(r).unwrap()).unwrap()
    }

    fn same(a: &MetadataRecord, b: &MetadataRecord) -> bool {
        serde_json::to_value(a).unwrap() == serde_json::to_value(b).unwrap()
    }

    #[test]
    fn records_round_trip_as_json() {
        let r = MetadataRecord::Offsets {
            offsets: vec![("g".into(), "t".into(), 3, 42)],
        };
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"kind\":\"offsets\""), "{json}");
        assert!(same(
            &serde_json::from_str::<MetadataRecord>(&json).unwrap(),
            &r
        ));
        let t = MetadataRecord::Topics {
            topics: vec![TopicConfig {
                topic_name: "a".into(),
                ..Default::default()
            }],
        };
        assert!(same(&round_trip(&t), &t));
    }

    #[test]
    fn coordinator_records_carry_a_group_to_a_follower() {
        let mut c = Coordinator::new(CoordinatorConfig::default());
        let queues: Vec<_> = (0..4)
            .map(|i| shoal_proto::MessageQueue::new("T", "broker-a", i))
            .collect();
        c.handle_topic_queues(0, "T", queues);
        let joined = c
            .handle_heartbeat(
                0,
                HeartbeatRequest {
                    group: "G".into(),
                    member_id: "m".into(),
                    client_id: "c".into(),
                    conn_id: 1,
                    subscriptions: ["T".to_string()].into(),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(joined.assignment.len(), 4);
        let epoch = c.describe("G", 0).unwrap().group_epoch;
        let mut f = CoordinatorFollower::new(8);
        let records = [
            MetadataRecord::Coordinator {
                update: c.update_for(["G"]),
            },
            MetadataRecord::Coordinator {
                update: c.topics_update(0).unwrap().0,
            },
            MetadataRecord::Coordinator {
                update: c.names_update(),
            },
        ];
        for r in &records {
            let json = String::from_utf8(encode(r).unwrap()).unwrap();
            assert!(json.starts_with("{\"kind\":\"coordinator\""), "{json}");
            match round_trip(r) {
                MetadataRecord::Coordinator { update } => f.apply(update),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(f.applied(), 3);
        assert_eq!(f.group_epoch("G"), Some(epoch));
        // The follower's snapshot restores the group with its queues and a higher epoch.
        let restored = Coordinator::restore(CoordinatorConfig::default(), f.snapshot(), 10);
        let d = restored.describe("G", 10).unwrap();
        assert!(d.group_epoch > epoch);
        assert_eq!(d.members.len(), 1);
        assert_eq!(d.members[0].owned.len(), 4);
        assert_eq!(restored.topic_queues("T").map(<[_]>::len), Some(4));
    }

    /// A broker over a store in `dir` (not replicated: its puts need no acknowledgement).
    fn broker(dir: &std::path::Path, rt: &tokio::runtime::Runtime) -> Arc<Shared> {
        let config = crate::config::BrokerConfig {
            data_dir: dir.to_path_buf(),
            namesrv_addrs: Vec::new(),
            announce_addr: Some("127.0.0.1:1".into()),
            commit_log_segment_bytes: 16 * 1024 * 1024,
            ..Default::default()
        };
        let (store, _) = rt.block_on(crate::broker::open_store(&config)).unwrap();
        let delay_levels_ms = crate::config::parse_delay_levels(&config.delay_levels).unwrap();
        crate::broker::assemble(crate::broker::Assembly {
            config,
            store,
            delay_levels_ms,
            net_stats: Arc::new(shoal_net::NetStats::default()),
            namesrv_tls: None,
            clock: crate::clock::BrokerClock::starting_at(crate::clock::wall_ms()),
            sink: None,
        })
        .unwrap()
    }

    /// What a replica's log holds from its master (coordinator records, offsets, a
    /// transaction decision), applied and taken over as a new master does: the coordinator
    /// continues above the master's epoch, the offsets are the master's, and the decision is
    /// known (a second END_TRANSACTION is not committed again).
    #[test]
    fn a_new_master_takes_over_what_its_log_replicated() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let b = broker(dir.path(), &rt);
        // The old master's coordinator, one member in G.
        let mut master = Coordinator::new(CoordinatorConfig::default());
        master.handle_topic_queues(
            0,
            "T",
            (0..4)
                .map(|i| shoal_proto::MessageQueue::new("T", "broker-a", i))
                .collect(),
        );
        let join = |c: &mut Coordinator, member: &str, now: u64| {
            c.handle_heartbeat(
                now,
                HeartbeatRequest {
                    group: "G".into(),
                    member_id: member.into(),
                    client_id: format!("client-{member}"),
                    conn_id: 1,
                    subscriptions: ["T".to_string()].into(),
                    ..Default::default()
                },
            )
            .unwrap()
        };
        join(&mut master, "m1", 0);
        join(&mut master, "m2", 1);
        let epoch = master.describe("G", 1).unwrap().group_epoch;
        assert!(epoch >= 2);
        rt.block_on(async {
            for update in [
                master.update_for(["G"]),
                master.topics_update(0).unwrap().0,
                master.names_update(),
            ] {
                put(&b, &MetadataRecord::Coordinator { update })
                    .await
                    .unwrap();
            }
            put(
                &b,
                &MetadataRecord::Offsets {
                    offsets: vec![("g".into(), "T".into(), 0, 7)],
                },
            )
            .await
            .unwrap();
            // A lock set replaced by a later one: the later one is adopted.
            let held = |client: &str, queue_id: i32| HeldLock {
                group: "orderly".into(),
                queue: shoal_proto::MessageQueue::new("T", "broker-a", queue_id),
                client_id: client.into(),
                orderly: true,
                hold_ms: 10_000,
            };
            for (locks, first) in [
                (vec![held("c0", 0)], true),
                (vec![held("c1", 0)], true),
                (vec![held("c2", 1)], false),
            ] {
                put(&b, &MetadataRecord::Locks { locks, first })
                    .await
                    .unwrap();
            }
            crate::transaction::half::ensure_topic(&b, crate::transaction::OP_TOPIC).unwrap();
            let op = crate::transaction::half::op_message(&b, 0, Some("tx-1"), true).unwrap();
            crate::send::put(&b, vec![op]).await.unwrap();

            let mut f = Follower::new(&b);
            f.apply_visible(&b).await;
            assert_eq!(f.coordinator.group_epoch("G"), Some(epoch));
            assert_eq!(b.store.query_offset("g", "T", 0), Some(7));
            // A replica's own coordinator is not touched by what it follows.
            assert!(!b.groups.read(|g, _| g.coordinator().knows_group("G")));
            assert_eq!(b.transactions.decisions.lock().get("tx-1"), None);
            assert!(b.groups.read(|g, now| g.held_locks(now)).is_empty());

            f.take_over(&b).await;
        });
        let d = b
            .groups
            .read(|g, now| g.coordinator().describe("G", now))
            .unwrap();
        assert!(
            d.group_epoch >= epoch + shoal_group::coordinator::RESTORE_EPOCH_GAP,
            "{d:?}"
        );
        assert_eq!(d.members.len(), 2);
        // Mid-rebalance as at the old master: m1 still holds (owns or is revoking) all 4.
        assert_eq!(
            d.members
                .iter()
                .map(|m| m.owned.len() + m.revoking.len())
                .sum::<usize>(),
            4,
            "{d:?}"
        );
        assert_eq!(
            b.transactions.decisions.lock().get("tx-1"),
            Some(crate::transaction::Decision::Committed)
        );
        // The old master's last lock set is held here by the same clients.
        let held: Vec<(i32, String)> = b
            .groups
            .read(|g, now| g.held_locks(now))
            .into_iter()
            .map(|l| (l.queue.queue_id, l.client_id))
            .collect();
        assert_eq!(held, [(0, "c1".to_string()), (1, "c2".to_string())]);
    }

    /// The old master's POP records (its whole state, then a round's changes) and request
    /// modes, applied by a replica and adopted when it takes over: the leases and acked
    /// offsets are the old master's, and the next round writes the whole state again.
    #[test]
    fn a_new_master_adopts_the_pop_leases_its_log_replicated() {
        use shoal_group::pop::{PopRecord, QueueKey};
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let b = broker(dir.path(), &rt);
        let key = QueueKey::new("pop-g", "T", 1);
        let grant = |offset: u64| PopRecord::Grant {
            key: key.clone(),
            offset,
            pop_time: 5_000,
            deadline: u64::MAX / 2,
            attempts: 1,
            consumer: "c1".into(),
        };
        // Before anything is replicated the first round's changes are the whole state.
        assert_eq!(b.pop.take_changes(), PopChanges::Whole(Vec::new()));
        rt.block_on(async {
            let whole = [PopRecord::Base {
                key: key.clone(),
                ack: 10,
                cursor: 10,
                fifo: false,
            }];
            let since = [
                grant(10),
                grant(11),
                grant(12),
                PopRecord::Cursor {
                    key: key.clone(),
                    cursor: 13,
                },
                PopRecord::Done {
                    key: key.clone(),
                    offset: 10,
                },
            ];
            for (records, whole) in [(&whole[..], true), (&since[..], false)] {
                put(
                    &b,
                    &MetadataRecord::Pop {
                        lines: encode_lines(records),
                        whole,
                    },
                )
                .await
                .unwrap();
            }
            let modes = vec![(
                "T".to_string(),
                "pop-g".to_string(),
                shoal_proto::body::MessageRequestMode::Pop,
                2,
            )];
            put(&b, &MetadataRecord::PopModes { modes }).await.unwrap();

            let mut f = Follower::new(&b);
            f.apply_visible(&b).await;
            // Applied aside: this broker's own engine is untouched until it takes over.
            assert_eq!(b.pop.queue_offsets(&key), None);
            assert_eq!(
                b.pop.request_mode("T", "pop-g"),
                (shoal_proto::body::MessageRequestMode::Pop, 2)
            );
            f.take_over(&b).await;
        });
        // Offset 10 acknowledged, 11 and 12 under c1's lease.
        assert_eq!(b.pop.queue_offsets(&key), Some((11, 13)));
        match b.pop.take_changes() {
            PopChanges::Whole(records) => {
                assert!(records.contains(&grant(11)) && records.contains(&grant(12)));
                assert!(!records.contains(&grant(10)), "{records:?}");
            }
            other => panic!("a new master writes its whole POP state first: {other:?}"),
        }
        assert_eq!(b.pop.take_changes(), PopChanges::Since(Vec::new()));
        // Its journal holds the adopted state: a restart keeps the leases.
        let journal = std::fs::read_to_string(dir.path().join("pop").join("journal")).unwrap();
        assert!(journal.contains(&encode_lines(&[grant(11)])), "{journal}");
    }
}
