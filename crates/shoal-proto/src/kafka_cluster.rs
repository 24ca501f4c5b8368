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

/// The Kafka listener a REGISTER_BROKER request names, if any (a malformed node id is none).
pub fn announced(cmd: &RemotingCommand) -> Option<crate::body::KafkaListener> {
    let addr = cmd.ext(field::KAFKA_ADDR)?.to_string();
    let node_id = cmd.ext(field::KAFKA_NODE_ID)?.parse().ok()?;
    (!addr.is_empty()).then_some(crate::body::KafkaListener { node_id, addr })
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
        cmd.ext_fields
            .get_or_insert_with(Default::default)
            .insert(field::KAFKA_NODE_ID, "x");
        assert_eq!(announced(&cmd), None, "a malformed node id names nothing");
        assert!(!wants_listeners(&cmd));
        want_listeners(&mut cmd);
        assert!(wants_listeners(&cmd));
    }
}
