//! `shoal consume --pop`: a POP consumer (RocketMQ 5's broker-side queue choice with
//! invisibility leases) that prints messages, acks them, and renews the lease of a message
//! whose handling is slow.

use crate::admin_cmd::Common;
use crate::client_cmd::{print_record, topic_exists, ConsumeArgs};
use anyhow::{bail, Context};
use shoal_client::pop::{PopConsumeResult, PopConsumer, PopConsumerConfig};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// `shoal consume --pop`.
pub(crate) async fn consume_pop(common: &Common, a: ConsumeArgs) -> anyhow::Result<()> {
    let from_first = match a.from.as_str() {
        "first" | "earliest" => true,
        "last" | "latest" => false,
        other => bail!(
            "--from {other:?} with --pop: a POP group starts at the first or last message (a time is not supported)"
        ),
    };
    if a.max_reconsume_times.is_some() {
        bail!("--max-reconsume-times with --pop: the broker moves a POP message to the dead-letter queue after the group's retryMaxTimes");
    }
    if a.invisible_secs == 0 || a.invisible_secs > 12 * 3600 {
        bail!("--invisible-secs must be 1 to 43200");
    }
    let mut waited = false;
    while !topic_exists(common, &a.topic).await? {
        if !waited && !common.json {
            eprintln!(
                "topic {} does not exist yet: waiting for it (Ctrl-C to stop)",
                a.topic
            );
        }
        waited = true;
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
    let mut config = PopConsumerConfig::new(a.group.clone(), a.topic.clone());
    config.client = common.client_config()?;
    config.expression = a.tag_expr.clone();
    config.sql = a.sql.clone();
    config.fifo = a.orderly;
    config.from_first = from_first || waited;
    config.invisible = Duration::from_secs(a.invisible_secs);
    config.retry_delay = Duration::from_secs(a.retry_delay_secs.max(1));
    if a.count.is_some() {
        // One message per pop: few are leased beyond the count (those come back later).
        config.batch = 1;
        config.concurrency = 1;
    }
    if let Some(name) = &a.instance {
        config.client.instance_name = Some(name.clone());
    }
    let seen = Arc::new(AtomicU64::new(0));
    let claimed = Arc::new(AtomicU64::new(0));
    let (done_tx, mut done_rx) = tokio::sync::watch::channel(false);
    let limit = a.count;
    let json_out = common.json;
    let fail = a.fail.clone();
    let counter = seen.clone();
    let listener = move |m: &shoal_client::PoppedMessage| {
        let msg = &m.message;
        let broker = &m.receipt.broker_name;
        let failing = fail
            .as_deref()
            .is_some_and(|f| f == "*" || String::from_utf8_lossy(&msg.body).contains(f));
        if failing {
            print_record(json_out, msg, broker, msg.queue_id, true, Some(m.attempt));
            return PopConsumeResult::Later;
        }
        let claim = match limit {
            None => true,
            Some(l) => claimed
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                    (c < l).then_some(c + 1)
                })
                .is_ok(),
        };
        if !claim {
            return PopConsumeResult::Later;
        }
        print_record(json_out, msg, broker, msg.queue_id, false, Some(m.attempt));
        let n = counter.fetch_add(1, Ordering::AcqRel) + 1;
        if limit.is_some_and(|l| n >= l) {
            let _ = done_tx.send(true);
        }
        PopConsumeResult::Success
    };
    let consumer = PopConsumer::start(config, listener)
        .await
        .context("starting the POP consumer")?;
    if !json_out {
        eprintln!(
            "POP consumer {} in group {} on {} ({}{}); Ctrl-C to stop",
            consumer.client_id(),
            a.group,
            a.topic,
            a.sql
                .as_ref()
                .map_or_else(|| a.tag_expr.clone(), |s| format!("SQL92: {s}")),
            if a.orderly { ", FIFO" } else { "" }
        );
    }
    let stop = async {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            if let Ok(mut term) = signal(SignalKind::terminate()) {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
                return;
            }
        }
        let _ = tokio::signal::ctrl_c().await;
    };
    tokio::select! {
        _ = stop => {}
        _ = async { while done_rx.changed().await.is_ok() { if *done_rx.borrow() { break; } } } => {}
    }
    // The messages handed out are acknowledged (or refused) before stopping: wait for the
    // answers, within the request timeout.
    let answered = || {
        let s = consumer.stats();
        s.acked.load(Ordering::Acquire) + s.ack_refused.load(Ordering::Acquire)
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while answered() < seen.load(Ordering::Acquire) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    consumer.shutdown().await;
    if !json_out {
        let s = consumer.stats();
        eprintln!(
            "{} messages consumed ({} acked, {} leases renewed, {} to retry)",
            seen.load(Ordering::Acquire),
            s.acked.load(Ordering::Relaxed),
            s.renewed.load(Ordering::Relaxed),
            s.retried.load(Ordering::Relaxed),
        );
    }
    Ok(())
}
