#!/usr/bin/env bash
# Shoal next to its peers, on this machine, in one run: Redis Streams (consumer groups) and
# NATS JetStream, both from Debian's packages, run the same workload shape as `shoal bench`
# through benches/peers/peer_bench.py (redis-py / nats-py from PyPI, in a virtualenv). The
# reports are printed side by side with ratios (Shoal / peer). Redis's own tool,
# redis-benchmark, is also run on XADD. Run by hand, as root (it installs packages), not in CI:
#
#   sudo benches/peers/run.sh                      # defaults below
#   SIZE=1024 DURATION=20 RATE=5000 sudo -E benches/peers/run.sh
#
# Settings (environment): SIZE (body bytes, 128), DURATION (seconds per workload, 10), PRODUCERS (1),
# CONSUMERS (2), RATE (msgs/s of the e2e workload, 2000), QUEUES (Shoal topic queues, 8),
# PEERS_VENV (/tmp/shoal-peers-venv), KEEP (keep the temp dir with the JSON reports).
#
# Durability is comparable, not identical: Shoal runs with async flush (the default), Redis
# with AOF `appendfsync everysec`, NATS JetStream with file storage (its default, fsync on its
# own schedule). None of the three acknowledges after an fsync here.
set -euo pipefail

SIZE=${SIZE:-128}
SECONDS_PER_RUN=${DURATION:-10}
PRODUCERS=${PRODUCERS:-1}
CONSUMERS=${CONSUMERS:-2}
RATE=${RATE:-2000}
QUEUES=${QUEUES:-8}
VENV=${PEERS_VENV:-/tmp/shoal-peers-venv}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

if [ "$(id -u)" != 0 ]; then
  echo "run as root: the script installs redis-server and nats-server with apt-get" >&2
  exit 1
fi

echo "== installing peers (Debian packages) and Python clients (PyPI)"
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v nats-server >/dev/null || missing+=(nats-server)
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
fi
apt-cache policy redis-server nats-server | grep -E '^[a-z]|Installed' || true
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q redis nats-py
PY="$VENV/bin/python"

echo "== building shoal (release)"
(cd "$REPO" && cargo build --release -q -p shoal)
SHOAL="${CARGO_TARGET_DIR:-$REPO/target}/release/shoal"

WORK=$(mktemp -d /tmp/shoal-peers.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -z "${KEEP:-}" ]; then rm -rf "$WORK"; else echo "reports kept in $WORK"; fi
}
trap cleanup EXIT

# Distinct free ports below the ephemeral range (tools/free_ports.py says why).
free_ports() { "$PY" "$REPO/tools/free_ports.py" "$1"; }
wait_port() {
  for _ in $(seq 1 100); do
    "$PY" -c "import socket,sys; socket.create_connection(('127.0.0.1',$1),0.2)" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on port $1" >&2
  return 1
}

read -r NS_PORT BR_PORT REDIS_PORT NATS_PORT < <(free_ports 4)
"$SHOAL" dev --namesrv-port "$NS_PORT" --broker-port "$BR_PORT" --data-dir "$WORK/shoal" \
  >"$WORK/shoal.log" 2>&1 &
PIDS+=($!)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$WORK" --save '' \
  --appendonly yes --appendfsync everysec >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
mkdir -p "$WORK/nats"
nats-server -a 127.0.0.1 -p "$NATS_PORT" -js -sd "$WORK/nats" >"$WORK/nats.log" 2>&1 &
PIDS+=($!)
wait_port "$REDIS_PORT"; wait_port "$NATS_PORT"; wait_port "$BR_PORT"
NS="127.0.0.1:$NS_PORT"
for _ in $(seq 1 100); do
  "$SHOAL" --namesrv "$NS" topic create PeersReady --queues 1 >/dev/null 2>&1 && break
  sleep 0.2
done

echo "== machine"
echo "$(nproc) CPU ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/Mem:/{print $2}') GiB RAM, $(uname -sr)"
echo "workloads: ${SIZE} B bodies, ${SECONDS_PER_RUN} s each, ${PRODUCERS} producer(s); e2e at ${RATE} msgs/s with ${CONSUMERS} consumer(s)"
echo

bench_all() { # mode, extra shoal args..., -- extra peer args...
  local mode=$1; shift
  local shoal_args=() peer_args=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do shoal_args+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  peer_args=("$@")
  "$SHOAL" --namesrv "$NS" --json bench "$mode" --topic "Peers$mode" --queues "$QUEUES" \
    --size "$SIZE" --producers "$PRODUCERS" --duration "${SECONDS_PER_RUN}s" "${shoal_args[@]}" \
    >"$WORK/shoal-$mode.json"
  "$PY" "$HERE/peer_bench.py" redis --addr "127.0.0.1:$REDIS_PORT" "$mode" --size "$SIZE" \
    --producers "$PRODUCERS" --seconds "$SECONDS_PER_RUN" "${peer_args[@]}" >"$WORK/redis-$mode.json"
  "$PY" "$HERE/peer_bench.py" nats --addr "127.0.0.1:$NATS_PORT" "$mode" --size "$SIZE" \
    --producers "$PRODUCERS" --seconds "$SECONDS_PER_RUN" "${peer_args[@]}" >"$WORK/nats-$mode.json"
  "$PY" "$HERE/peer_bench.py" compare "$WORK/shoal-$mode.json" "$WORK/redis-$mode.json" \
    "$WORK/nats-$mode.json"
}

echo "== produce, as fast as possible (synchronous sends, one outstanding per producer)"
bench_all produce
echo "== end to end at a fixed rate"
bench_all e2e --rate "$RATE" --consumers "$CONSUMERS" -- --rate "$RATE" --consumers "$CONSUMERS"

echo "== redis-benchmark (Redis's own tool): XADD, ${PRODUCERS} client(s), no pipelining"
PAYLOAD=$(head -c "$SIZE" /dev/zero | tr '\0' 'a')
redis-benchmark -p "$REDIS_PORT" -c "$PRODUCERS" -n 50000 --csv XADD rbstream '*' d "$PAYLOAD" \
  | sed 's/^/  /'
echo "  (NATS's own benchmark tool, 'nats bench', is in natscli, which Debian does not package.)"
