//! The POP engine's journal records and their one-line text form:
//!
//! ```text
//! B <group> <topic> <queueId> <ack> <cursor> <fifo 0|1>
//! C <group> <topic> <queueId> <cursor>
//! G <group> <topic> <queueId> <offset> <popTime> <deadline> <attempts> <consumer>
//! D <group> <topic> <queueId> <offset>
//! ```
//!
//! Group, topic and consumer names hold no spaces (RocketMQ's name rules); a line that does
//! not parse (a torn last write) ends a replay.

use super::QueueKey;
use std::fmt::Write as _;

/// One change of the engine's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PopRecord {
    /// A queue's baseline (snapshots): acked offset, cursor, FIFO.
    Base {
        /// The queue.
        key: QueueKey,
        /// Every offset below is done.
        ack: u64,
        /// Next offset never handed out.
        cursor: u64,
        /// Consumed in order.
        fifo: bool,
    },
    /// The cursor moved (offsets passed over are done unless leased).
    Cursor {
        /// The queue.
        key: QueueKey,
        /// The new cursor.
        cursor: u64,
    },
    /// A lease granted or changed.
    Grant {
        /// The queue.
        key: QueueKey,
        /// Queue offset.
        offset: u64,
        /// Receipt time.
        pop_time: u64,
        /// Lease deadline, ms.
        deadline: u64,
        /// Deliveries so far.
        attempts: u32,
        /// Who holds it.
        consumer: String,
    },
    /// An offset is done (acked, filtered out, copied to retry or DLQ).
    Done {
        /// The queue.
        key: QueueKey,
        /// Queue offset.
        offset: u64,
    },
}

/// A journal line that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad POP journal line: {0}")]
pub struct RecordError(pub String);

fn name(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}

impl PopRecord {
    /// Appends the record's line (with its `\n`) to `out`.
    pub fn encode(&self, out: &mut String) {
        let k = |out: &mut String, key: &QueueKey| {
            let _ = write!(
                out,
                " {} {} {}",
                name(&key.group),
                name(&key.topic),
                key.queue_id
            );
        };
        match self {
            PopRecord::Base {
                key,
                ack,
                cursor,
                fifo,
            } => {
                out.push('B');
                k(out, key);
                let _ = write!(out, " {ack} {cursor} {}", u8::from(*fifo));
            }
            PopRecord::Cursor { key, cursor } => {
                out.push('C');
                k(out, key);
                let _ = write!(out, " {cursor}");
            }
            PopRecord::Grant {
                key,
                offset,
                pop_time,
                deadline,
                attempts,
                consumer,
            } => {
                out.push('G');
                k(out, key);
                let _ = write!(
                    out,
                    " {offset} {pop_time} {deadline} {attempts} {}",
                    name(consumer)
                );
            }
            PopRecord::Done { key, offset } => {
                out.push('D');
                k(out, key);
                let _ = write!(out, " {offset}");
            }
        }
        out.push('\n');
    }

    /// Parses one line (without its `\n`).
    ///
    /// # Errors
    /// [`RecordError`] for anything else.
    pub fn decode(line: &str) -> Result<Self, RecordError> {
        let bad = || RecordError(line.chars().take(120).collect());
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() < 5 {
            return Err(bad());
        }
        let key = QueueKey::new(f[1], f[2], f[3].parse().map_err(|_| bad())?);
        let num = |i: usize| -> Result<u64, RecordError> {
            f.get(i).and_then(|v| v.parse().ok()).ok_or_else(bad)
        };
        let r = match (f[0], f.len()) {
            ("B", 7) => PopRecord::Base {
                key,
                ack: num(4)?,
                cursor: num(5)?,
                fifo: num(6)? == 1,
            },
            ("C", 5) => PopRecord::Cursor {
                key,
                cursor: num(4)?,
            },
            ("G", 9) => PopRecord::Grant {
                key,
                offset: num(4)?,
                pop_time: num(5)?,
                deadline: num(6)?,
                attempts: u32::try_from(num(7)?).map_err(|_| bad())?,
                consumer: f[8].to_owned(),
            },
            ("D", 5) => PopRecord::Done {
                key,
                offset: num(4)?,
            },
            _ => return Err(bad()),
        };
        Ok(r)
    }
}
