//! Shoal's extension that lets every broker's Kafka listener serve the whole cluster.
//!
//! A broker that runs a Kafka listener names it in its REGISTER_BROKER request with the
//! extFields [`field::KAFKA_ADDR`] and [`field::KAFKA_NODE_ID`]. A Shoal name server keeps it
//! beside the broker's address and, to a GET_ROUTEINFO_BY_TOPIC or GET_BROKER_CLUSTER_INFO
//! request carrying [`field::WANT_KAFKA`]` = true`, adds `kafkaListeners` (broker id →
//! [`KafkaListener`](crate::body::KafkaListener)) to every `BrokerData` it answers. Official
//! clients never ask, so they never see the field; an Apache RocketMQ name server ignores
//! both fields.

use crate::RemotingCommand;

/// extFields of the Kafka cluster view.
pub mod field {
    /// REGISTER_BROKER request: `host:port` of the broker's Kafka listener.
    pub const KAFKA_ADDR: &str = "shoalKafkaAddr";
    /// REGISTER_BROKER request: the Kafka node id of that listener.
    pub const KAFKA_NODE_ID: &str = "shoalKafkaNodeId";
    /// REGISTER_BROKER request of a replicated group's master: its master epoch (the Kafka
    /// leader epoch of the group's partitions).
    pub const KAFKA_LEADER_EPOCH: &str = "shoalKafkaLeaderEpoch";
    /// REGISTER_BROKER request of a replicated group's master: its in-sync set as registered
    /// broker ids, comma-separated (the Kafka ISR of the group's partitions).
    pub const KAFKA_IN_SYNC: &str = "shoalKafkaInSync";
    /// GET_ROUTEINFO_BY_TOPIC and GET_BROKER_CLUSTER_INFO request: `true` asks for the
    /// brokers' Kafka listeners in the answer.
    pub const WANT_KAFKA: &str = "shoalKafka";
}

/// Asks for the Kafka listeners in a route or cluster answer ([`field::WANT_KAFKA`]).
pub fn want_listeners(cmd: &mut RemotingCommand) {
    cmd.ext_fields
        .get_or_insert_with(Default::default)
        .insert(field::WANT_KAFKA, "true");
}

/// True when a request asks for the Kafka listeners.
pub fn wants_listeners(cmd: &RemotingCommand) -> bool {
    cmd.ext(field::WANT_KAFKA) == Some("true")
}

/// Names the broker's Kafka listener in a REGISTER_BROKER request.
pub fn announce(cmd: &mut RemotingCommand, node_id: i32, addr: &str) {
    let f = cmd.ext_fields.get_or_insert_with(Default::default);
    f.insert(field::KAFKA_ADDR, addr);
    f.insert(field::KAFKA_NODE_ID, node_id.to_string());
}

/// Names a replicated master's leader epoch and in-sync set (registered broker ids) in its
/// REGISTER_BROKER request, beside its listener.
pub fn announce_leadership(cmd: &mut RemotingCommand, leader_epoch: i32, in_sync: &[i64]) {
    let f = cmd.ext_fields.get_or_insert_with(Default::default);
    f.insert(field::KAFKA_LEADER_EPOCH, leader_epoch.to_string());
    let ids: Vec<String> = in_sync.iter().map(i64::to_string).collect();
    f.insert(field::KAFKA_IN_SYNC, ids.join(","));
}

/// The Kafka listener a REGISTER_BROKER request names, if any (a malformed node id is none),
/// with the leader epoch and in-sync set a replicated master names (malformed: left out).
pub fn announced(cmd: &RemotingCommand) -> Option<crate::body::KafkaListener> {
    let addr = cmd.ext(field::KAFKA_ADDR)?.to_string();
    let node_id = cmd.ext(field::KAFKA_NODE_ID)?.parse().ok()?;
    let leader_epoch = cmd
        .ext(field::KAFKA_LEADER_EPOCH)
        .and_then(|e| e.parse().ok());
    let in_sync = cmd.ext(field::KAFKA_IN_SYNC).and_then(|s| {
        s.split(',')
            .filter(|id| !id.is_empty())
            .map(|id| id.parse().ok())
            .collect::<Option<Vec<i64>>>()
    });
    (!addr.is_empty()).then_some(crate::body::KafkaListener {
        node_id,
        addr,
        leader_epoch,
        in_sync,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_names_its_listener() {
        let mut cmd = RemotingCommand::request(103);
        assert_eq!(announced(&cmd), None);
        announce(&mut cmd, 7, "127.0.0.1:9092");
        let l = announced(&cmd).expect("announced");
        assert_eq!((l.node_id, l.addr.as_str()), (7, "127.0.0.1:9092"));
        assert_eq!((l.leader_epoch, l.in_sync), (None, None));
        announce_leadership(&mut cmd, 4, &[0, 2, 3]);
        let l = announced(&cmd).expect("announced");
        assert_eq!((l.leader_epoch, l.in_sync), (Some(4), Some(vec![0, 2, 3])));
        cmd.ext_fields
            .get_or_insert_with(Default::default)
            .insert(field::KAFKA_NODE_ID, "x");
        assert_eq!(announced(&cmd), None, "a malformed node id names nothing");
        assert!(!wants_listeners(&cmd));
        want_listeners(&mut cmd);
        assert!(wants_listeners(&cmd));
    }
}
