#!/usr/bin/env bash
# Runs Apache RocketMQ's Go client (github.com/apache/rocketmq-client-go/v2, built by
# .ci/setup.d/30-go-client.sh into target/external/rocketmq-go-check from tests/compat/go)
# against `shoal dev` on free ports. SHOAL_BIN is the shoal binary (default target/debug/shoal).
# Exit 0: passed; 1: failed; 77: skipped (the client is not built).
set -euo pipefail
cd "$(dirname "$0")/../.."
SHOAL_BIN=$(realpath "${SHOAL_BIN:-target/debug/shoal}")
check=$(realpath -m target/external/rocketmq-go-check)
if [ ! -x "$check" ]; then
  echo "go client compatibility: SKIPPED (run .ci/setup.d/30-go-client.sh to build it)"
  exit 77
fi
work=$(mktemp -d)
cleanup() {
  if [ -n "${dev_pid:-}" ]; then kill "$dev_pid" 2>/dev/null || true; wait "$dev_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# Distinct free ports: every socket is bound before any is closed, so no two are the same
# (ports picked one at a time can repeat).
FREE_PORTS=$PWD/tools/free_ports.py  # the script runs from the repository root
ports() { python3 "$FREE_PORTS" "$1"; }
read -r ns_port broker_port < <(ports 2)
(cd "$work" && exec "$SHOAL_BIN" dev --namesrv-port "$ns_port" --broker-port "$broker_port" --no-kafka --no-http \
    >dev.out 2>dev.err) &
dev_pid=$!
for _ in $(seq 1 100); do
  grep -q "Shoal dev is running" "$work/dev.out" 2>/dev/null && break
  sleep 0.1
done
# The Go client logs to standard output; its own log goes to a file of the work directory.
(cd "$work" && HOME="$work" timeout 240 "$check" "127.0.0.1:$ns_port" "127.0.0.1:$broker_port") || {
  echo "--- shoal dev log"; tail -30 "$work/dev.err"; exit 1; }
