#!/usr/bin/env bash
# Runs Apache RocketMQ's official C++ client (PyPI `rocketmq` 0.4.4, which bundles librocketmq)
# against `shoal dev` on free ports. Needs the venv made by .ci/setup.d/10-cpp-client.sh
# (target/external/venv-cpp) and the shoal binary (SHOAL_BIN, default target/debug/shoal).
# Exit 0: passed; 1: failed; 77: skipped (the client is not installed).
set -euo pipefail
cd "$(dirname "$0")/../.."
SHOAL_BIN=$(realpath "${SHOAL_BIN:-target/debug/shoal}")
venv=$(realpath -m target/external/venv-cpp)
if ! "$venv/bin/python" -c 'import rocketmq.client' 2>/dev/null; then
  echo "cpp client compatibility: SKIPPED (run .ci/setup.d/10-cpp-client.sh to install the client)"
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
(cd "$work" && exec "$SHOAL_BIN" dev --namesrv-port "$ns_port" --broker-port "$broker_port" >dev.out 2>dev.err) &
dev_pid=$!
for _ in $(seq 1 100); do
  grep -q "Shoal dev is running" "$work/dev.out" 2>/dev/null && break
  sleep 0.1
done
timeout 180 "$venv/bin/python" tests/compat/cpp_client.py "127.0.0.1:$ns_port" || {
  echo "--- shoal dev log"; tail -30 "$work/dev.err"; exit 1; }
