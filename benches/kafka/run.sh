#!/usr/bin/env bash
# Kafka-protocol throughput and rebalance on Shoal: starts a release `shoal dev` on free
# ports (async flush, fresh data directory), then with confluent-kafka (librdkafka, the venv of
# .ci/setup.d/40-kafka-clients.sh) runs: produce (idempotent, acks=all) for each compression,
# fetch of what was produced, and group rebalances (joins then leaves, eager range and
# cooperative-sticky). Prints JSON lines; note `uptime` beside the figures. Not run in CI.
#
#   cargo build --release -p shoal && benches/kafka/run.sh
#   COUNT=500000 SIZE=1024 benches/kafka/run.sh
#
# Settings (environment): COUNT (200000), SIZE (128), PARTITIONS (8), COMPRESSIONS
# ("none lz4 zstd"), SHOAL_BIN (target/release/shoal), JOINS (3).
set -euo pipefail
cd "$(dirname "$0")/../.."
SHOAL_BIN=$(realpath "${SHOAL_BIN:-target/release/shoal}")
venv=target/external/venv-kafka
"$venv/bin/python" -c 'import confluent_kafka' || { echo "run .ci/setup.d/40-kafka-clients.sh first"; exit 1; }
work=$(mktemp -d)
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$work"' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
kp=$(port)
(cd "$work" && exec "$SHOAL_BIN" dev --namesrv-port "$(port)" --broker-port "$(port)" --kafka-port "$kp" --no-http >dev.out 2>dev.err) &
pid=$!
for _ in $(seq 100); do grep -q "Shoal dev is running" "$work/dev.out" 2>/dev/null && break; sleep 0.1; done
echo "# $(uptime)"
for comp in ${COMPRESSIONS:-none lz4 zstd}; do
  COMPRESSION=$comp TOPIC="KBench-$comp" "$venv/bin/python" benches/kafka/kafka_bench.py "127.0.0.1:$kp" "$pid" produce
  COMPRESSION=$comp TOPIC="KBench-$comp" "$venv/bin/python" benches/kafka/kafka_bench.py "127.0.0.1:$kp" "$pid" fetch
done
for s in range cooperative-sticky; do
  STRATEGY=$s "$venv/bin/python" benches/kafka/kafka_bench.py "127.0.0.1:$kp" "$pid" rebalance
done
echo "# $(uptime)"
