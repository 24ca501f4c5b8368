//! `shoal bench consume --pop`: the group consumes by POP (RocketMQ 5's broker-side queue
//! choice with invisibility leases, remoting POP_MESSAGE and ACK_MESSAGE) instead of pulling,
//! so the two paths can be measured with the same client, topic and tracker.

use super::client_config;
use super::track::{GroupSpec, Tracker};
use crate::admin_cmd::Common;
use anyhow::Context;
use shoal_client::pop::{PopConsumeResult, PopConsumer, PopConsumerConfig};
use shoal_client::MessageQueue;
use std::sync::Arc;
use std::time::Duration;

/// Messages a pop asks for (RocketMQ's limit).
const BATCH: i32 = 32;

/// Starts `n` POP consumers of `spec`'s group and topic, each its own client instance; every
/// message they receive is recorded by `tracker` and acknowledged.
pub(super) async fn start_pop_members(
    common: &Common,
    spec: &GroupSpec,
    n: usize,
    from_first: bool,
    tracker: &Arc<Tracker>,
) -> anyhow::Result<Vec<Arc<PopConsumer>>> {
    let mut out = Vec::with_capacity(n);
    for id in 0..n {
        let mut config = PopConsumerConfig::new(spec.group.clone(), spec.topic.clone());
        config.client = client_config(
            common,
            format!("bench{}-{}-p{id}", std::process::id(), spec.run),
        );
        config.batch = BATCH;
        config.from_first = from_first;
        config.poll = Duration::from_secs(5);
        let t = tracker.clone();
        let topic = spec.topic.clone();
        let listener = move |m: &shoal_client::PoppedMessage| {
            let mq = MessageQueue {
                topic: topic.clone(),
                broker_name: m.receipt.broker_name.clone(),
                queue_id: m.message.queue_id,
            };
            t.record(id, std::iter::once(&m.message.body[..]), &mq);
            PopConsumeResult::Success
        };
        out.push(
            PopConsumer::start(config, listener)
                .await
                .with_context(|| format!("starting POP consumer {id}"))?,
        );
    }
    Ok(out)
}
