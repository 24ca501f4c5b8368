#!/usr/bin/env bash
# Kafka-protocol throughput and rebalance on Shoal: starts a release `shoal dev` on free
# ports (async flush, fresh data directory), then with confluent-kafka (librdkafka, the venv of
# .ci/setup.d/40-kafka-clients.sh) runs: produce (idempotent, acks=all) for each compression,
# fetch of what was produced, and group rebalances (joins then leaves, eager range and
# cooperative-sticky). Prints JSON lines (`"broker"` says which); note `uptime` beside the
# figures. Not run in CI.
#
#   cargo build --release -p shoal && benches/kafka/run.sh
#   COUNT=500000 SIZE=1024 benches/kafka/run.sh
#
# With KAFKA_LIBS set to a directory of Apache Kafka's broker jars (kafka_2.13 and its
# dependencies, e.g. `mvn dependency:copy-dependencies` of org.apache.kafka:kafka_2.13), a
# single-node KRaft Kafka broker runs beside Shoal and every run (produce, fetch, rebalance) is
# repeated against it right after Shoal's (interleaved, same client, same load; its CPU from its JVM's
# /proc/PID/stat).
#
# Settings (environment): COUNT (200000), SIZE (128), PARTITIONS (8), COMPRESSIONS
# ("none lz4 zstd"), SHOAL_BIN (target/release/shoal), JOINS (3), ROUNDS (1: produce/fetch
# rounds), WARMUP_COUNT (50000: an unreported produce per broker first), and those of
# benches/kafka/brokers.sh (PORT_BASE, KAFKA_LIBS, KAFKA_HEAP, KAFKA_PROPS: here
# group.initial.rebalance.delay.ms=0 unless set).
set -euo pipefail
cd "$(dirname "$0")/../.."
KAFKA_PROPS=${KAFKA_PROPS:-group.initial.rebalance.delay.ms=0}
. benches/kafka/brokers.sh
# Unreported warm-up (the JVM's JIT; Shoal's page cache): one produce per broker.
for t in $targets; do
  IFS=: read -r name host p bpid <<<"$t"
  COUNT=${WARMUP_COUNT:-50000} BROKER=$name TOPIC=KBench-warmup "$venv/bin/python" benches/kafka/kafka_bench.py "$host:$p" "$bpid" produce >/dev/null
done
echo "# $(uptime)"
for round in $(seq "${ROUNDS:-1}"); do
  for comp in ${COMPRESSIONS:-none lz4 zstd}; do
    for what in produce fetch; do
      for t in $targets; do
        IFS=: read -r name host p bpid <<<"$t"
        BROKER=$name COMPRESSION=$comp TOPIC="KBench-$comp-$round" "$venv/bin/python" benches/kafka/kafka_bench.py "$host:$p" "$bpid" "$what"
      done
    done
  done
done
for s in range cooperative-sticky; do
  for t in $targets; do
    IFS=: read -r name host p bpid <<<"$t"
    STRATEGY=$s BROKER=$name "$venv/bin/python" benches/kafka/kafka_bench.py "$host:$p" "$bpid" rebalance
  done
done
echo "# $(uptime)"
