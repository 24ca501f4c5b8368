//! Apache RocketMQ's Go client (rocketmq-client-go v2) against `shoal dev`:
//! `tests/compat/run-go-client.sh` (admin: topics created, listed and deleted; a producer with
//! tags and keys; a push consumer with the tag expression `TagA || TagB`; ordered sends and an
//! orderly consumer; two broadcasting consumers; a failed message redelivered with
//! reconsumeTimes 1). The program is built by `.ci/setup.d/30-go-client.sh`.

mod support;

#[test]
fn official_go_client_against_shoal_dev() {
    support::external::run_script("tests/compat/run-go-client.sh", &[]);
}
