# Sourced by benches/kafka/run.sh and benches/kafka/groups.sh: starts a release `shoal dev`
# (fresh data directory, async flush, `--no-http`) on free ports and, with KAFKA_LIBS set, a
# single-node KRaft Apache Kafka broker beside it, waits until both answer, and sets
# `targets` to "shoal:127.0.0.1:PORT:PID [kafka:127.0.0.1:PORT:PID]". Both are stopped (and
# the work directory removed) when the sourcing script exits.
#
# Uses (environment): SHOAL_BIN (target/release/shoal), SHOAL_ARGS (more `shoal dev`
# arguments), PORT_BASE (ports PORT_BASE.. instead of free ones), KAFKA_LIBS, KAFKA_HEAP (1g),
# PARTITIONS (8: Kafka's num.partitions), KAFKA_PROPS (more lines for Kafka's
# server.properties, e.g. "group.initial.rebalance.delay.ms=0").
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
FREE_PORTS=$(realpath "$(dirname "${BASH_SOURCE[0]}")/../../tools/free_ports.py")
ports() { python3 "$FREE_PORTS" "$1"; }
if [ -n "${PORT_BASE:-}" ]; then
  kp=$PORT_BASE np=$((PORT_BASE + 1)) bp=$((PORT_BASE + 2)) ap=$((PORT_BASE + 3)) cp=$((PORT_BASE + 4))
else
  read -r kp np bp ap cp < <(ports 5)
fi
# shellcheck disable=SC2086
(cd "$work" && exec "$SHOAL_BIN" dev --namesrv-port "$np" --broker-port "$bp" --kafka-port "$kp" --no-http ${SHOAL_ARGS:-} >dev.out 2>dev.err) &
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
num.partitions=${PARTITIONS:-8}
${KAFKA_PROPS:-}
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
