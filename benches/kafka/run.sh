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
# rounds), WARMUP_COUNT (50000: an unreported produce per broker first), PORT_BASE (ports
# PORT_BASE.. instead of free ones), KAFKA_LIBS, KAFKA_HEAP (1g).
set -euo pipefail
cd "$(dirname "$0")/../.."
SHOAL_BIN=$(realpath "${SHOAL_BIN:-target/release/shoal}")
venv=target/external/venv-kafka
"$venv/bin/python" -c 'import confluent_kafka' || { echo "run .ci/setup.d/40-kafka-clients.sh first"; exit 1; }
work=$(mktemp -d)
pid= kpid=
cleanup() {
  for p in $pid $kpid; do kill "$p" 2>/dev/null || true; done
  for p in $pid $kpid; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
# Distinct free ports: every socket is bound before any is closed, so no two are the same
# (ports picked one at a time can repeat).
ports() { python3 -c 'import socket,sys; ss=[socket.socket() for _ in range(int(sys.argv[1]))]; [s.bind(("127.0.0.1",0)) for s in ss]; print(*[s.getsockname()[1] for s in ss])' "$1"; }
if [ -n "${PORT_BASE:-}" ]; then
  kp=$PORT_BASE np=$((PORT_BASE + 1)) bp=$((PORT_BASE + 2)) ap=$((PORT_BASE + 3)) cp=$((PORT_BASE + 4))
else
  read -r kp np bp ap cp < <(ports 5)
fi
(cd "$work" && exec "$SHOAL_BIN" dev --namesrv-port "$np" --broker-port "$bp" --kafka-port "$kp" --no-http >dev.out 2>dev.err) &
pid=$!
for _ in $(seq 100); do grep -q "Shoal dev is running" "$work/dev.out" 2>/dev/null && break; sleep 0.1; done
targets="shoal:127.0.0.1:$kp:$pid"
if [ -n "${KAFKA_LIBS:-}" ]; then
  mkdir -p "$work/kafka-logs"
  cat >"$work/kafka.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cp
listeners=PLAINTEXT://127.0.0.1:$ap,CONTROLLER://127.0.0.1:$cp
advertised.listeners=PLAINTEXT://127.0.0.1:$ap
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$work/kafka-logs
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
num.partitions=${PARTITIONS:-8}
PROPS
  cid=$(java -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)
  java -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool format -t "$cid" -c "$work/kafka.properties" >"$work/kafka-format.out" 2>&1
  java "-Xmx${KAFKA_HEAP:-1g}" "-Xms${KAFKA_HEAP:-1g}" -cp "$KAFKA_LIBS/*" kafka.Kafka "$work/kafka.properties" >"$work/kafka.out" 2>&1 &
  kpid=$!
  for _ in $(seq 600); do
    "$venv/bin/python" - "127.0.0.1:$ap" <<'PY' 2>/dev/null && break
import sys
from confluent_kafka.admin import AdminClient
AdminClient({"bootstrap.servers": sys.argv[1]}).list_topics(timeout=1)
PY
    sleep 0.2
  done
  targets="$targets kafka:127.0.0.1:$ap:$kpid"
fi
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
