//! Apache RocketMQ's official C++ client with ACL session credentials against a Shoal broker
//! with ACL on: `tests/compat/run-cpp-acl.sh` (works with valid credentials, refused without
//! or with a wrong secret).

mod support;

#[test]
fn official_cpp_client_with_acl_credentials() {
    support::external::run_script("tests/compat/run-cpp-acl.sh", &[]);
}
