//! Apache RocketMQ's official C++ client against `shoal dev`: `tests/compat/run-cpp-client.sh`
//! (producer with keys and tags, a tag-filtered push consumer, an orderly consumer).

mod support;

#[test]
fn official_cpp_client_against_shoal_dev() {
    support::external::run_script("tests/compat/run-cpp-client.sh", &[]);
}
