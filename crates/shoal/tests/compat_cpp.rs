//! Apache RocketMQ's official C++ client (PyPI `rocketmq` 0.4.4, which bundles librocketmq;
//! venv from `.ci/setup.d/10-cpp-client.sh`) against Shoal.
//!
//! - `tests/compat/run-cpp-client.sh` against `shoal dev`: producer with keys and tags, a
//!   tag-filtered push consumer, an orderly consumer.
//! - `tests/compat/run-failover.sh cpp` against `shoal dev --replicas 3`: a producer sending
//!   every 20 ms (send_sync) and a clustering push consumer; the master is SIGKILLed under load,
//!   and every acknowledged message (SEND_OK) must be consumed afterwards. The client re-reads
//!   routes 3 s after it starts and then every 30 s, so sends resume at its next route poll,
//!   and a pull held at the dead master waits out its 30 s timeout: the run takes about 40 s
//!   (docs/failover.md, "Official clients through a failover").

mod support;

use std::sync::Mutex;

/// One run at a time: each starts its own Shoal processes and C++ client.
static ONE: Mutex<()> = Mutex::new(());

#[test]
fn official_cpp_client_against_shoal_dev() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    support::external::run_script("tests/compat/run-cpp-client.sh", &[]);
}

#[test]
fn official_cpp_client_through_a_failover() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    support::external::run_script("tests/compat/run-failover.sh", &["cpp"]);
}
