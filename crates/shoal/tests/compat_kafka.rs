//! Real Kafka clients against `shoal dev`: `tests/compat/kafka/run-kafka-clients.sh`.
//! confluent-kafka (librdkafka) and kafka-python: round trips with keys, headers and every
//! compression, RocketMQ <-> Kafka interop, a group of 3 with a join and a leave (range and
//! cooperative-sticky), static membership restart, committed offsets across a restart; then
//! the Java kafka-clients and franz-go checks.

mod support;

#[test]
fn python_kafka_clients_against_shoal_dev() {
    support::external::run_script("tests/compat/kafka/run-kafka-clients.sh", &["python"]);
}

#[test]
fn java_kafka_clients_against_shoal_dev() {
    support::external::run_script("tests/compat/kafka/run-kafka-clients.sh", &["java"]);
}

#[test]
fn go_kafka_client_against_shoal_dev() {
    support::external::run_script("tests/compat/kafka/run-kafka-clients.sh", &["go"]);
}
