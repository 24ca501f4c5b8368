//! POP consumption at the broker: the sans-IO [`PopEngine`] of `shoal-group` behind one lock,
//! its journal, the revive service (lapsed leases copied to the group's retry or dead-letter
//! topic), long polling of pops, and the per-group message request modes (PULL or POP) set by
//! SET_MESSAGE_REQUEST_MODE. Handlers for the remoting codes are in [`remoting`].
//!
//! In a replicated group the engine's records also go to the group's replicas, through the
//! master's metadata rounds ([`PopService::take_changes`]); a new master adopts the state its
//! log carried ([`PopService::adopt`]).
//!
//! Broker state is reached only through the functions of [`view`], so that it can be
//! re-pointed in one place.

pub(crate) mod consume;
pub(crate) mod describe;
pub(crate) mod journal;
pub(crate) mod remoting;
pub(crate) mod revive;
pub(crate) mod view;

pub(crate) use describe::describe_group;
pub use describe::{PopConsumerView, PopGroupView, PopQueueView};

use crate::config::FlushMode;
use parking_lot::Mutex;
use shoal_group::pop::{PopAction, PopConfig, PopEngine, PopRecord, QueueKey};
use shoal_proto::body::MessageRequestMode;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use tokio::sync::Notify;

/// A lapsed lease to copy: (queue, offset, receipt time, straight to the dead-letter topic).
type ReviveJob = (QueueKey, u64, u64, bool);

/// Engine records held for the replicas at most; past it the next round writes the whole
/// state instead.
const MAX_OUTBOX_RECORDS: usize = 262_144;

/// The engine and its journal: one lock, held for an engine call and its journal write.
#[derive(Debug)]
pub(crate) struct PopCore {
    /// The engine.
    pub engine: PopEngine,
    journal: Option<journal::Journal>,
    outbox: Outbox,
}

/// The engine's records on their way to the group's replicas (collected once a replicated
/// master's metadata task has asked for them).
#[derive(Debug)]
struct Outbox {
    collecting: bool,
    /// The next round writes the whole state rather than `records`.
    whole: bool,
    records: Vec<PopRecord>,
}

/// What the engine changed since the metadata task last asked.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PopChanges {
    /// The whole state (it replaces what a replica held).
    Whole(Vec<PopRecord>),
    /// Records to apply after the earlier ones.
    Since(Vec<PopRecord>),
}

/// A (topic, group)'s message request mode and `popShareQueueNum`.
pub(crate) type RequestMode = (String, String, MessageRequestMode, i32);

/// Counters of POP traffic (for metrics and `shoal group describe`).
#[derive(Debug, Default)]
pub(crate) struct PopCounters {
    /// POP requests answered with messages.
    pub pops_found: AtomicU64,
    /// POP requests answered empty.
    pub pops_empty: AtomicU64,
    /// Pops refused because too many were held (POLLING_FULL).
    pub polling_full: AtomicU64,
    /// Journal writes that failed (the request was answered SYSTEM_ERROR).
    pub journal_errors: AtomicU64,
}

/// POP state of a broker.
#[derive(Debug)]
pub(crate) struct PopService {
    core: Mutex<PopCore>,
    /// Woken on every stored message (held pops re-try) and on lease changes.
    arrivals: Notify,
    /// Woken when a revive job is queued or a lease deadline may have moved.
    revive_wakeup: Notify,
    revives: Mutex<VecDeque<ReviveJob>>,
    /// Pops held now.
    pub polling: AtomicUsize,
    /// Message request modes by (topic, group): mode and `popShareQueueNum`.
    modes: Mutex<BTreeMap<(String, String), (MessageRequestMode, i32)>>,
    modes_path: Option<std::path::PathBuf>,
    /// Counters.
    pub counters: PopCounters,
    /// Most pops held at once.
    pub max_polling: usize,
}

impl PopService {
    /// Opens the POP state of a broker: replays `<data_dir>/pop/journal` and the request modes.
    ///
    /// # Errors
    /// I/O errors of the journal.
    pub(crate) fn open(config: &crate::BrokerConfig) -> std::io::Result<Self> {
        let dir = config.data_dir.join("pop");
        let mut engine = PopEngine::new(PopConfig {
            max_inflight_per_queue: config.pop_max_inflight_per_queue,
            min_invisible_ms: 1_000,
            ..PopConfig::default()
        });
        let journal =
            journal::Journal::open(&dir, config.flush_mode == FlushMode::Sync, |records| {
                engine.restore(records);
                engine.snapshot()
            })?;
        let modes_path = dir.join("messageRequestMode.json");
        let modes = std::fs::read(&modes_path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Vec<RequestMode>>(&b).ok())
            .unwrap_or_default()
            .into_iter()
            .map(|(t, g, m, n)| ((t, g), (m, n)))
            .collect();
        Ok(Self {
            core: Mutex::new(PopCore {
                engine,
                journal: Some(journal),
                outbox: Outbox {
                    collecting: false,
                    whole: true,
                    records: Vec::new(),
                },
            }),
            arrivals: Notify::new(),
            revive_wakeup: Notify::new(),
            revives: Mutex::new(VecDeque::new()),
            polling: AtomicUsize::new(0),
            modes: Mutex::new(modes),
            modes_path: Some(modes_path),
            counters: PopCounters::default(),
            max_polling: config.pop_max_polling,
        })
    }

    /// Runs `f` on the engine, then carries out its actions: journal records are written
    /// before this returns (an error if they could not be), offsets committed, revives queued.
    ///
    /// # Errors
    /// The journal write failed: the caller must not report success.
    pub(crate) fn with_engine<R>(
        &self,
        store: &shoal_store::MessageStore,
        f: impl FnOnce(&mut PopEngine) -> R,
    ) -> Result<R, std::io::Error> {
        let mut commits = Vec::new();
        let mut jobs = Vec::new();
        let (r, written) = {
            let mut core = self.core.lock();
            let r = f(&mut core.engine);
            let mut records: Vec<PopRecord> = Vec::new();
            while let Some(a) = core.engine.poll_action() {
                match a {
                    PopAction::Journal(rec) => records.push(rec),
                    PopAction::CommitOffset { key, ack } => commits.push((key, ack)),
                    PopAction::Revive {
                        key,
                        offset,
                        pop_time,
                    } => jobs.push((key, offset, pop_time, false)),
                    PopAction::DeadLetter {
                        key,
                        offset,
                        pop_time,
                    } => jobs.push((key, offset, pop_time, true)),
                }
            }
            let core = &mut *core;
            let out = &mut core.outbox;
            if out.collecting && !out.whole && !records.is_empty() {
                if out.records.len() + records.len() > MAX_OUTBOX_RECORDS {
                    out.whole = true;
                    out.records = Vec::new();
                } else {
                    out.records.extend(records.iter().cloned());
                }
            }
            let written = match core.journal.as_mut() {
                Some(j) => {
                    let w = j.append(&records);
                    if w.is_ok() && j.wants_compaction() {
                        let snap = core.engine.snapshot();
                        if let Err(e) = j.compact(&snap) {
                            tracing::warn!(error = %e, "POP journal compaction failed; appending on");
                        }
                    }
                    w
                }
                None => Ok(()),
            };
            (r, written)
        };
        for (key, ack) in commits {
            // The group's consumer offset of the queue (what `group progress` shows).
            store.commit_offset(&key.group, &key.topic, key.queue_id, ack as i64);
        }
        if !jobs.is_empty() {
            self.revives.lock().extend(jobs);
            self.revive_wakeup.notify_one();
        }
        match written {
            Ok(()) => Ok(r),
            Err(e) => {
                self.counters.journal_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "POP journal write failed");
                Err(e)
            }
        }
    }

    /// The engine's changes for the group's replicas since the last call: the whole state on
    /// the first call, after [`Self::send_whole`], or when more piled up than a round carries.
    pub(crate) fn take_changes(&self) -> PopChanges {
        let mut core = self.core.lock();
        let core = &mut *core;
        core.outbox.collecting = true;
        if core.outbox.whole {
            core.outbox.whole = false;
            core.outbox.records = Vec::new();
            PopChanges::Whole(core.engine.snapshot())
        } else {
            PopChanges::Since(std::mem::take(&mut core.outbox.records))
        }
    }

    /// The next [`Self::take_changes`] gives the whole state (a new master's first round, a
    /// full round, a round that could not be written).
    pub(crate) fn send_whole(&self) {
        self.core.lock().outbox.whole = true;
    }

    /// A new master adopts the state its log replicated: it replaces the engine's (and the
    /// journal's), and lapsed leases are revived from here on.
    ///
    /// # Errors
    /// The journal could not be rewritten (the engine has the state all the same).
    pub(crate) fn adopt(&self, records: Vec<PopRecord>) -> std::io::Result<()> {
        let written = {
            let mut core = self.core.lock();
            let core = &mut *core;
            let mut engine = PopEngine::new(core.engine.config().clone());
            engine.restore(records);
            core.engine = engine;
            core.outbox.whole = true;
            core.outbox.records = Vec::new();
            match core.journal.as_mut() {
                Some(j) => j.compact(&core.engine.snapshot()),
                None => Ok(()),
            }
        };
        self.revive_wakeup.notify_one();
        self.arrivals.notify_waiters();
        written
    }

    /// The engine's limits (a replica's copy of its master's state uses the same).
    pub(crate) fn engine_config(&self) -> PopConfig {
        self.core.lock().engine.config().clone()
    }

    /// Every message request mode set.
    pub(crate) fn request_modes(&self) -> Vec<RequestMode> {
        self.modes
            .lock()
            .iter()
            .map(|((t, g), (m, n))| (t.clone(), g.clone(), *m, *n))
            .collect()
    }

    /// Replaces the message request modes with the master's (and persists them).
    ///
    /// # Errors
    /// The file could not be written.
    pub(crate) fn replace_request_modes(&self, all: Vec<RequestMode>) -> std::io::Result<()> {
        *self.modes.lock() = all
            .iter()
            .map(|(t, g, m, n)| ((t.clone(), g.clone()), (*m, *n)))
            .collect();
        self.persist_modes(&all)
    }

    fn persist_modes(&self, all: &[RequestMode]) -> std::io::Result<()> {
        if let Some(p) = &self.modes_path {
            let tmp = p.with_extension("tmp");
            std::fs::write(
                &tmp,
                serde_json::to_vec(all).map_err(std::io::Error::other)?,
            )?;
            std::fs::rename(&tmp, p)?;
        }
        Ok(())
    }

    /// The request mode and share count of (topic, group): PULL unless set.
    pub(crate) fn request_mode(&self, topic: &str, group: &str) -> (MessageRequestMode, i32) {
        self.modes
            .lock()
            .get(&(topic.to_owned(), group.to_owned()))
            .copied()
            .unwrap_or((MessageRequestMode::Pull, -1))
    }

    /// Sets (and persists) the request mode of (topic, group).
    ///
    /// # Errors
    /// The file could not be written.
    pub(crate) fn set_request_mode(
        &self,
        topic: &str,
        group: &str,
        mode: MessageRequestMode,
        share: i32,
    ) -> std::io::Result<()> {
        let all: Vec<RequestMode> = {
            let mut m = self.modes.lock();
            m.insert((topic.to_owned(), group.to_owned()), (mode, share));
            m.iter()
                .map(|((t, g), (m, n))| (t.clone(), g.clone(), *m, *n))
                .collect()
        };
        self.persist_modes(&all)
    }

    /// Groups in POP mode (by request mode, or with POP state).
    pub(crate) fn pop_groups(&self) -> Vec<String> {
        let mut g: std::collections::BTreeSet<String> = self.core.lock().engine.groups();
        for ((_, group), (mode, _)) in self.modes.lock().iter() {
            if *mode == MessageRequestMode::Pop {
                g.insert(group.clone());
            }
        }
        g.into_iter().collect()
    }

    /// A queue's acked offset and cursor, if the engine knows it.
    pub(crate) fn queue_offsets(&self, key: &QueueKey) -> Option<(u64, u64)> {
        self.core.lock().engine.queue_offsets(key)
    }

    /// The engine's counters (leases, acks, refusals, lapses, revives, dead letters).
    pub(crate) fn engine_counters(&self) -> shoal_group::pop::PopCounters {
        self.core.lock().engine.counters()
    }

    /// A message was stored: held pops look again.
    pub(crate) fn on_arrival(&self) {
        if self.polling.load(Ordering::Relaxed) > 0 {
            self.arrivals.notify_waiters();
        }
    }
}
