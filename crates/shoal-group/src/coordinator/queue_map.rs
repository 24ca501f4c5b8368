//! Serde for maps keyed by [`MessageQueue`] (JSON object keys must be strings): a list of
//! `{"queue": …, "epoch": …}` entries.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use shoal_proto::mq::MessageQueue;
use std::collections::BTreeMap;

#[derive(Serialize, Deserialize)]
struct Entry {
    queue: MessageQueue,
    epoch: i32,
}

pub(crate) fn serialize<S: Serializer>(
    map: &BTreeMap<MessageQueue, i32>,
    s: S,
) -> Result<S::Ok, S::Error> {
    let list: Vec<Entry> = map
        .iter()
        .map(|(q, e)| Entry {
            queue: q.clone(),
            epoch: *e,
        })
        .collect();
    list.serialize(s)
}

pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<MessageQueue, i32>, D::Error> {
    let list: Vec<Entry> = Vec::deserialize(d)?;
    Ok(list.into_iter().map(|e| (e.queue, e.epoch)).collect())
}
