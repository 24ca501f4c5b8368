//! Metadata follows the data: the master writes its topic table, subscription groups,
//! consumer offsets and delay-level progress into the group's own commit log, as records of
//! the system topic [`METADATA_TOPIC`]; replicas apply them in log order as they become
//! visible (below the confirmed offset). They are replicated, acknowledged and truncated
//! exactly as messages are, so a new master has the tables and offsets the old one had
//! confirmed.
//!
//! What is written: the whole topic table or subscription-group table when it changed (both
//! are small and change rarely), and the consumer offsets and delay-level progress that
//! changed since the last round (all of them on becoming master and every
//! [`FULL_ROUND_EVERY`] rounds, so that a replica restarted from an old log or a trimmed one
//! converges). One round every [`ROUND`]: an offset committed to a master less than a round
//! before it dies is not on the new master (its messages are delivered again); an offset
//! never moves below what a round carried.
//!
//! A new master first applies every record its log holds (up to the end it became master
//! at, once confirmed), then starts writing: its own tables never go back to an older
//! master's.

use super::{Replication, RoleView};
use crate::group_config::SubscriptionGroupConfig;
use crate::shared::Shared;
use serde::{Deserialize, Serialize};
use shoal_proto::body::TopicConfig;
use shoal_proto::message::{decode_records, DecodeOptions};
use shoal_store::MessageExtBrokerInner;
use std::collections::{BTreeMap, BTreeSet};
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

/// One metadata record's body (JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
}

/// What the master last wrote.
#[derive(Debug, Default)]
struct Written {
    topics: Option<Vec<TopicConfig>>,
    groups: Option<Vec<SubscriptionGroupConfig>>,
    offsets: BTreeMap<(String, String, i32), i64>,
    delay: BTreeMap<i32, i64>,
    rounds: u64,
}

#[derive(Debug, Default)]
struct Follower {
    /// The next record of [`METADATA_TOPIC`] to apply.
    next: u64,
    /// While master of this epoch: whether it has applied every record of its log.
    master_of: Option<(u32, u64, bool)>,
    written: Written,
}

/// Starts the task that writes (as master) or applies (as replica) the group's metadata.
pub(crate) fn start(b: Arc<Shared>, repl: Arc<Replication>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut f = Follower {
            next: b.store.min_offset(METADATA_TOPIC, 0),
            ..Default::default()
        };
        let mut tick = tokio::time::interval(ROUND);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            f.round(&b, &repl).await;
        }
    })
}

impl Follower {
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
                        (end, false)
                    }
                };
                if !since.1 {
                    self.apply_visible(b).await;
                    let caught_up = self.next >= b.store.max_offset(METADATA_TOPIC, 0)
                        && b.store.confirmed() >= since.0;
                    if !caught_up {
                        return;
                    }
                    info!(
                        applied = self.next,
                        "new master applied its log's metadata; writing its own from now on"
                    );
                    self.master_of = Some((epoch, since.0, true));
                }
                if let Err(e) = self.write_changes(b).await {
                    debug!(error = %e.remark, "metadata not written this round");
                }
            }
            RoleView::Replica { .. } | RoleView::Joining => {
                self.master_of = None;
                self.apply_visible(b).await;
            }
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
        Ok(())
    }
}

/// Writes one record through the send path (the in-sync set acknowledges it).
async fn put(b: &Arc<Shared>, record: &MetadataRecord) -> Result<(), crate::reply::Reject> {
    let body =
        serde_json::to_vec(record).map_err(|e| crate::reply::Reject::system(e.to_string()))?;
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
            for (g, t, q, o) in offsets {
                b.store.commit_offset(&g, &t, q, o);
            }
        }
        MetadataRecord::Delay { levels } => {
            for (l, o) in levels {
                b.store.set_schedule_offset(l, o);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use super::*;

    #[test]
    fn records_round_trip_as_json() {
        let r = MetadataRecord::Offsets {
            offsets: vec![("g".into(), "t".into(), 3, 42)],
        };
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"kind\":\"offsets\""), "{json}");
        assert_eq!(serde_json::from_str::<MetadataRecord>(&json).unwrap(), r);
        let t = MetadataRecord::Topics {
            topics: vec![TopicConfig {
                topic_name: "a".into(),
                ..Default::default()
            }],
        };
        let back: MetadataRecord =
            serde_json::from_slice(&serde_json::to_vec(&t).unwrap()).unwrap();
        assert_eq!(back, t);
    }
}
