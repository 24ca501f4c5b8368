//! `shoal send` and `shoal consume`: produce and consume from the command line, usable in shell
//! pipelines (`--json` prints one JSON object per line).

use crate::admin_cmd::{parse_time, Common};
use anyhow::{bail, Context};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use shoal_client::consumer::{
    ConsumeConcurrentlyStatus, ConsumeContext, ConsumeOrderlyStatus, MessageListener,
};
use shoal_client::{ConsumeFromWhere, Message, MessageExt, MessageModel, Producer, PushConsumer};
use shoal_proto::message::property;
use std::io::{BufRead, IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Options of `shoal send`.
#[derive(Debug, Args)]
pub(crate) struct SendArgs {
    /// Topic.
    pub topic: String,
    /// Message body (`{i}` is replaced by the message number). Without it (and without
    /// --size), lines of standard input are sent as they arrive, one message each.
    #[arg(long)]
    pub body: Option<String>,
    /// Tag.
    #[arg(long)]
    pub tag: Option<String>,
    /// Key (`{i}` is replaced by the message number).
    #[arg(long)]
    pub key: Option<String>,
    /// A user property `NAME=VALUE` (repeatable; `{i}` in the value is replaced by the message
    /// number), for SQL92 selectors (`shoal consume --sql`).
    #[arg(long = "property", value_name = "NAME=VALUE")]
    pub properties: Vec<String>,
    /// Delay level, 1 to 18: 1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h.
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..=18))]
    pub delay_level: Option<i32>,
    /// Number of messages (with --body or --size; default 1). With standard input: stop
    /// after this many lines.
    #[arg(long)]
    pub count: Option<u64>,
    /// Body of this many bytes (generated) instead of --body.
    #[arg(long)]
    pub size: Option<usize>,
    /// Send ordered by this sharding key (same key, same queue).
    #[arg(long)]
    pub sharding_key: Option<String>,
    /// RocketMQ 5's message group of a FIFO message (`{i}` is replaced by the message number):
    /// the message carries it (`__SHARDINGKEY`), which a topic of message type FIFO requires,
    /// and is sent ordered by it (same group, same queue).
    #[arg(long, conflicts_with = "sharding_key")]
    pub message_group: Option<String>,
    /// Producer group.
    #[arg(long, default_value = "SHOAL_CLI_PRODUCER")]
    pub group: String,
    /// Pause between messages, in milliseconds (a steady rate instead of as fast as possible).
    #[arg(long, default_value_t = 0)]
    pub interval_ms: u64,
}

/// Options of `shoal consume`.
#[derive(Debug, Args)]
pub(crate) struct ConsumeArgs {
    /// Topic.
    pub topic: String,
    /// Consumer group.
    #[arg(long)]
    pub group: String,
    /// Tag expression: `*`, `tagA`, `tagA || tagB`.
    #[arg(long, default_value = "*")]
    pub tag_expr: String,
    /// SQL92 selector over message properties instead of a tag expression (RocketMQ's
    /// `MessageSelector.bySql`), e.g. `--sql "region = 'eu' AND amount > 100"`; evaluated by
    /// the broker, which needs `enable_property_filter` (on in `shoal dev`).
    #[arg(long, conflicts_with = "tag_expr")]
    pub sql: Option<String>,
    /// Consume orderly (one queue at a time, under the broker lock).
    #[arg(long)]
    pub orderly: bool,
    /// Broadcasting: every consumer of the group gets every message.
    #[arg(long)]
    pub broadcast: bool,
    /// Where a new group starts: `first`, `last`, or a time (epoch ms, RFC 3339, `10m` ago).
    #[arg(long, default_value = "last")]
    pub from: String,
    /// Exit after this many deliveries: exactly this many are printed and answered (acknowledged,
    /// or failed with --fail); messages fetched beyond them are left for the group (not
    /// committed).
    #[arg(long)]
    pub count: Option<u64>,
    /// Allocation strategy (AVG, AVG_BY_CIRCLE, CONSISTENT_HASH, BALANCED_STICKY, STICKY, ...).
    /// Default: AVG in classic mode; in coordinated mode the broker's default assignor
    /// (STICKY: balanced, moves the fewest queues when members come and go).
    #[arg(long)]
    pub strategy: Option<String>,
    /// Instance name (the client id is `ip@instance`; default: pid and time).
    #[arg(long)]
    pub instance: Option<String>,
    /// Safety-net rebalance period in seconds (notifications trigger rebalances at once).
    #[arg(long, default_value_t = 20)]
    pub rebalance_interval_secs: u64,
    /// Group protocol: `auto` (coordinated where the broker coordinates groups, classic
    /// against RocketMQ brokers or with classic-only members), `coordinated`, `classic`.
    #[arg(long, default_value = "auto")]
    pub protocol: shoal_client::GroupProtocol,
    /// Coordinated mode: static membership instance id (a restart within the session timeout
    /// keeps the same queues).
    #[arg(long)]
    pub instance_id: Option<String>,
    /// Fail (reconsume later) every message whose body contains TEXT (`*`: every message), for
    /// demos and tests of retries and dead-letter queues. Failed messages are printed with
    /// `FAILED` (`"failed": true` with --json).
    #[arg(long, value_name = "TEXT")]
    pub fail: Option<String>,
    /// Attempts before a failed message goes to the dead-letter queue (default 16; 0: at the
    /// first failure).
    #[arg(long)]
    pub max_reconsume_times: Option<i32>,
    /// Session timeout announced to Shoal brokers, ms: a member silent this long leaves the
    /// group and its queue locks (leases) end; a frozen member's queues move after it.
    #[arg(long, default_value_t = 10_000)]
    pub session_timeout_ms: u64,
    /// Consume by POP (RocketMQ 5): the broker picks the queues and leases each message; no
    /// rebalance, any number of consumers per queue. With --orderly: FIFO pops (a queue hands
    /// out its next message only after the previous one is acknowledged).
    #[arg(long, conflicts_with_all = ["broadcast", "protocol", "instance_id", "strategy"])]
    pub pop: bool,
    /// POP: invisibility of a received message, seconds (renewed while the listener runs).
    #[arg(long, default_value_t = 60, requires = "pop")]
    pub invisible_secs: u64,
    /// POP: a failed message comes back after this many seconds.
    #[arg(long, default_value_t = 10, requires = "pop")]
    pub retry_delay_secs: u64,
}

fn progress(total: u64) -> ProgressBar {
    let pb = ProgressBar::new(total);
    if std::io::stderr().is_terminal() && total > 1 {
        pb.set_draw_target(ProgressDrawTarget::stderr());
        if let Ok(style) =
            ProgressStyle::with_template("{bar:40} {pos}/{len} messages {per_sec} eta {eta}")
        {
            pb.set_style(style);
        }
    } else {
        pb.set_draw_target(ProgressDrawTarget::hidden());
    }
    pb
}

/// Whether the name servers know `topic`; an unreachable name server is an error, said once
/// (the clients would retry and log it again and again).
pub(crate) async fn topic_exists(common: &Common, topic: &str) -> anyhow::Result<bool> {
    let admin = common.admin()?;
    let r = admin.topic_route(topic).await;
    admin.shutdown();
    match r {
        Ok(_) => Ok(true),
        Err(shoal_client::admin::AdminError::TopicNotFound(_)) => Ok(false),
        Err(e) => {
            bail!("{e} (is the name server running? give it with --namesrv or SHOAL_NAMESRV)")
        }
    }
}

/// `shoal send`.
pub(crate) async fn send(common: &Common, a: SendArgs) -> anyhow::Result<()> {
    if a.body.is_some() && a.size.is_some() {
        bail!("give either --body or --size, not both");
    }
    topic_exists(common, &a.topic).await?;
    let producer = Producer::builder(&a.group)
        .client_config(common.client_config()?)
        .start()
        .await
        .context("starting the producer")?;
    // The route and the broker's kind before the first send, so that a one-shot send goes
    // as the library's later sends do (binary headers to a Shoal broker). A failure here is
    // reported by the send that follows.
    let _ = producer.prepare_topic(&a.topic).await;
    let from_stdin = a.body.is_none() && a.size.is_none();
    let count = a.count.unwrap_or(if from_stdin { u64::MAX } else { 1 });
    // Bodies arrive through a small channel: standard input is read line by line by a thread
    // and each line is sent as soon as it is read (`tail -f log | shoal send T` works).
    let (tx, mut bodies) = tokio::sync::mpsc::channel::<std::io::Result<Vec<u8>>>(64);
    if from_stdin {
        if std::io::stdin().is_terminal() {
            eprintln!("reading message bodies from standard input, one per line (Ctrl-D ends)");
        }
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines().take(count as usize) {
                let end = line.is_err();
                if tx.blocking_send(line.map(String::into_bytes)).is_err() || end {
                    break;
                }
            }
        });
    } else {
        let body = match (&a.body, a.size) {
            (Some(b), _) => b.clone().into_bytes(),
            (None, Some(n)) => (0..n).map(|i| b'a' + (i % 26) as u8).collect(),
            (None, None) => Vec::new(),
        };
        tokio::spawn(async move {
            for _ in 0..count {
                if tx.send(Ok(body.clone())).await.is_err() {
                    break;
                }
            }
        });
    }
    let pb = progress(if from_stdin { 0 } else { count });
    let stdout = std::io::stdout();
    let mut stdout_open = true;
    let mut sent = 0u64;
    let mut failed = 0u64;
    let mut i = 0u64;
    while let Some(body) = bodies.recv().await {
        let body = body.context("reading standard input")?;
        if a.interval_ms > 0 && i > 0 {
            tokio::time::sleep(Duration::from_millis(a.interval_ms)).await;
        }
        let n = i;
        i += 1;
        let body = if a.size.is_none() && a.body.is_some() {
            // `{i}` in --body is replaced by the message number (unique bodies for tests).
            String::from_utf8_lossy(&body)
                .replace("{i}", &n.to_string())
                .into_bytes()
        } else {
            body
        };
        let mut msg = Message::new(a.topic.clone(), body);
        if let Some(t) = &a.tag {
            msg.set_tags(t.clone())?;
        }
        if let Some(k) = &a.key {
            msg.set_keys([k.replace("{i}", &n.to_string())])?;
        }
        for p in &a.properties {
            let Some((name, value)) = p.split_once('=') else {
                bail!("--property {p:?}: expected NAME=VALUE");
            };
            msg.put_property(name, value.replace("{i}", &n.to_string()))?;
        }
        if let Some(d) = a.delay_level {
            msg.set_delay_level(d)?;
        }
        let group = a
            .message_group
            .as_ref()
            .map(|g| g.replace("{i}", &n.to_string()));
        if let Some(g) = &group {
            msg.put_property(property::SHARDING_KEY, g.clone())?;
        }
        let r = match group.as_ref().or(a.sharding_key.as_ref()) {
            Some(k) => producer.send_ordered(msg, k).await,
            None => producer.send(msg).await,
        };
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                // One line per failed message; the others are still sent.
                failed += 1;
                pb.suspend(|| eprintln!("error: message {n} to {} not sent: {e}", a.topic));
                pb.inc(1);
                continue;
            }
        };
        sent += 1;
        pb.inc(1);
        let line = if common.json {
            json!({
                "msgId": r.msg_id, "offsetMsgId": r.offset_msg_id, "status": format!("{:?}", r.status),
                "topic": r.message_queue.topic, "broker": r.message_queue.broker_name,
                "queue": r.message_queue.queue_id, "queueOffset": r.queue_offset,
                // The message number `{i}` stood for: a failed send prints no line.
                "n": n,
            })
            .to_string()
        } else {
            format!(
                "sent {} to {} queue {} offset {} ({:?}, offset id {})",
                r.msg_id,
                r.message_queue.broker_name,
                r.message_queue.queue_id,
                r.queue_offset,
                r.status,
                r.offset_msg_id
            )
        };
        // One line per message with --json, for reading standard input, or for up to 1000
        // messages; larger runs show the progress bar and the total only. A closed standard
        // output (e.g. `| head`) stops the printing, not the sending.
        if stdout_open && (common.json || from_stdin || count <= 1000) {
            let write = |line: &str| {
                let mut out = stdout.lock();
                writeln!(out, "{line}").and_then(|()| out.flush())
            };
            let result = if pb.is_hidden() {
                write(&line)
            } else {
                pb.suspend(|| write(&line))
            };
            match result {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => stdout_open = false,
                Err(e) => return Err(e.into()),
            }
        }
    }
    pb.finish_and_clear();
    producer.shutdown().await;
    if from_stdin && i == 0 {
        bail!(
            "standard input was empty: nothing read, no message sent to {} (give the body with --body or --size, or lines on standard input)",
            a.topic
        );
    }
    if failed > 0 {
        bail!(
            "{failed} of {} messages not sent to {} ({sent} sent)",
            sent + failed,
            a.topic
        );
    }
    if !common.json {
        eprintln!("{sent} messages sent to {}", a.topic);
    }
    Ok(())
}

fn print_message(json_out: bool, m: &MessageExt, ctx: &ConsumeContext, failed: bool) {
    let mq = &ctx.message_queue;
    print_record(json_out, m, &mq.broker_name, mq.queue_id, failed, None);
}

/// Prints one message (a line of text, or of JSON); `attempt` is a POP delivery's.
pub(crate) fn print_record(
    json_out: bool,
    m: &MessageExt,
    broker: &str,
    queue: i32,
    failed: bool,
    attempt: Option<u32>,
) {
    let line = if json_out {
        let mut v = json!({
            "failed": failed,
            "msgId": m.msg_id(), "topic": m.topic, "broker": broker,
            "queue": queue, "queueOffset": m.queue_offset, "tags": m.tags(),
            "keys": m.keys(), "reconsumeTimes": m.reconsume_times, "storeTimestamp": m.store_timestamp,
            "properties": m.properties,
            "body": String::from_utf8_lossy(&m.body),
            // When the listener got it (µs since the epoch): delivery records of separate
            // processes can be ordered by it.
            "atUs": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or_default(),
        });
        if let Some(a) = attempt {
            v["attempt"] = json!(a);
        }
        v.to_string()
    } else {
        format!(
            "{}{} {}#{} offset {}{} tags={} keys={} body={}",
            if failed { "FAILED " } else { "" },
            m.msg_id(),
            broker,
            queue,
            m.queue_offset,
            attempt.map_or(String::new(), |a| format!(" attempt {a}")),
            m.tags().unwrap_or("-"),
            m.keys().unwrap_or("-"),
            String::from_utf8_lossy(&m.body)
        )
    };
    let mut out = std::io::stdout().lock();
    // A closed pipe (e.g. `| head`) is not an error worth a panic.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// `shoal consume`: prints messages until Ctrl-C / SIGTERM (or --count), then leaves the group
/// gracefully (offsets committed, queues handed over at once).
/// (`--pop` is [`consume_pop`](crate::pop_cmd), chosen by the caller.)
pub(crate) async fn consume(common: &Common, a: ConsumeArgs) -> anyhow::Result<()> {
    let (mut from, ts) = match a.from.as_str() {
        "first" | "earliest" => (ConsumeFromWhere::ConsumeFromFirstOffset, None),
        "last" | "latest" => (ConsumeFromWhere::ConsumeFromLastOffset, None),
        other => match parse_time(other) {
            Ok(t) => (ConsumeFromWhere::ConsumeFromTimestamp, Some(t)),
            Err(_) => bail!(
                "cannot read --from {other:?}: use first, last, epoch milliseconds, an RFC 3339 time or a duration ago such as 10m"
            ),
        },
    };
    if let Some(s) = &a.strategy {
        if shoal_group::strategy_by_name(s).is_err() {
            bail!(
                "unknown allocation strategy {s:?}; known: {}",
                shoal_group::STRATEGY_NAMES.join(", ")
            );
        }
    }
    // Before joining: is the name server there, and does the topic exist? A consumer of a
    // topic that does not exist yet waits here for it (polling the name server each second)
    // and then reads it from its first message: every message of a topic created after the
    // consumer started is new to it, and the consumer learns the route at once instead of at
    // its next 30 s route refresh.
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
    if waited && matches!(from, ConsumeFromWhere::ConsumeFromLastOffset) {
        from = ConsumeFromWhere::ConsumeFromFirstOffset;
    }
    let seen = Arc::new(AtomicU64::new(0));
    // With --count, a listener call beyond the limit neither prints nor acknowledges: it
    // waits (on its blocking thread) until the consumer stopped its queue (hand-over or
    // shutdown), so the offsets committed then stay below it; the queue's lock is kept until
    // it returns. Orderly listeners suspend the queue instead.
    let claimed = Arc::new(AtomicU64::new(0));
    let (done_tx, mut done_rx) = tokio::sync::watch::channel(false);
    let limit = a.count;
    let json_out = common.json;
    let counter = seen.clone();
    let tick = move || {
        let n = counter.fetch_add(1, Ordering::AcqRel) + 1;
        if limit.is_some_and(|l| n >= l) {
            let _ = done_tx.send(true);
        }
    };
    // Claims room for a batch under --count: false when the limit is reached already (the
    // batch is not consumed).
    let claim = {
        let claimed = claimed.clone();
        move |n: usize| match limit {
            None => true,
            Some(l) => claimed
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                    (c + n as u64 <= l).then_some(c + n as u64)
                })
                .is_ok(),
        }
    };
    let fail = a.fail.clone();
    let fails = move |m: &MessageExt| {
        fail.as_deref()
            .is_some_and(|f| f == "*" || String::from_utf8_lossy(&m.body).contains(f))
    };
    // Every delivery counts towards --count, failed ones too: a run that fails every message
    // ends after N deliveries instead of waiting for a success that never comes.
    let failures = Arc::new(AtomicU64::new(0));
    let failed_counter = failures.clone();
    let deliver = move |msgs: &[MessageExt], ctx: &ConsumeContext| {
        let failed = msgs.iter().any(&fails);
        for m in msgs {
            print_message(json_out, m, ctx, failed);
            if failed {
                failed_counter.fetch_add(1, Ordering::AcqRel);
            }
            tick();
        }
        failed
    };
    let listener = if a.orderly {
        MessageListener::orderly(move |msgs, ctx| {
            if !claim(msgs.len()) {
                return ConsumeOrderlyStatus::SuspendCurrentQueueAMoment;
            }
            if deliver(msgs, ctx) {
                return ConsumeOrderlyStatus::SuspendCurrentQueueAMoment;
            }
            ConsumeOrderlyStatus::Success
        })
    } else {
        MessageListener::concurrently(move |msgs, ctx| {
            if !claim(msgs.len()) {
                futures::executor::block_on(ctx.queue_stopped());
                // The queue was stopped: "later" on a stopped queue keeps the messages below
                // the committed offset (nothing is sent back).
                return ConsumeConcurrentlyStatus::ReconsumeLater;
            }
            if deliver(msgs, ctx) {
                return ConsumeConcurrentlyStatus::ReconsumeLater;
            }
            ConsumeConcurrentlyStatus::ConsumeSuccess
        })
    };
    let mut builder = PushConsumer::builder(&a.group).client_config(common.client_config()?);
    builder = match &a.sql {
        Some(sql) => builder.subscribe_sql(a.topic.clone(), sql.clone()),
        None => builder.subscribe(a.topic.clone(), a.tag_expr.clone()),
    };
    let mut builder = builder
        .message_model(if a.broadcast {
            MessageModel::Broadcasting
        } else {
            MessageModel::Clustering
        })
        .consume_from_where(from)
        .protocol(a.protocol)
        .rebalance_interval(Duration::from_secs(a.rebalance_interval_secs.max(1)))
        .session_timeout(Duration::from_millis(a.session_timeout_ms))
        .configure(|c| {
            c.session_heartbeat_interval = (c.session_timeout / 3).min(Duration::from_secs(3));
        });
    if let Some(id) = &a.instance_id {
        builder = builder.instance_id(id.clone());
    }
    if let Some(s) = &a.strategy {
        builder = builder.allocate_strategy(s.clone());
    }
    if let Some(ts) = ts {
        builder = builder.consume_timestamp_ms(ts);
    }
    if let Some(n) = a.max_reconsume_times {
        if n < 0 {
            bail!("--max-reconsume-times must be 0 or more");
        }
        builder = builder.max_reconsume_times(n);
    }
    if let Some(name) = &a.instance {
        builder = builder.instance_name(name.clone());
    }
    if limit.is_some() {
        builder = builder.consume_batch_size(1);
    }
    let consumer = builder
        .start(listener)
        .await
        .context("starting the consumer")?;
    if !json_out {
        eprintln!(
            "consumer {} in group {} subscribed to {} ({}); Ctrl-C to stop",
            consumer.client_id(),
            a.group,
            a.topic,
            a.sql
                .as_ref()
                .map_or_else(|| a.tag_expr.clone(), |s| format!("SQL92: {s}"))
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
    consumer.shutdown().await;
    if !json_out {
        let failed = failures.load(Ordering::Acquire);
        let failed = if failed > 0 {
            format!(" ({failed} failed, sent back for a later attempt)")
        } else {
            String::new()
        };
        eprintln!(
            "{} messages consumed{failed}; offsets committed, queues handed over",
            seen.load(Ordering::Acquire)
        );
    }
    Ok(())
}
