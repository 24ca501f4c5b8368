//! Idempotent producers: InitProducerId hands out producer ids and epochs; Produce checks
//! every batch's sequence numbers per (producer, partition) as Kafka brokers do: the next
//! batch must start right after the last one; a repeat of one of the last five batches is
//! answered with its original offset and not stored again; a stale epoch is fenced.
//!
//! The state is held in memory (bounded by `max_producer_states`, least recently used
//! forgotten first). A producer this broker has no state for (after a restart or a failover,
//! or evicted) is adopted from its first batch, and its batches among each partition's last
//! messages are read back from the log first (`producer_log.rs`), so a batch the previous
//! leader wrote is answered as a duplicate when the producer sends it again.

use crate::clock::wall_ms;
use kafka_protocol::ResponseError;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

/// One batch as the log shows it: (epoch, first sequence, last sequence, first offset).
pub(crate) type LoggedBatch = (i16, i32, i32, i64);

/// Batches remembered per (producer, partition) for duplicate detection (Kafka keeps 5).
const RECENT_BATCHES: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BatchMeta {
    first_seq: i32,
    last_seq: i32,
    base_offset: i64,
}

#[derive(Debug, Default)]
struct PartitionSeq {
    recent: VecDeque<BatchMeta>,
    /// Its first batch here did not start at sequence 0: this broker took the partition over
    /// from another leader (a failover) while the producer was writing it, so batches that
    /// were in flight then may come in any order.
    mid_stream: bool,
}

/// One producer's state. Locked for the whole check-append-record of a partition's batches,
/// which only that producer's own (serialised) requests wait for.
#[derive(Debug)]
pub(crate) struct ProducerEntry {
    pub epoch: i16,
    partitions: HashMap<(String, i32), PartitionSeq>,
    /// Partitions a Produce request of this producer is writing now (checked, being appended,
    /// not yet recorded). The entry is not locked while the append runs, so a second request
    /// for the same partition (a retry on a new connection while the first is still being
    /// written) is turned away until the first is recorded: its sequence check would not see
    /// the batch in flight.
    writing: HashSet<(String, i32)>,
    /// Another leader gave this producer its id (another broker of the cluster, or this
    /// broker group's master before a failover, whose sequence state is not replicated): on a
    /// partition this entry has no state for, its first batch is taken at whatever sequence
    /// it has, and a later batch that does not follow on is taken too (batches in flight at a
    /// failover may arrive in any order): a producer that carries on after a failover is
    /// never refused for its sequences. What idempotence still gives it here: a batch sent
    /// again is answered as a duplicate while it is among the last five of the partition. A
    /// batch the old master wrote but did not acknowledge may be written again, and batches
    /// in flight at the failover may be written out of order.
    adopted: bool,
}

/// The outcome of checking one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SeqCheck {
    /// New and in order: store it.
    Append,
    /// Already stored at this base offset: answer success without storing.
    Duplicate(i64),
    /// Refused with this error.
    Refuse(ResponseError),
}

impl ProducerEntry {
    /// Checks a batch (first..=last sequence, epoch) against what was stored before.
    pub(crate) fn check(
        &self,
        topic: &str,
        partition: i32,
        epoch: i16,
        first: i32,
        last: i32,
    ) -> SeqCheck {
        if epoch < self.epoch {
            return SeqCheck::Refuse(ResponseError::InvalidProducerEpoch);
        }
        // A higher epoch starts over (the producer bumped it): sequences restart at 0.
        let seq = if epoch > self.epoch {
            None
        } else {
            self.partitions.get(&(topic.to_string(), partition))
        };
        let Some(last_batch) = seq.and_then(|s| s.recent.back()) else {
            // Nothing stored yet for this partition in this epoch. A new epoch starts at 0;
            // otherwise the producer may have written the partition under another leader
            // (before a failover, or it got its id from another broker of the cluster): it
            // goes on from where it is.
            return if first == 0 || epoch == self.epoch {
                SeqCheck::Append
            } else {
                SeqCheck::Refuse(ResponseError::OutOfOrderSequenceNumber)
            };
        };
        if let Some(dup) = seq
            .into_iter()
            .flat_map(|s| s.recent.iter())
            .find(|b| b.first_seq == first && b.last_seq == last)
        {
            return SeqCheck::Duplicate(dup.base_offset);
        }
        let expected = if last_batch.last_seq == i32::MAX {
            0
        } else {
            last_batch.last_seq + 1
        };
        // An adopted producer's batches that were in flight when the leader changed may
        // arrive in another order than they were sent: this leader cannot tell a gap from a
        // batch still on its way, so it takes them (a refusal would be fatal to the producer).
        let mid_stream = seq.is_some_and(|s| s.mid_stream);
        if first == expected || mid_stream || (self.adopted && epoch == self.epoch) {
            SeqCheck::Append
        } else {
            SeqCheck::Refuse(ResponseError::OutOfOrderSequenceNumber)
        }
    }

    /// Whether this entry was adopted (another leader gave the producer its id) and has no
    /// state for the partition yet: its batches there are read back from the log first.
    pub(crate) fn needs_log(&self, topic: &str, partition: i32) -> bool {
        self.adopted
            && !self
                .partitions
                .contains_key(&(topic.to_string(), partition))
    }

    /// The producer's batches of a partition as the log showed them, oldest first (epoch,
    /// first and last sequence, first offset): recorded as if stored here (those of older
    /// epochs are not), and the partition is known from now on, as taken over mid-stream.
    pub(crate) fn rebuilt(&mut self, topic: &str, partition: i32, batches: &[LoggedBatch]) {
        for (epoch, first, last, base) in batches {
            self.record(topic, partition, *epoch, *first, *last, *base);
        }
        self.partitions
            .entry((topic.to_string(), partition))
            .or_default()
            .mid_stream = true;
    }

    /// Records a stored batch.
    pub(crate) fn record(
        &mut self,
        topic: &str,
        partition: i32,
        epoch: i16,
        first: i32,
        last: i32,
        base_offset: i64,
    ) {
        if epoch < self.epoch {
            // The producer re-initialised (bumping its epoch) while this batch was written:
            // its sequences start over, so the old epoch's batch is not one to compare with.
            return;
        }
        if epoch > self.epoch {
            self.epoch = epoch;
            self.partitions.clear();
        }
        let seq = self
            .partitions
            .entry((topic.to_string(), partition))
            .or_insert_with(|| PartitionSeq {
                recent: VecDeque::new(),
                mid_stream: first != 0,
            });
        seq.recent.push_back(BatchMeta {
            first_seq: first,
            last_seq: last,
            base_offset,
        });
        while seq.recent.len() > RECENT_BATCHES {
            seq.recent.pop_front();
        }
    }

    /// Marks `(topic, partition)` as being written by a request of this producer; false when
    /// another request of the producer is writing it already (see `writing`).
    pub(crate) fn begin_write(&mut self, topic: &str, partition: i32) -> bool {
        self.writing.insert((topic.to_string(), partition))
    }

    /// Ends what [`ProducerEntry::begin_write`] began.
    pub(crate) fn end_write(&mut self, topic: &str, partition: i32) {
        self.writing.remove(&(topic.to_string(), partition));
    }
}

#[derive(Debug)]
struct Slot {
    entry: Arc<Mutex<ProducerEntry>>,
    last_used: u64,
}

/// Producer ids and their sequence state.
#[derive(Debug)]
pub(crate) struct ProducerTable {
    slots: Mutex<HashMap<i64, Slot>>,
    next_id: AtomicI64,
    clock: AtomicU64,
    max: usize,
}

impl ProducerTable {
    pub(crate) fn new(max: usize) -> ProducerTable {
        // Ids start from the wall clock so that producers from before a restart do not get
        // their id handed to someone else.
        // A random part keeps two brokers started in the same millisecond apart: a producer
        // writes to every partition leader with the id one of them gave it.
        let base = ((wall_ms().max(1) << 20) + (i64::from(rand::random::<u16>()) << 4)) & i64::MAX;
        ProducerTable {
            slots: Mutex::new(HashMap::new()),
            next_id: AtomicI64::new(base),
            clock: AtomicU64::new(0),
            max: max.max(1),
        }
    }

    /// The state of a producer, if known.
    pub(crate) fn get(&self, id: i64) -> Option<Arc<Mutex<ProducerEntry>>> {
        let tick = self.clock.fetch_add(1, Ordering::Relaxed);
        let mut slots = self.slots.lock();
        let slot = slots.get_mut(&id)?;
        slot.last_used = tick;
        Some(slot.entry.clone())
    }

    /// Registers a new producer (or a new epoch of a known one); returns (id, epoch) and how
    /// many states were evicted to make room.
    pub(crate) fn init(
        &self,
        existing: Option<(i64, i16)>,
    ) -> Result<((i64, i16), usize), ResponseError> {
        let tick = self.clock.fetch_add(1, Ordering::Relaxed);
        let mut slots = self.slots.lock();
        if let Some((id, epoch)) = existing {
            if let Some(slot) = slots.get_mut(&id) {
                let mut e = slot.entry.lock();
                if epoch != e.epoch {
                    return Err(ResponseError::ProducerFenced);
                }
                if e.epoch < i16::MAX - 1 {
                    e.epoch += 1;
                    e.partitions.clear();
                    slot.last_used = tick;
                    return Ok(((id, e.epoch), 0));
                }
                // Epoch exhausted: a new id follows.
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (_, evicted) = Self::insert(&mut slots, self.max, id, 0, false, tick);
        Ok(((id, 0), evicted))
    }

    /// The state of a producer another broker gave its id to (a leader learns a producer from
    /// its first batch, as Kafka's partition leaders do): registered at `epoch`; returns it
    /// and how many states were evicted to make room.
    pub(crate) fn adopt(&self, id: i64, epoch: i16) -> (Arc<Mutex<ProducerEntry>>, usize) {
        let tick = self.clock.fetch_add(1, Ordering::Relaxed);
        let mut slots = self.slots.lock();
        if let Some(slot) = slots.get_mut(&id) {
            slot.last_used = tick;
            return (slot.entry.clone(), 0);
        }
        Self::insert(&mut slots, self.max, id, epoch, true, tick)
    }

    fn insert(
        slots: &mut HashMap<i64, Slot>,
        max: usize,
        id: i64,
        epoch: i16,
        adopted: bool,
        tick: u64,
    ) -> (Arc<Mutex<ProducerEntry>>, usize) {
        let mut evicted = 0;
        if slots.len() >= max {
            let mut by_age: Vec<(u64, i64)> =
                slots.iter().map(|(id, s)| (s.last_used, *id)).collect();
            by_age.sort_unstable();
            let drop_n = (max / 10).max(1).min(by_age.len());
            for (_, id) in &by_age[..drop_n] {
                slots.remove(id);
            }
            evicted = drop_n;
        }
        let entry = Arc::new(Mutex::new(ProducerEntry {
            epoch,
            partitions: HashMap::new(),
            writing: HashSet::new(),
            adopted,
        }));
        slots.insert(
            id,
            Slot {
                entry: entry.clone(),
                last_used: tick,
            },
        );
        (entry, evicted)
    }

    /// Known producers.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> ProducerEntry {
        ProducerEntry {
            adopted: false,
            epoch: 0,
            partitions: HashMap::new(),
            writing: HashSet::new(),
        }
    }

    #[test]
    fn sequences_must_follow_on() {
        let mut e = entry();
        // A partition first written here mid-stream (another leader had it before).
        assert_eq!(e.check("T", 3, 0, 7, 9), SeqCheck::Append);
        e.record("T", 3, 0, 7, 9, 50);
        assert_eq!(
            e.check("T", 3, 0, 4, 6),
            SeqCheck::Append,
            "in flight at a failover"
        );
        assert_eq!(e.check("T", 0, 0, 0, 4), SeqCheck::Append);
        e.record("T", 0, 0, 0, 4, 100);
        assert_eq!(e.check("T", 0, 0, 5, 9), SeqCheck::Append);
        assert_eq!(
            e.check("T", 0, 0, 6, 9),
            SeqCheck::Refuse(ResponseError::OutOfOrderSequenceNumber)
        );
        assert_eq!(e.check("T", 0, 0, 0, 4), SeqCheck::Duplicate(100));
        // Partitions are independent.
        assert_eq!(e.check("T", 1, 0, 0, 0), SeqCheck::Append);
    }

    #[test]
    fn only_the_last_five_batches_are_duplicates() {
        let mut e = entry();
        for i in 0..7 {
            e.record("T", 0, 0, i, i, 10 + i as i64);
        }
        assert_eq!(e.check("T", 0, 0, 6, 6), SeqCheck::Duplicate(16));
        assert_eq!(e.check("T", 0, 0, 2, 2), SeqCheck::Duplicate(12));
        assert_eq!(
            e.check("T", 0, 0, 1, 1),
            SeqCheck::Refuse(ResponseError::OutOfOrderSequenceNumber)
        );
        assert_eq!(e.check("T", 0, 0, 7, 7), SeqCheck::Append);
    }

    #[test]
    fn stale_epochs_are_fenced_and_bumps_reset() {
        let t = ProducerTable::new(10);
        let ((id, ep), _) = t.init(None).unwrap();
        assert_eq!(ep, 0);
        let e = t.get(id).unwrap();
        e.lock().record("T", 0, 0, 0, 0, 0);
        let ((id2, ep2), _) = t.init(Some((id, 0))).unwrap();
        assert_eq!((id2, ep2), (id, 1));
        assert_eq!(
            e.lock().check("T", 0, 0, 1, 1),
            SeqCheck::Refuse(ResponseError::InvalidProducerEpoch)
        );
        assert_eq!(e.lock().check("T", 0, 1, 0, 0), SeqCheck::Append);
        assert_eq!(
            t.init(Some((id, 0))).unwrap_err(),
            ResponseError::ProducerFenced
        );
    }

    #[test]
    fn one_request_at_a_time_writes_a_partition() {
        let mut e = entry();
        assert!(e.begin_write("T", 0));
        assert!(
            !e.begin_write("T", 0),
            "a second writer of the partition is turned away"
        );
        assert!(e.begin_write("T", 1), "other partitions are independent");
        e.end_write("T", 0);
        assert!(e.begin_write("T", 0));
    }

    #[test]
    fn a_batch_written_across_an_epoch_bump_is_not_recorded() {
        let t = ProducerTable::new(10);
        let ((id, _), _) = t.init(None).unwrap();
        let e = t.get(id).unwrap();
        assert_eq!(e.lock().check("T", 0, 0, 0, 9), SeqCheck::Append);
        // The producer re-initialises while the batch is appended.
        assert_eq!(t.init(Some((id, 0))).unwrap().0, (id, 1));
        e.lock().record("T", 0, 0, 0, 9, 500);
        // The new epoch starts at sequence 0, and the old batch is no duplicate of it.
        assert_eq!(e.lock().check("T", 0, 1, 0, 9), SeqCheck::Append);
        e.lock().record("T", 0, 1, 0, 9, 600);
        assert_eq!(
            e.lock().check("T", 0, 1, 11, 12),
            SeqCheck::Refuse(ResponseError::OutOfOrderSequenceNumber)
        );
    }

    #[test]
    fn the_table_is_bounded() {
        let t = ProducerTable::new(10);
        let mut evicted = 0;
        for _ in 0..25 {
            evicted += t.init(None).unwrap().1;
        }
        assert!(t.len() <= 10);
        assert_eq!(evicted, 15);
    }

    #[test]
    fn a_producer_from_another_broker_is_adopted_at_its_epoch() {
        let t = ProducerTable::new(4);
        let (e, evicted) = t.adopt(77, 3);
        assert_eq!(evicted, 0);
        assert_eq!(e.lock().epoch, 3);
        assert!(Arc::ptr_eq(&e, &t.get(77).unwrap()));
        // Adopting again keeps the state.
        let (again, _) = t.adopt(77, 5);
        assert_eq!(again.lock().epoch, 3);
        assert_eq!(t.len(), 1);
        // It goes on at its sequence on a partition it has no state for here.
        let mut e = e.lock();
        assert_eq!(e.check("T", 0, 3, 14, 14), SeqCheck::Append);
        e.record("T", 0, 3, 14, 14, 500);
        assert_eq!(e.check("T", 0, 3, 15, 15), SeqCheck::Append);
        assert_eq!(e.check("T", 0, 3, 14, 14), SeqCheck::Duplicate(500));
        // A batch in flight at the failover may come after a later one.
        assert_eq!(e.check("T", 0, 3, 10, 13), SeqCheck::Append);
        // A stale epoch is still refused.
        assert_eq!(
            e.check("T", 0, 2, 16, 16),
            SeqCheck::Refuse(ResponseError::InvalidProducerEpoch)
        );
    }
}
