//! Apache RocketMQ's Go client (rocketmq-client-go v2) against Shoal. The program is built by
//! `.ci/setup.d/30-go-client.sh` from `tests/compat/go`.
//!
//! - `tests/compat/run-go-client.sh` against `shoal dev`: admin (topics created, listed and
//!   deleted); a producer with tags and keys; a push consumer with the tag expression
//!   `TagA || TagB`; ordered sends and an orderly consumer; two broadcasting consumers; a
//!   failed message redelivered with reconsumeTimes 1.
//! - `tests/compat/run-failover.sh go` against `shoal dev --replicas 3`: a producer sending
//!   every 20 ms (SendSync) and a clustering push consumer; the master is SIGKILLed under load,
//!   and every acknowledged message (SEND_OK) must be consumed afterwards. The client re-reads
//!   routes every 30 s (a constant of the client), so sends resume at its next route poll, and a
//!   pull held at the dead master waits out its 30 s timeout: the run takes about 45 s
//!   (docs/failover.md, "Official clients through a failover").
//! - `rocketmq-go-check consume` (a clustering push consumer printing what it receives) is a
//!   member of the official group of `replication_mixed`.

mod support;

use std::sync::Mutex;

/// One run at a time: each starts its own Shoal processes and Go client.
static ONE: Mutex<()> = Mutex::new(());

#[test]
fn official_go_client_against_shoal_dev() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    support::external::run_script("tests/compat/run-go-client.sh", &[]);
}

#[test]
fn official_go_client_through_a_failover() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    support::external::run_script("tests/compat/run-failover.sh", &["go"]);
}
