#!/usr/bin/env bash
# Runs real Kafka clients against `shoal dev` on free ports: confluent-kafka (librdkafka) and
# kafka-python (venv made by .ci/setup.d/40-kafka-clients.sh), then the Java kafka-clients
# and franz-go checks when they were built. Usage: run-kafka-clients.sh [python|java|go]...
# (default: all). SHOAL_BIN is the shoal binary (default target/debug/shoal).
# Exit 0: passed; 1: failed; 77: skipped (the clients are not installed).
set -euo pipefail
cd "$(dirname "$0")/../../.."
root=$(pwd)
SHOAL_BIN=$(realpath "${SHOAL_BIN:-target/debug/shoal}")
venv=$(realpath -m target/external/venv-kafka)
java_lib=$root/target/external/kafka-java-lib
go_bin=$root/target/external/kafka-go-check
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(python java go)
want() { local p; for p in "${parts[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }
if want python && ! "$venv/bin/python" -c 'import confluent_kafka, kafka' 2>/dev/null; then
  echo "kafka clients: SKIPPED (run .ci/setup.d/40-kafka-clients.sh to install them)"; exit 77
fi
if want java && [ ! -d "$java_lib" ]; then
  echo "kafka java client: SKIPPED (not built by .ci/setup.d/40-kafka-clients.sh)"; exit 77
fi
if want go && [ ! -x "$go_bin" ]; then
  echo "kafka go client: SKIPPED (not built by .ci/setup.d/40-kafka-clients.sh)"; exit 77
fi
work=$(mktemp -d)
cleanup() {
  stop_dev
  rm -rf "$work"
}
stop_dev() {
  if [ -n "${dev_pid:-}" ]; then kill "$dev_pid" 2>/dev/null || true; wait "$dev_pid" 2>/dev/null || true; dev_pid=; fi
}
trap cleanup EXIT
# Distinct free ports: every socket is bound before any is closed, so no two are the same
# (ports picked one at a time can repeat).
FREE_PORTS=$PWD/tools/free_ports.py  # the script runs from the repository root
ports() { python3 "$FREE_PORTS" "$1"; }
read -r ns_port broker_port kafka_port < <(ports 3)
start_dev() {
  : >"$work/dev.out"
  (cd "$work" && exec "$SHOAL_BIN" dev --namesrv-port "$ns_port" --broker-port "$broker_port" \
      --kafka-port "$kafka_port" >>dev.out 2>>dev.err) &
  dev_pid=$!
  for _ in $(seq 1 100); do
    grep -q "Shoal dev is running" "$work/dev.out" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "shoal dev did not start"; tail -20 "$work/dev.err"; exit 1
}
fail() { echo "--- shoal dev log"; tail -40 "$work/dev.err"; exit 1; }
bs=127.0.0.1:$kafka_port
ns=127.0.0.1:$ns_port
start_dev
if want python; then
  py() { timeout 240 "$venv/bin/python" tests/compat/kafka/kafka_clients.py "$1" "$bs" "$ns" "$SHOAL_BIN" || fail; }
  for s in roundtrip headers interop group-range group-cooperative group-consumer static commit-before; do
    echo "== python: $s"; py "$s"
  done
  echo "== restart shoal dev (SIGTERM, same data directory)"
  stop_dev; start_dev
  echo "== python: commit-after"; py commit-after
fi
if want java; then
  echo "== java kafka-clients"
  timeout 300 java -cp "$java_lib/*:tests/compat/kafka/java/src/main/java" \
    tests/compat/kafka/java/src/main/java/KafkaCheck.java "$bs" classic consumer || fail
fi
if want go; then
  echo "== go franz-go"
  timeout 300 "$go_bin" "$bs" || fail
fi
echo "kafka clients against shoal dev: passed"
