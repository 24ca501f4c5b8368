#!/usr/bin/env bash
# Replication's cost, side by side in one sitting: a lone broker against a replicated group of
# three (one controller voter, `ack = in_sync_set`: a send is answered once all three have it,
# each replica's copy written: with async flush a replica acknowledges what reached its page cache
# and its flusher syncs it later), all with async flush, the same Shoal client
# (`shoal bench produce`). With ROCKETMQ=1, a third target: Apache RocketMQ 5.3.3 in controller
# mode from the class path .ci/setup.d/20-java.sh writes (a name server with the controller
# embedded, one voter; three brokers of one group with `enableControllerMode`,
# `allAckInSyncStateSet=true`, async flush), measured only once its in-sync set (SyncStateSet)
# has all three. Each round, on each target (the order reverses from round to round): a fresh
# topic of 8 queues, COUNT messages of SIZE bytes from PRODUCERS producers, unbatched, then in
# batches of BATCH. For each phase: messages per second (the client's clock), the send's
# acknowledgement latency (p50/p99; in batches, a batch's), the servers' CPU
# per message (utime + stime from /proc/PID/stat over the phase: lone = name server + broker;
# replicated = name server + controller + three brokers, and the master's share alone;
# rocketmq = the name server's JVM, which runs the controller, + three broker JVMs, and the
# master's alone), and the size of the in-sync set after the phase. Before the first round, the
# servers' CPU while idle, per second, for reading the per-message figures of slow phases.
#
# Usage: benches/peers/replicated.sh [ROUNDS]            (default 2)
#   SHOAL_BIN   default target/release/shoal (cargo build --release -p shoal)
#   COUNT, SIZE, PRODUCERS, BATCH   (defaults 100000, 128, 8, 32)
#   BASE_PORT   first of 40 ports (default 27300)
#   REPL_ARGS   more arguments for the three replicated brokers (e.g. "-c repl.toml")
#   WORK_PREFIX where the data directories go, WORK_PREFIX.XXXXXX (default
#               /tmp/shoal-repl-bench)
#   ROCKETMQ=1  add the RocketMQ group; RMQ_HEAP its brokers' heap (default 1g; the name server
#               512m); WARMUP the length of an unreported warm-up run on it, unbatched then in
#               batches (default 30s each), as its JIT compiles the hot paths under load first
#               (with 10s its unbatched rate still rose from round to round). Its broker
#               refuses sends on a file system over 90% full by its count: the
#               script says so, then use another WORK_PREFIX (e.g. /dev/shm/shoal-repl-bench)
# Needs: jq; with ROCKETMQ=1, java and the class path above.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lib.sh
. benches/peers/lib.sh
rounds=${1:-2}
bin=$(realpath "${SHOAL_BIN:-target/release/shoal}")
[ -x "$bin" ] || { echo "no shoal binary at $bin" >&2; exit 1; }
command -v jq >/dev/null || { echo "jq not found" >&2; exit 1; }
rmq=${ROCKETMQ:-0}
[ "$rmq" = 0 ] || rmq_check || exit 1
count=${COUNT:-100000}
size=${SIZE:-128}
producers=${PRODUCERS:-8}
batch=${BATCH:-32}
base=${BASE_PORT:-27300}
work=$(mktemp -d "${WORK_PREFIX:-/tmp/shoal-repl-bench}.XXXXXX")
pids=()
[ "$rmq" = 0 ] || rmq_disk_check "$work" || { rm -rf "$work"; exit 1; }
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

tck=$(getconf CLK_TCK)
wait_master() { # NAMESRV [LOGS...]
  local i ns=$1
  shift
  for i in $(seq 1 240); do
    "$bin" --namesrv "$ns" cluster list --json 2>/dev/null | jq -e '.brokerAddrTable["broker-a"].brokerAddrs["0"] != null' >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "no master behind $ns" >&2
  [ $# = 0 ] || tail -n 20 "$@" >&2
  exit 1
}
master_of() { # NAMESRV: the master's address
  "$bin" --namesrv "$1" cluster list --json | jq -r '.brokerAddrTable["broker-a"].brokerAddrs["0"]'
}

# The lone broker.
lone_ns=127.0.0.1:$base
"$bin" namesrv --listen "$lone_ns" >"$work/lone-ns.out" 2>&1 &
lone_ns_pid=$!
"$bin" broker --listen 127.0.0.1:$((base + 1)) --namesrv "$lone_ns" --data-dir "$work/lone" \
  --flush async >"$work/lone.out" 2>&1 &
lone_pid=$!
pids+=("$lone_ns_pid" "$lone_pid")

# The replicated group.
repl_ns=127.0.0.1:$((base + 10))
ctl=127.0.0.1:$((base + 11))
"$bin" namesrv --listen "$repl_ns" >"$work/repl-ns.out" 2>&1 &
repl_ns_pid=$!
"$bin" controller --listen "$ctl" --data-dir "$work/ctl" >"$work/ctl.out" 2>&1 &
ctl_pid=$!
pids+=("$repl_ns_pid" "$ctl_pid")
repl_pids=()
for i in 1 2 3; do
  "$bin" broker --listen 127.0.0.1:$((base + 11 + i)) --namesrv "$repl_ns" --broker-name broker-a \
    --data-dir "$work/r$i" --flush async --controller "$ctl" ${REPL_ARGS:-} >"$work/r$i.out" 2>&1 &
  repl_pids+=($!)
  pids+=($!)
done

# RocketMQ in controller mode: the controller embedded in the name server (its Raft peer
# address is also where brokers reach it), brokers on ports base+25, +30, +35 (each also binds
# its port - 2 and, for replication, port + 1). Each broker starts as a slave without an id: the
# controller assigns the ids and elects the master.
rmq_ns=127.0.0.1:$((base + 20))
rmq_ctl=127.0.0.1:$((base + 21))
rmq_pids=()
if [ "$rmq" != 0 ]; then
  mkdir -p "$work/rmq-ns"
  cat >"$work/rmq-ns/namesrv.conf" <<EOF
listenPort=$((base + 20))
enableControllerInNamesrv=true
controllerDLegerGroup=bench
controllerDLegerPeers=n0-$rmq_ctl
controllerDLegerSelfId=n0
controllerStorePath=$work/rmq-ns/controller
enableElectUncleanMaster=false
notifyBrokerRoleChanged=true
EOF
  rmq_java "$work/rmq-ns" 512m org.apache.rocketmq.namesrv.NamesrvStartup -c "$work/rmq-ns/namesrv.conf" &
  rmq_ns_pid=$!
  pids+=("$rmq_ns_pid")
  for i in 1 2 3; do
    d=$work/rmq-b$i
    mkdir -p "$d"
    cat >"$d/broker.conf" <<EOF
brokerClusterName=DefaultCluster
brokerName=broker-a
brokerId=-1
brokerRole=SLAVE
listenPort=$((base + 20 + 5 * i))
namesrvAddr=$rmq_ns
brokerIP1=127.0.0.1
storePathRootDir=$d/store
storePathCommitLog=$d/store/commitlog
flushDiskType=ASYNC_FLUSH
autoCreateTopicEnable=false
enableControllerMode=true
controllerAddr=$rmq_ctl
allAckInSyncStateSet=true
EOF
    rmq_java "$d" "${RMQ_HEAP:-1g}" org.apache.rocketmq.broker.BrokerStartup -c "$d/broker.conf" &
    rmq_pids+=($!)
    pids+=($!)
  done
fi

# In-sync set sizes, as each group's controller sees it.
in_sync_shoal() {
  "$bin" cluster status --controller "$ctl" --json | jq '.groups["broker-a"].inSync | length'
}
in_sync_rmq() {
  rmq_admin "$work/rmq-ns" getSyncStateSet -a "$rmq_ctl" -b broker-a |
    sed -n 's/^#SyncStateSetNums[[:space:]]*//p'
}

wait_master "$lone_ns" "$work/lone.out"
wait_master "$repl_ns" "$work"/r?.out
# The three in sync before measuring.
for i in $(seq 1 240); do
  [ "$(in_sync_shoal)" = 3 ] && break
  sleep 0.5
done
repl_master=""
for i in 1 2 3; do
  [ "127.0.0.1:$((base + 11 + i))" = "$(master_of "$repl_ns")" ] && repl_master=${repl_pids[$((i - 1))]}
done
targets="lone replicated"
if [ "$rmq" != 0 ]; then
  wait_master "$rmq_ns" "$work"/rmq-ns/*.out "$work"/rmq-b?/*.out \
    "$work"/rmq-b?/logs/rocketmqlogs/broker.log
  n=""
  for i in $(seq 1 60); do
    n=$(in_sync_rmq)
    [ "$n" = 3 ] && break
    sleep 1
  done
  if [ "$n" != 3 ]; then
    echo "RocketMQ's in-sync set did not reach three (last: ${n:-none})" >&2
    tail -n 20 "$work"/rmq-b?/logs/rocketmqlogs/broker.log >&2 || true
    exit 1
  fi
  rmq_master=""
  for i in 1 2 3; do
    [ "127.0.0.1:$((base + 20 + 5 * i))" = "$(master_of "$rmq_ns")" ] && rmq_master=${rmq_pids[$((i - 1))]}
  done
  # Warm-up (not reported), then the in-sync set again: a replica that fell behind by more
  # than haMaxTimeSlaveNotCatchup (15 s) would have been dropped from it.
  w=${WARMUP:-30s}
  "$bin" --namesrv "$rmq_ns" topic create Warmup --queues 8 >/dev/null
  "$bin" --namesrv "$rmq_ns" bench produce --topic Warmup --no-create --producers "$producers" \
    --size "$size" --duration "$w" >/dev/null 2>&1
  "$bin" --namesrv "$rmq_ns" bench produce --topic Warmup --no-create --producers "$producers" \
    --size "$size" --duration "$w" --batch "$batch" >/dev/null 2>&1
  targets="lone replicated rocketmq"
  echo "RocketMQ 5.3.3 controller mode: master $(master_of "$rmq_ns"), in sync: $(in_sync_rmq) after the warm-up"
fi
# What the servers spend idle (timers, heartbeats, replication's polls), which the per-message
# figures include for the length of each phase (after a pause: the warm-up's tail settles).
sleep 5
i0=$(ticks "$lone_ns_pid" "$lone_pid")
r0=$(ticks "$repl_ns_pid" "$ctl_pid" "${repl_pids[@]}")
[ "$rmq" = 0 ] || q0=$(ticks "$rmq_ns_pid" "${rmq_pids[@]}")
sleep 5
idle="lone $(( ($(ticks "$lone_ns_pid" "$lone_pid") - i0) * 1000 / tck / 5 )) ms/s"
idle+=", replicated $(( ($(ticks "$repl_ns_pid" "$ctl_pid" "${repl_pids[@]}") - r0) * 1000 / tck / 5 )) ms/s"
[ "$rmq" = 0 ] || idle+=", rocketmq $(( ($(ticks "$rmq_ns_pid" "${rmq_pids[@]}") - q0) * 1000 / tck / 5 )) ms/s"
echo "servers' CPU while idle (5 s): $idle"
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"

phase() { # TARGET NAMESRV TOPIC BATCHARG MASTER-PID|- PIDS...
  local target=$1 ns=$2 topic=$3 b=$4 master=$5
  shift 5
  local t0 t1 m0=0 j rate errors ack cpu mcpu="" in_sync
  "$bin" --namesrv "$ns" topic create "$topic" --queues 8 >/dev/null
  sleep 1
  t0=$(ticks "$@")
  [ "$master" = - ] || m0=$(ticks "$master")
  j=$("$bin" --namesrv "$ns" --json bench produce --topic "$topic" --no-create \
    --producers "$producers" --count "$count" --size "$size" $b 2>>"$work/bench.err")
  t1=$(ticks "$@")
  [ "$master" = - ] || mcpu=$(echo "scale=1; ($(ticks "$master") - $m0) * 1000000 / $tck / $count" | bc)
  rate=$(echo "$j" | jq -r '.produce.msgs_per_s')
  errors=$(echo "$j" | jq -r '.produce.errors')
  ack=$(echo "$j" | jq -r '.produce.ack_latency | "\(.p50_ms)/\(.p99_ms)"')
  cpu=$(echo "scale=1; ($t1 - $t0) * 1000000 / $tck / $count" | bc)
  case $target in
    replicated) in_sync=$(in_sync_shoal) ;;
    rocketmq) in_sync=$(in_sync_rmq) ;;
    *) in_sync="" ;;
  esac
  printf '%-10s %-12s %10s msg/s  %7s us CPU/msg (servers)  %-22s ack p50/p99 %-14s %-10s errors %s  load %s\n' \
    "$target" "${b:-unbatched}" "$rate" "$cpu" "${mcpu:+$mcpu us on the master}" "$ack ms" \
    "${in_sync:+in sync $in_sync}" "$errors" "$(cut -d' ' -f1 /proc/loadavg)"
}

n=0
for r in $(seq 1 "$rounds"); do
  for b in "" "--batch $batch"; do
    n=$((n + 1))
    order=$targets
    [ $((r % 2)) = 1 ] || order=$(echo "$targets" | tr ' ' '\n' | tac | tr '\n' ' ')
    for t in $order; do
      case $t in
        lone) phase lone "$lone_ns" "Bench$n" "$b" - "$lone_ns_pid" "$lone_pid" ;;
        replicated) phase replicated "$repl_ns" "Bench$n" "$b" "$repl_master" \
          "$repl_ns_pid" "$ctl_pid" "${repl_pids[@]}" ;;
        rocketmq) phase rocketmq "$rmq_ns" "Bench$n" "$b" "$rmq_master" \
          "$rmq_ns_pid" "${rmq_pids[@]}" ;;
      esac
    done
  done
done
