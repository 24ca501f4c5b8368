//! RocketMQ 5's Go client (`github.com/apache/rocketmq-clients/golang/v5`, built by
//! `.ci/setup.d/31-go-grpc-client.sh`) against `shoal dev`'s gRPC endpoint:
//! `tests/compat/grpc-go` run by `tests/compat/run-grpc-client.sh go`, the same checks as the
//! Python client's (Producer: normal, FIFO, delayed, transactional committed, rolled back and
//! checked back; SimpleConsumer: receive, ack, change invisible duration, redelivery after a
//! missed ack, a lapsed receipt refused, SQL92). Its receives name no polling time: the
//! endpoint polls within the call's deadline as RocketMQ's proxy does.

mod support;

#[test]
fn rocketmq_5_go_client_against_shoal_grpc() {
    support::external::run_script("tests/compat/run-grpc-client.sh", &["go"]);
}
