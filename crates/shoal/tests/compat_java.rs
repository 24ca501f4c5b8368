//! Apache RocketMQ's Java clients (rocketmq-client and rocketmq-tools 4.9.8 and 5.3.3) against
//! Shoal: `tests/compat/java` (JUnit, run by Maven offline from the repository that
//! `.ci/setup.d/20-java.sh` fills). Producer, push and lite pull consumers, admin calls and
//! mqadmin commands, a consumer group mixing Java and Shoal members, and a producer, push and
//! lite pull consumer through a SIGKILLed master of `shoal dev --replicas 3` (`FailoverTest`).

mod support;

use std::sync::Mutex;

/// One Maven run at a time (each starts its own Shoal processes and JVM).
static MAVEN: Mutex<()> = Mutex::new(());

#[test]
fn compat_java_client_4_9_against_shoal() {
    let _one = MAVEN.lock().unwrap_or_else(|e| e.into_inner());
    support::external::run_script("tests/compat/run-java-client.sh", &["client4"]);
}

#[test]
fn compat_java_client_5_against_shoal() {
    let _one = MAVEN.lock().unwrap_or_else(|e| e.into_inner());
    support::external::run_script("tests/compat/run-java-client.sh", &["client5"]);
}
