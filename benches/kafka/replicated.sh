#!/usr/bin/env bash
# Kafka `acks=all` produce with three replicas, side by side in one sitting: a replicated Shoal
# broker group (a name server, one controller voter and three `shoal broker --controller` with
# Kafka listeners; a send is answered once all three have it, `ack = in_sync_set`) against
# Apache Kafka 4.1.1's three-broker KRaft cluster (each node broker and controller, topics with
# replication factor 3, `min.insync.replicas=2`; acks=all waits for the whole ISR). Both with
# async flush (page cache only, Kafka's default flush policy). The same client
# (confluent-kafka, benches/kafka/kafka_bench.py produce: acks=all, idempotent, linger.ms=5,
# 256 KiB batches) sends COUNT records of SIZE bytes to a fresh topic of PARTITIONS partitions
# per run; runs alternate between the two clusters, ROUNDS times. Server CPU per record: utime +
# stime of every server process of the cluster (/proc/PID/stat). Not run in CI.
#
#   cargo build --release -p shoal && bash .ci/setup.d/40-kafka-clients.sh
#   benches/kafka/fetch-kafka-broker.sh
#   KAFKA_LIBS=target/external/kafka-broker/libs benches/kafka/replicated.sh
#
# Settings (environment): COUNT (100000), SIZE (128), PARTITIONS (8), ROUNDS (3), WARMUP_COUNT
# (30000), SHOAL_BIN (target/release/shoal), KAFKA_LIBS (required), KAFKA_HEAP (512m per
# node), COMPRESSION (none).
set -euo pipefail
cd "$(dirname "$0")/../.."
SHOAL_BIN=$(realpath "${SHOAL_BIN:-target/release/shoal}")
venv=target/external/venv-kafka
"$venv/bin/python" -c 'import confluent_kafka' || { echo "run .ci/setup.d/40-kafka-clients.sh first"; exit 1; }
[ -n "${KAFKA_LIBS:-}" ] || { echo "set KAFKA_LIBS (benches/kafka/fetch-kafka-broker.sh)"; exit 1; }
command -v jq >/dev/null || { echo "jq not found"; exit 1; }
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
FREE_PORTS=$(realpath tools/free_ports.py)
read -r ns ctl b1 b2 b3 k1 k2 k3 a1 a2 a3 c1 c2 c3 < <(python3 "$FREE_PORTS" 14)

# Shoal: the replicated group, each broker with a Kafka listener.
"$SHOAL_BIN" namesrv --listen "127.0.0.1:$ns" >"$work/ns.out" 2>&1 &
pids+=($!)
shoal_pids=("$!")
"$SHOAL_BIN" controller --listen "127.0.0.1:$ctl" --data-dir "$work/ctl" >"$work/ctl.out" 2>&1 &
pids+=($!)
shoal_pids+=("$!")
i=0
for pair in "$b1:$k1" "$b2:$k2" "$b3:$k3"; do
  i=$((i + 1))
  b=${pair%%:*} k=${pair##*:}
  "$SHOAL_BIN" broker --listen "127.0.0.1:$b" --namesrv "127.0.0.1:$ns" --broker-name broker-a \
    --data-dir "$work/shoal-$i" --flush async --controller "127.0.0.1:$ctl" \
    --kafka-listen "127.0.0.1:$k" >"$work/shoal-$i.out" 2>&1 &
  pids+=($!)
  shoal_pids+=("$!")
done
for _ in $(seq 240); do
  n=$("$SHOAL_BIN" cluster status --controller "127.0.0.1:$ctl" --json 2>/dev/null | jq '.groups["broker-a"].inSync | length' 2>/dev/null || echo 0)
  [ "$n" = 3 ] && break
  sleep 0.5
done
[ "$n" = 3 ] || { echo "the Shoal group did not get three in sync"; tail "$work"/shoal-*.out; exit 1; }
shoal_bs="127.0.0.1:$k1,127.0.0.1:$k2,127.0.0.1:$k3"

# Kafka: three KRaft nodes, each broker and controller.
voters="1@127.0.0.1:$c1,2@127.0.0.1:$c2,3@127.0.0.1:$c3"
cid=$(java -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)
kafka_pids=()
i=0
for pair in "$a1:$c1" "$a2:$c2" "$a3:$c3"; do
  i=$((i + 1))
  a=${pair%%:*} c=${pair##*:}
  mkdir -p "$work/kafka-$i"
  cat >"$work/kafka-$i.properties" <<PROPS
process.roles=broker,controller
node.id=$i
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$a,CONTROLLER://127.0.0.1:$c
advertised.listeners=PLAINTEXT://127.0.0.1:$a
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$work/kafka-$i
offsets.topic.replication.factor=3
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
default.replication.factor=3
min.insync.replicas=2
num.partitions=${PARTITIONS:-8}
group.initial.rebalance.delay.ms=0
PROPS
  java -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool format -t "$cid" -c "$work/kafka-$i.properties" >"$work/kafka-$i-format.out" 2>&1
  java "-Xmx${KAFKA_HEAP:-512m}" "-Xms${KAFKA_HEAP:-512m}" -cp "$KAFKA_LIBS/*" kafka.Kafka "$work/kafka-$i.properties" >"$work/kafka-$i.out" 2>&1 &
  pids+=($!)
  kafka_pids+=("$!")
done
kafka_bs="127.0.0.1:$a1,127.0.0.1:$a2,127.0.0.1:$a3"
for _ in $(seq 600); do
  "$venv/bin/python" - "$kafka_bs" <<'PY' 2>/dev/null && break
import sys
from confluent_kafka.admin import AdminClient
md = AdminClient({"bootstrap.servers": sys.argv[1]}).list_topics(timeout=1)
assert len(md.brokers) == 3
PY
  sleep 0.2
done

shoal_list=$(IFS=,; echo "${shoal_pids[*]}")
kafka_list=$(IFS=,; echo "${kafka_pids[*]}")
run() { # NAME BOOTSTRAP PIDS TOPIC COUNT
  BROKER=$1 TOPIC=$4 COUNT=$5 REPLICATION_FACTOR=$([ "$1" = kafka ] && echo 3 || echo -1) \
    "$venv/bin/python" benches/kafka/kafka_bench.py "$2" "$3" produce
}
run shoal "$shoal_bs" "$shoal_list" KRepl-warmup "${WARMUP_COUNT:-30000}" >/dev/null
run kafka "$kafka_bs" "$kafka_list" KRepl-warmup "${WARMUP_COUNT:-30000}" >/dev/null
echo "# $(uptime)"
for r in $(seq "${ROUNDS:-3}"); do
  if [ $((r % 2)) = 1 ]; then order="shoal kafka"; else order="kafka shoal"; fi
  for t in $order; do
    if [ "$t" = shoal ]; then
      run shoal "$shoal_bs" "$shoal_list" "KRepl-$r" "${COUNT:-100000}"
    else
      run kafka "$kafka_bs" "$kafka_list" "KRepl-$r" "${COUNT:-100000}"
    fi
  done
done
echo "# $(uptime)"
