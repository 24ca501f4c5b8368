//! RocketMQ 5's Python client (PyPI `rocketmq-python-client` 5.x, installed in a venv by
//! `.ci/setup.d/22-python-grpc.sh`) against `shoal dev`'s gRPC endpoint:
//! `tests/compat/grpc_python.py` run by `tests/compat/run-grpc-client.sh python` (Producer:
//! normal with tag, keys and properties, FIFO with a message group, delayed, transactional
//! committed, rolled back and checked back; SimpleConsumer: receive, ack, change invisible
//! duration, redelivery after a missed ack, a lapsed receipt refused, SQL92).

mod support;

#[test]
fn rocketmq_5_python_client_against_shoal_grpc() {
    support::external::run_script("tests/compat/run-grpc-client.sh", &["python"]);
}
