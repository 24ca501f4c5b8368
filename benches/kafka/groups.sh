#!/usr/bin/env bash
# Consumer-group changes under load, Shoal against Apache Kafka: starts a release `shoal dev`
# and, with KAFKA_LIBS, a single-node KRaft Kafka broker with its default settings
# (benches/kafka/brokers.sh), then runs `kafka_bench.py groups` (benches/kafka/kafka_groups.py:
# 16 partitions under 2,000 records/s, 4 member processes, 4 joining at once, 4 leaving with
# close(); confluent-kafka from the venv of .ci/setup.d/40-kafka-clients.sh) RUNS times for
# each protocol, each run on Shoal and then on Kafka (interleaved), and prints one JSON line per
# run and a table of the median (min-max) per broker and protocol. Not run in CI.
#
#   cargo build --release -p shoal && benches/kafka/fetch-kafka-broker.sh
#   KAFKA_LIBS=target/external/kafka-broker/libs benches/kafka/groups.sh
#
# Settings (environment): RUNS (3), PROTOCOLS ("consumer classic"), STEADY_S (30: seconds of
# steady state over which heartbeats are counted), KILL (1: also SIGKILL a member and measure
# the session-timeout convergence; 0 skips it), RATE, PARTITIONS, MEMBERS, JOINERS (kafka_groups.py), and
# those of benches/kafka/brokers.sh (SHOAL_BIN, PORT_BASE, KAFKA_LIBS, KAFKA_HEAP, KAFKA_PROPS:
# Kafka's defaults unless set, e.g. group.initial.rebalance.delay.ms=3000).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PARTITIONS=${PARTITIONS:-16}
. benches/kafka/brokers.sh
out=$work/groups.jsonl
echo "# $(uptime)"
for run in $(seq "${RUNS:-3}"); do
  for proto in ${PROTOCOLS:-consumer classic}; do
    for t in $targets; do
      IFS=: read -r name host p bpid <<<"$t"
      BROKER=$name PROTOCOL=$proto "$venv/bin/python" benches/kafka/kafka_bench.py "$host:$p" "$bpid" groups | tee -a "$out"
    done
  done
done
echo "# $(uptime)"
"$venv/bin/python" benches/kafka/kafka_groups.py table "$out"
