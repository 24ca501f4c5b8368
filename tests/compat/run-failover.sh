#!/usr/bin/env bash
# Runs an official RocketMQ client through a failover: `shoal dev --replicas 3` on a free block
# of ports (the name server's, +2 the controller's, +10, +20, +30 the replicas'), a topic of 4
# queues created on the master, then the client's failover program, which sends and consumes,
# SIGKILLs the master's process under load and checks that every acknowledged message is
# consumed afterwards (tests/compat/go/failover.go, tests/compat/cpp_failover.py).
#
# usage: run-failover.sh go|cpp
# SHOAL_BIN is the shoal binary (default target/debug/shoal); FAILOVER_KILL_AFTER_S, when set,
# is how long after the clients started the master is killed at the earliest (default 5 s).
# Exit 0: passed; 1: failed; 77: skipped (the client is not built: .ci/setup.d/30-go-client.sh,
# 10-cpp-client.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
SHOAL_BIN=$(realpath "${SHOAL_BIN:-target/debug/shoal}")
export SHOAL_BIN
client=${1:?usage: run-failover.sh go|cpp}
case "$client" in
  go)
    check=$(realpath -m target/external/rocketmq-go-check)
    if [ ! -x "$check" ]; then
      echo "go client failover: SKIPPED (run .ci/setup.d/30-go-client.sh to build it)"
      exit 77
    fi
    ;;
  cpp)
    venv=$(realpath -m target/external/venv-cpp)
    if ! "$venv/bin/python" -c 'import rocketmq.client' 2>/dev/null; then
      echo "cpp client failover: SKIPPED (run .ci/setup.d/10-cpp-client.sh to install the client)"
      exit 77
    fi
    ;;
  *) echo "usage: run-failover.sh go|cpp" >&2; exit 2 ;;
esac
work=$(mktemp -d)
cleanup() {
  if [ -n "${dev_pid:-}" ]; then kill "$dev_pid" 2>/dev/null || true; wait "$dev_pid" 2>/dev/null || true; fi
  if [ -z "${SHOAL_KEEP_TEST_DIRS:-}" ]; then rm -rf "$work"; else echo "kept $work"; fi
}
trap cleanup EXIT
show_logs() {
  echo "--- shoal dev output"; cat "$work/dev.out"
  echo "--- shoal dev log (replicas included)"; tail -40 "$work/dev.err"
}

root=$PWD
base=$(python3 tools/free_ports.py --block 0,2,10,20,30)
ns="127.0.0.1:$base"
controller="127.0.0.1:$((base + 2))"
(cd "$work" && RUST_LOG=${RUST_LOG:-info} exec "$SHOAL_BIN" dev --replicas 3 --namesrv-port "$base" \
    --broker-port "$((base + 10))" --data-dir "$work/data" --no-http --no-kafka --no-grpc \
    >dev.out 2>dev.err) &
dev_pid=$!
for _ in $(seq 1 300); do
  grep -q "^Try it:" "$work/dev.out" 2>/dev/null && break
  sleep 0.1
done
grep -q "^Try it:" "$work/dev.out" || { echo "shoal dev did not start"; show_logs; exit 1; }

# The master (controller id → address) once all three replicas are in sync, and its pid as dev
# printed it.
master=""
for _ in $(seq 1 300); do
  master=$("$SHOAL_BIN" cluster status --controller "$controller" --json 2>/dev/null | python3 -c '
import json, sys
g = json.load(sys.stdin)["groups"].get("broker-a", {})
if isinstance(g.get("master"), int) and len(g.get("inSync", [])) == 3:
    print(g["members"][str(g["master"])])
' 2>/dev/null || true)
  [ -n "$master" ] && break
  sleep 0.1
done
[ -n "$master" ] || { echo "no master with three replicas in sync"; show_logs; exit 1; }
pid=$(sed -n "s/.* at $master, pid \([0-9]*\),.*/\1/p" "$work/dev.out")
[ -n "$pid" ] || { echo "no pid for $master"; show_logs; exit 1; }
echo "master $master, pid $pid; name server $ns"

case "$client" in
  go)
    # The client's own log goes to a file under HOME.
    (cd "$work" && HOME="$work" timeout 200 "$check" failover "$ns" "$master" "$pid") || {
      show_logs; exit 1; }
    ;;
  cpp)
    # librocketmq logs to $HOME/logs/rocketmq-cpp.
    (cd "$work" && HOME="$work" timeout 200 "$venv/bin/python" "$root/tests/compat/cpp_failover.py" "$ns" "$master" "$pid") || {
      show_logs; echo "--- the C++ client's log"; tail -40 "$work"/logs/rocketmq-cpp/* 2>/dev/null || true; exit 1; }
    ;;
esac
echo "after the failover: $("$SHOAL_BIN" cluster status --controller "$controller" --json | python3 -c '
import json, sys
g = json.load(sys.stdin)["groups"]["broker-a"]
print("master", g["members"].get(str(g.get("master")), "none"), "epoch", g.get("masterEpoch"), "in sync", g.get("inSync"))
')"
