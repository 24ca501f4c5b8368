#!/usr/bin/env bash
# Runs Apache RocketMQ's official C++ client (PyPI `rocketmq` 0.4.4, which bundles librocketmq)
# against `shoal dev` on free ports. Needs python3 with venv and the shoal binary
# (SHOAL_BIN, default target/debug/shoal).
set -euo pipefail
cd "$(dirname "$0")/../.."
SHOAL_BIN=$(realpath "${SHOAL_BIN:-target/debug/shoal}")
work=$(mktemp -d)
cleanup() {
  if [ -n "${dev_pid:-}" ]; then kill "$dev_pid" 2>/dev/null || true; wait "$dev_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

if ! python3 -m venv "$work/venv" >/dev/null 2>&1 || ! "$work/venv/bin/pip" install -q rocketmq==0.4.4; then
  echo "cpp client compatibility: SKIPPED (could not install the rocketmq 0.4.4 package from PyPI)"
  exit 0
fi
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ns_port=$(port); broker_port=$(port)
(cd "$work" && exec "$SHOAL_BIN" dev --namesrv-port "$ns_port" --broker-port "$broker_port" >dev.out 2>dev.err) &
dev_pid=$!
for _ in $(seq 1 100); do
  grep -q "Shoal dev is running" "$work/dev.out" 2>/dev/null && break
  sleep 0.1
done
timeout 180 "$work/venv/bin/python" tests/compat/cpp_client.py "127.0.0.1:$ns_port" || {
  echo "--- shoal dev log"; tail -30 "$work/dev.err"; exit 1; }
