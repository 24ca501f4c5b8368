//! The transaction check service: every `transaction_check_interval_ms` it runs one
//! [`CheckRound`] over the half queue, writes back and checks due half messages, discards those
//! checked too often, and stores its progress; on start it rebuilds the remembered decisions
//! from the op queue.

use super::check::{parse_op_body, CheckLimits, CheckRound, HalfView, Verdict};
use super::end::transaction_key;
use super::half::{self, OP_DECISION};
use super::{Decision, CHECK_GROUP, HALF_TOPIC, OP_TOPIC};
use crate::clock::wall_ms;
use crate::reply::{blocking, Reject};
use crate::shared::Shared;
use shoal_proto::code::request_code as rc;
use shoal_proto::header::CheckTransactionStateRequestHeader;
use shoal_proto::message::{decode_records, property, DecodeOptions, MessageExt};
use shoal_proto::RemotingCommand;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

/// Longest a round may take before it stops and stores its progress (RocketMQ's 60 s).
const MAX_ROUND: Duration = Duration::from_secs(60);
/// Messages read per store call.
const BATCH: usize = 32;

/// What one round did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RoundReport {
    /// Half messages found decided.
    pub decided: usize,
    /// CHECK_TRANSACTION_STATE requests sent.
    pub checked: usize,
    /// Half messages discarded.
    pub discarded: usize,
    /// Half messages written back within their immunity time.
    pub renewed: usize,
    /// Progress stored: next half offset, next op offset.
    pub progress: (u64, u64),
}

/// Starts the check service.
pub(crate) fn start(b: Arc<Shared>) -> JoinHandle<()> {
    tokio::spawn(async move {
        match rebuild_decisions(&b).await {
            Ok(0) => {}
            Ok(n) => info!(
                decisions = n,
                "transaction decisions rebuilt from the op queue"
            ),
            Err(e) => warn!(error = %e.remark, "could not read the transaction op queue"),
        }
        let interval = Duration::from_millis(b.config.transaction_check_interval_ms.max(100));
        loop {
            tokio::time::sleep(interval).await;
            if !b.writes_log() {
                // A replica: the master checks, and its decisions reach this log.
                continue;
            }
            match check_once(&b).await {
                Ok(r) if r.checked + r.discarded + r.renewed > 0 => {
                    debug!(report = ?r, "transaction check round")
                }
                Ok(_) => {}
                Err(e) => {
                    warn!(error = %e.remark, "transaction check round failed; retrying next round")
                }
            }
        }
    })
}

fn start_offset(b: &Shared, topic: &str) -> u64 {
    let min = b.store.min_offset(topic, 0);
    let stored = b
        .store
        .query_offset(CHECK_GROUP, topic, 0)
        .filter(|o| *o >= 0)
        .map(|o| o as u64)
        .unwrap_or(min);
    stored.max(min)
}

async fn read(
    b: &Arc<Shared>,
    topic: &'static str,
    offset: u64,
) -> Result<shoal_store::GetMessageResult, Reject> {
    let store = b.store.clone();
    blocking(move || {
        store
            .get_messages(topic, 0, offset, BATCH, 4 * 1024 * 1024, &|_| true)
            .map_err(Reject::system)
    })
    .await
}

/// Reads the op queue from the stored progress to its end into the decision table (the
/// decisions of transactions still in the half queue's unchecked part).
pub(crate) async fn rebuild_decisions(b: &Arc<Shared>) -> Result<usize, Reject> {
    if b.topics.get(OP_TOPIC).is_none() {
        return Ok(0);
    }
    let mut offset = start_offset(b, OP_TOPIC);
    let mut n = 0;
    loop {
        let got = read(b, OP_TOPIC, offset).await?;
        if got.message_count == 0 {
            return Ok(n);
        }
        for m in decode_records(&got.messages, &DecodeOptions::default()).messages {
            if let Some(key) = m.property(property::TRANSACTION_ID) {
                let d = match m.property(OP_DECISION) {
                    Some("commit") => Decision::Committed,
                    _ => Decision::RolledBack,
                };
                b.transactions.decisions.lock().decide(key, d);
                n += 1;
            }
        }
        offset = got.next_begin_offset.max(offset + 1);
    }
}

fn view(m: &MessageExt) -> HalfView {
    HalfView {
        queue_offset: m.queue_offset.max(0) as u64,
        born_timestamp: m.born_timestamp,
        store_timestamp: m.store_timestamp,
        check_times: m
            .property(property::TRANSACTION_CHECK_TIMES)
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0),
        immunity_secs: m
            .property(property::CHECK_IMMUNITY_TIME_IN_SECONDS)
            .and_then(|t| t.trim().parse().ok()),
        prepared_offset: m
            .property(property::TRAN_PREPARED_QUEUE_OFFSET)
            .and_then(|t| t.trim().parse().ok()),
    }
}

/// Runs one check round now.
pub(crate) async fn check_once(b: &Arc<Shared>) -> Result<RoundReport, Reject> {
    if b.topics.get(HALF_TOPIC).is_none() {
        return Ok(RoundReport::default());
    }
    let limits = CheckLimits {
        timeout_ms: b.config.transaction_timeout_ms as i64,
        check_max: b.config.transaction_check_max,
    };
    let half_start = start_offset(b, HALF_TOPIC);
    let op_start = start_offset(b, OP_TOPIC);
    let mut round = CheckRound::new(limits, half_start, op_start, wall_ms());
    let mut report = RoundReport::default();

    // Decisions recorded since the last round.
    if b.topics.get(OP_TOPIC).is_some() {
        let mut offset = op_start;
        loop {
            let got = read(b, OP_TOPIC, offset).await?;
            if got.message_count == 0 {
                break;
            }
            for m in decode_records(&got.messages, &DecodeOptions::default()).messages {
                round.add_op(m.queue_offset.max(0) as u64, &parse_op_body(&m.body));
            }
            offset = got.next_begin_offset.max(offset + 1);
        }
    }

    let began = Instant::now();
    'walk: while began.elapsed() < MAX_ROUND {
        let at = round.next_half();
        let got = read(b, HALF_TOPIC, at).await?;
        if got.message_count == 0 {
            if got.next_begin_offset > at {
                round.skip_to(got.next_begin_offset); // expired by retention
                continue;
            }
            break;
        }
        for m in decode_records(&got.messages, &DecodeOptions::default()).messages {
            let v = view(&m);
            if v.queue_offset > round.next_half() {
                round.skip_to(v.queue_offset);
            }
            round.set_now(wall_ms());
            match round.judge(&v) {
                Verdict::Decided => report.decided += 1,
                Verdict::Wait => break 'walk,
                Verdict::Discard => {
                    discard(b, &m).await?;
                    report.discarded += 1;
                }
                Verdict::Renew => {
                    crate::send::put(b, vec![half::renewed(&m, None, true)?]).await?;
                    report.renewed += 1;
                }
                Verdict::Check => {
                    let key = transaction_key(&m);
                    let known = b.transactions.decisions.lock().get(&key);
                    if let Some(d) = known {
                        // Decided through another copy: record it for this one, ask nobody.
                        super::end::decide(b, &m, d).await?;
                        report.decided += 1;
                    } else {
                        send_check(b, &m, v.check_times + 1).await?;
                        report.checked += 1;
                    }
                }
            }
        }
    }
    let (h, o) = round.progress();
    b.store.commit_offset(CHECK_GROUP, HALF_TOPIC, 0, h as i64);
    if b.topics.get(OP_TOPIC).is_some() {
        b.store.commit_offset(CHECK_GROUP, OP_TOPIC, 0, o as i64);
    }
    report.progress = (h, o);
    Ok(report)
}

/// Moves a half message checked `transaction_check_max` times to the discard topic (or drops
/// it when the topic is configured empty).
async fn discard(b: &Arc<Shared>, m: &MessageExt) -> Result<(), Reject> {
    b.transactions
        .counters
        .discarded
        .fetch_add(1, Ordering::Relaxed);
    let topic = b.config.transaction_discard_topic.clone();
    warn!(transaction = %transaction_key(m), real_topic = m.property(property::REAL_TOPIC).unwrap_or("-"),
        discard_topic = %topic, "half message checked too many times without a decision: discarded");
    if topic.is_empty() {
        return Ok(());
    }
    half::ensure_topic(b, &topic)?;
    crate::send::put(b, vec![half::discarded(m, &topic)?]).await?;
    Ok(())
}

/// Writes a half message back (check count raised) and asks a producer of its group about it
/// (CHECK_TRANSACTION_STATE, oneway), as RocketMQ does: the header names the copy; the body is
/// the message with its real topic and queue.
async fn send_check(b: &Arc<Shared>, m: &MessageExt, check_times: i32) -> Result<(), Reject> {
    let put = crate::send::put(b, vec![half::renewed(m, Some(check_times), false)?]).await?;
    let copy = put
        .messages
        .first()
        .ok_or_else(|| Reject::system("the store stored nothing"))?;
    let group = m.property(property::PGROUP).unwrap_or_default().to_string();
    let channels = b.groups.read(|g, _| g.clients().producer_channels(&group));
    let counters = &b.transactions.counters;
    if channels.is_empty() {
        // A front end's producer (gRPC) may know the transaction.
        if let Some(checker) = b.transaction_checker.get() {
            let (real_topic, real_qid) = half::real_destination(m)?;
            let mut message = m.clone();
            message.topic = real_topic;
            message.queue_id = real_qid;
            let asked = checker.ask(super::front::TransactionCheck {
                producer_group: group.clone(),
                message,
                commit_log_offset: copy.physical_offset as i64,
                queue_offset: copy.queue_offset as i64,
            });
            if asked {
                counters.checks_sent.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
        }
        counters
            .checks_without_producer
            .fetch_add(1, Ordering::Relaxed);
        debug!(%group, "transaction check due but no producer of the group is connected");
        return Ok(());
    }
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let ch = &channels[NEXT.fetch_add(1, Ordering::Relaxed) % channels.len()];
    let Some(conn) = b.connections.get(ch.conn_id) else {
        counters
            .checks_without_producer
            .fetch_add(1, Ordering::Relaxed);
        return Ok(());
    };
    let uniq = m.property(property::UNIQ_KEY).map(str::to_string);
    let header = CheckTransactionStateRequestHeader {
        topic: Some(HALF_TOPIC.into()),
        tran_state_table_offset: copy.queue_offset as i64,
        commit_log_offset: copy.physical_offset as i64,
        msg_id: uniq.clone(),
        transaction_id: uniq,
        offset_msg_id: Some(copy.offset_msg_id()),
        ..Default::default()
    };
    let (real_topic, real_qid) = half::real_destination(m)?;
    let mut body_msg = m.clone();
    body_msg.topic = real_topic;
    body_msg.queue_id = real_qid;
    body_msg.queue_offset = copy.queue_offset as i64;
    body_msg.commit_log_offset = copy.physical_offset as i64;
    body_msg.store_timestamp = copy.store_timestamp;
    body_msg.properties.insert(
        property::TRANSACTION_CHECK_TIMES.into(),
        check_times.to_string(),
    );
    let body = body_msg.to_bytes()?;
    let mut req = RemotingCommand::request_with_header(rc::CHECK_TRANSACTION_STATE, &header)
        .with_body(body.to_vec());
    req.set_oneway();
    counters.checks_sent.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = conn.oneway(req).await {
        warn!(%group, peer = %conn.peer_addr(), error = %e, "could not send CHECK_TRANSACTION_STATE");
    }
    Ok(())
}
