//! RocketMQ 5's Java clients against Shoal, in one JVM (`tests/compat/grpc-java`, JUnit run
//! by Maven offline from the repository `.ci/setup.d/21-java-grpc.sh` fills):
//! rocketmq-client-java 5.x on the gRPC endpoint (Producer: normal, FIFO, delay,
//! transactional with check-back; SimpleConsumer: receive, ack, change invisible duration,
//! redelivery after a missed ack, SQL92; PushConsumer: concurrent and FIFO) and the 5.3
//! remoting client (push consumer in POP mode, SQL92 selector).

mod support;

#[test]
fn compat_rocketmq_5_java_clients_against_shoal() {
    support::external::run_script("tests/compat/run-grpc-java.sh", &[]);
}
