#!/usr/bin/env bash
# The same `shoal bench produce` and `shoal bench e2e` runs against `shoal dev` and against
# Apache RocketMQ 5.3.3's own name server and broker (the class path that
# .ci/setup.d/20-java.sh writes), interleaved in one sitting: each round runs every benchmark
# on Shoal, then on RocketMQ. Both servers use asynchronous flush, a fresh data directory and
# 127.0.0.1. Beside each run it prints the servers' CPU per message (utime + stime from
# /proc/PID/stat over the run; RocketMQ: name server + broker JVMs), and the load average.
#
# Usage: tests/compat/bench-java-broker.sh [ROUNDS]        (default 2)
#   SHOAL_BIN   the shoal binary (default target/release/shoal: build with
#               `cargo build --release -p shoal`)
#   BASE_PORT   first of 20 ports used (default 23100)
#   JAVA_HEAP   RocketMQ broker heap (default 1g; its scripts' default of 8g does not fit small
#               machines)
#   BENCH_PRODUCE, BENCH_E2E  the bench arguments (defaults below)
#   WARMUP      length of the unreported warm-up produce run on each server (default 10s)
#   WORK_PREFIX where the data directories go, WORK_PREFIX.XXXXXX (default /tmp/shoal-bench-rmq;
#               RocketMQ's broker refuses sends on a file system over 90% full by its count:
#               the script says so, then use another, e.g. /dev/shm/shoal-bench-rmq)
# Prints one table row per run (markdown) and keeps the JSON reports in $OUT (default a
# temporary directory, removed at the end unless OUT is set).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-2}
# shellcheck source=../../benches/peers/lib.sh
. benches/peers/lib.sh
bin=$(realpath "${SHOAL_BIN:-target/release/shoal}")
[ -x "$bin" ] || { echo "no shoal binary at $bin (cargo build --release -p shoal)" >&2; exit 1; }
rmq_check || exit 1
command -v jq >/dev/null || { echo "jq not found" >&2; exit 1; }
base=${BASE_PORT:-23100}
heap=${JAVA_HEAP:-1g}
produce_args=${BENCH_PRODUCE:---size 128 --producers 8 --duration 10s}
e2e_args=${BENCH_E2E:---size 128 --rate 2000 --consumers 4 --duration 20s}
work=$(mktemp -d "${WORK_PREFIX:-/tmp/shoal-bench-rmq}.XXXXXX")
out=${OUT:-$work/reports}
mkdir -p "$out"
pids=()
rmq_disk_check "$work" || { rm -rf "$work"; exit 1; }
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work/shoal" "$work/rmq"
  [ -n "${OUT:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

tck=$(getconf CLK_TCK)

wait_up() { # NAMESRV BROKER-NAME
  local i
  for i in $(seq 1 360); do
    if "$bin" --namesrv "$1" cluster list --json 2>/dev/null | grep -q "$2"; then return 0; fi
    sleep 0.5
  done
  echo "server behind $1 did not come up" >&2
  exit 1
}

# Shoal: name server and broker in one process.
shoal_ns=127.0.0.1:$base
"$bin" dev --namesrv-port "$base" --broker-port $((base + 1)) --data-dir "$work/shoal" \
  --flush async --no-http >"$work/shoal.out" 2>&1 &
shoal_pid=$!
pids+=("$shoal_pid")

# RocketMQ: NamesrvStartup and BrokerStartup (the broker also binds port - 2 and port + 1).
rmq_ns_port=$((base + 10))
rmq_port=$((base + 13))
rmq_ns=127.0.0.1:$rmq_ns_port
mkdir -p "$work/rmq"
echo "listenPort=$rmq_ns_port" >"$work/rmq/namesrv.conf"
cat >"$work/rmq/broker.conf" <<EOF
brokerClusterName=DefaultCluster
brokerName=broker-a
brokerId=0
listenPort=$rmq_port
namesrvAddr=$rmq_ns
brokerIP1=127.0.0.1
storePathRootDir=$work/rmq/store
storePathCommitLog=$work/rmq/store/commitlog
flushDiskType=ASYNC_FLUSH
autoCreateTopicEnable=false
EOF
rmq_java "$work/rmq" 256m org.apache.rocketmq.namesrv.NamesrvStartup -c "$work/rmq/namesrv.conf" &
ns_pid=$!
pids+=("$ns_pid")
rmq_java "$work/rmq" "$heap" org.apache.rocketmq.broker.BrokerStartup -c "$work/rmq/broker.conf" &
broker_pid=$!
pids+=("$broker_pid")

wait_up "$shoal_ns" broker-a
wait_up "$rmq_ns" broker-a
echo "servers up: shoal dev (pid $shoal_pid), RocketMQ 5.3.3 (name server $ns_pid, broker $broker_pid, -Xmx$heap)"
echo "shoal: $("$bin" --version 2>/dev/null || echo "$bin"); java: $(java -version 2>&1 | head -1)"
echo

# Warm-up (not reported): the JVM compiles its hot paths during the first seconds of load.
for ns in "$shoal_ns" "$rmq_ns"; do
  "$bin" --namesrv "$ns" bench produce --topic Bench_warmup --producers 4 --duration "${WARMUP:-10s}" \
    --json >/dev/null 2>&1
done

echo "| round | bench | server | msgs/s | MB/s | ack p50 | ack p99 | ack p99.9 | e2e p50 | e2e p99 | e2e p99.9 | errors | lost | server CPU µs/msg | load |"
echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
run() { # ROUND BENCH SERVER NAMESRV PIDS...
  local round=$1 bench=$2 server=$3 ns=$4
  shift 4
  local args=$produce_args
  [ "$bench" = e2e ] && args=$e2e_args
  local topic="Bench_${bench}_${round}_${server}"
  local file="$out/$round-$bench-$server.json"
  local before after
  before=$(ticks "$@")
  # shellcheck disable=SC2086
  "$bin" --namesrv "$ns" bench "$bench" --topic "$topic" $args --json >"$file" 2>"$file.err"
  after=$(ticks "$@")
  local load
  load=$(cut -d' ' -f1 /proc/loadavg)
  jq -r --arg r "$round" --arg b "$bench" --arg s "$server" --arg load "$load" \
    --argjson cpu_us "$(( (after - before) * 1000000 / tck ))" '
    def f(x): if x == null then "-" else (x * 1000 | round / 1000 | tostring) end;
    (.produce.acknowledged) as $n |
    "| \($r) | \($b) | \($s) | \(.produce.msgs_per_s | round) | \(f(.produce.mb_per_s)) | \(f(.produce.ack_latency.p50_ms)) | \(f(.produce.ack_latency.p99_ms)) | \(f(.produce.ack_latency.p999_ms)) | \(f(.consume.e2e_latency.p50_ms)) | \(f(.consume.e2e_latency.p99_ms)) | \(f(.consume.e2e_latency.p999_ms)) | \(.produce.errors) | \(.consume.lost // "-") | \(if $n > 0 then ($cpu_us / $n * 10 | round / 10) else "-" end) | \($load) |"
  ' "$file"
}
for round in $(seq 1 "$rounds"); do
  for bench in produce e2e; do
    run "$round" "$bench" shoal "$shoal_ns" "$shoal_pid"
    run "$round" "$bench" rocketmq "$rmq_ns" "$ns_pid" "$broker_pid"
  done
done
echo
echo "produce: bench produce $produce_args; e2e: bench e2e $e2e_args (latencies in ms)"
[ -z "${OUT:-}" ] || echo "JSON reports in $out"
