#!/usr/bin/env bash
# Runs one of RocketMQ 5's gRPC clients of apache/rocketmq-clients against `shoal dev` on free
# ports: `python` (PyPI rocketmq-python-client in target/external/venv-rocketmq5, made by
# .ci/setup.d/22-python-grpc.sh; tests/compat/grpc_python.py) or `go`
# (github.com/apache/rocketmq-clients/golang/v5 built by .ci/setup.d/31-go-grpc-client.sh into
# target/external/rocketmq-go5-check; tests/compat/grpc-go). Both run the same checks on the
# same topics. SHOAL_BIN is the shoal binary (default target/debug/shoal).
# Exit 0: passed; 1: failed; 77: skipped (the client is not installed).
set -euo pipefail
cd "$(dirname "$0")/../.."
SHOAL_BIN=$(realpath "${SHOAL_BIN:-target/debug/shoal}")
which=${1:?usage: run-grpc-client.sh python|go}
case "$which" in
  python)
    py=$PWD/target/external/venv-rocketmq5/bin/python
    if [ ! -x "$py" ] || ! "$py" -c 'import rocketmq.v5' 2>/dev/null; then
      echo "python gRPC client compatibility: SKIPPED (run .ci/setup.d/22-python-grpc.sh to install it)"
      exit 77
    fi
    client=("$py" "$PWD/tests/compat/grpc_python.py")
    ;;
  go)
    check=$(realpath -m target/external/rocketmq-go5-check)
    if [ ! -x "$check" ]; then
      echo "go gRPC client compatibility: SKIPPED (run .ci/setup.d/31-go-grpc-client.sh to build it)"
      exit 77
    fi
    client=("$check")
    ;;
  *) echo "unknown client $which (python or go)"; exit 2 ;;
esac

work=$(mktemp -d)
cleanup() {
  if [ -n "${dev_pid:-}" ]; then kill "$dev_pid" 2>/dev/null || true; wait "$dev_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# Distinct free ports: every socket is bound before any is closed.
FREE_PORTS=$PWD/tools/free_ports.py  # the script runs from the repository root
ports() { python3 "$FREE_PORTS" "$1"; }
read -r ns_port broker_port grpc_port < <(ports 3)
# Short transaction checks, so a check-back comes within the run; short long polling, so a
# consumer's shutdown (which waits for its receives in flight) is quick.
cat >"$work/broker.toml" <<'EOF'
transaction_timeout_ms = 1000
transaction_check_interval_ms = 500
grpc_long_polling_ms = 2000
EOF
(cd "$work" && RUST_LOG=${RUST_LOG:-info} exec "$SHOAL_BIN" dev --data-dir "$work/data" --config "$work/broker.toml" \
    --namesrv-port "$ns_port" --broker-port "$broker_port" --grpc-port "$grpc_port" --no-kafka --no-http \
    >dev.out 2>dev.err) &
dev_pid=$!
for _ in $(seq 1 200); do
  grep -q "gRPC" "$work/dev.out" 2>/dev/null && break
  sleep 0.1
done
grep -q "gRPC" "$work/dev.out" || { echo "shoal dev did not start"; tail -30 "$work/dev.err"; exit 1; }
ns=127.0.0.1:$ns_port
"$SHOAL_BIN" topic create P5Normal --queues 2 --namesrv "$ns" >/dev/null
"$SHOAL_BIN" topic create P5Fifo --queues 2 --message-type FIFO --namesrv "$ns" >/dev/null
"$SHOAL_BIN" topic create P5Delay --queues 1 --message-type DELAY --namesrv "$ns" >/dev/null
"$SHOAL_BIN" topic create P5Tx --queues 1 --message-type TRANSACTION --namesrv "$ns" >/dev/null
"$SHOAL_BIN" topic create P5Sql --queues 1 --namesrv "$ns" >/dev/null

# The clients log under $HOME (~/logs/rocketmq_python, ~/logs/rocketmqlogs): the work directory.
if ! (cd "$work" && HOME="$work" timeout 180 "${client[@]}" "127.0.0.1:$grpc_port"); then
  echo "--- shoal dev log (tail)"; tail -30 "$work/dev.err"
  for f in "$work"/logs/*/*.log; do
    [ -e "$f" ] && { echo "--- $f (tail)"; tail -30 "$f"; }
  done
  exit 1
fi
