#!/usr/bin/env bash
# Replication's cost, side by side in one sitting: a lone broker against a replicated group of
# three (one controller voter, `ack = in_sync_set`: a send is answered once all three have it,
# each replica's copy written: with async flush a replica acknowledges what reached its page cache
# and its flusher syncs it later), all with async flush, the same Shoal client
# (`shoal bench produce`). Each round, on each target (the order alternates from round to
# round): a fresh topic of 8 queues, COUNT messages of SIZE bytes from PRODUCERS producers,
# unbatched, then in batches of BATCH. For each phase: messages per second (the client's
# clock) and the servers' CPU per message (utime + stime from /proc/PID/stat over the phase:
# lone = name server + broker; replicated = name server + controller + three brokers, and the
# master's share alone).
#
# Usage: benches/peers/replicated.sh [ROUNDS]            (default 2)
#   SHOAL_BIN   default target/release/shoal (cargo build --release -p shoal)
#   COUNT, SIZE, PRODUCERS, BATCH   (defaults 100000, 128, 8, 32)
#   BASE_PORT   first of 20 ports (default 27300)
#   REPL_ARGS   more arguments for the three replicated brokers (e.g. "-c repl.toml")
# Needs: jq.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-2}
bin=$(realpath "${SHOAL_BIN:-target/release/shoal}")
[ -x "$bin" ] || { echo "no shoal binary at $bin" >&2; exit 1; }
command -v jq >/dev/null || { echo "jq not found" >&2; exit 1; }
count=${COUNT:-100000}
size=${SIZE:-128}
producers=${PRODUCERS:-8}
batch=${BATCH:-32}
base=${BASE_PORT:-27300}
work=$(mktemp -d /tmp/shoal-repl-bench.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

ticks() { # PIDS...: utime + stime
  local t=0 p f
  for p in "$@"; do
    f=$(sed 's/.*) //' "/proc/$p/stat")
    set -- $f
    t=$((t + ${12} + ${13}))
  done
  echo "$t"
}
tck=$(getconf CLK_TCK)
wait_master() { # NAMESRV
  local i
  for i in $(seq 1 240); do
    "$bin" --namesrv "$1" cluster list --json 2>/dev/null | jq -e '.brokerAddrTable["broker-a"].brokerAddrs["0"] != null' >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "no master behind $1" >&2
  exit 1
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
wait_master "$lone_ns"
wait_master "$repl_ns"
# The three in sync before measuring.
for i in $(seq 1 240); do
  n=$("$bin" cluster status --controller "$ctl" --json | jq '.groups["broker-a"].inSync | length')
  [ "$n" = 3 ] && break
  sleep 0.5
done
master_addr=$("$bin" --namesrv "$repl_ns" cluster list --json | jq -r '.brokerAddrTable["broker-a"].brokerAddrs["0"]')
master_pid=""
for i in 1 2 3; do
  [ "127.0.0.1:$((base + 11 + i))" = "$master_addr" ] && master_pid=${repl_pids[$((i - 1))]}
done

phase() { # TARGET NAMESRV TOPIC BATCHARG PIDS...
  local target=$1 ns=$2 topic=$3 b=$4
  shift 4
  local t0 t1 j rate cpu mcpu=""
  "$bin" --namesrv "$ns" topic create "$topic" --queues 8 >/dev/null
  sleep 1
  t0=$(ticks "$@")
  m0=0
  [ "$target" = replicated ] && m0=$(ticks "$master_pid")
  j=$("$bin" --namesrv "$ns" --json bench produce --topic "$topic" --no-create \
    --producers "$producers" --count "$count" --size "$size" $b)
  t1=$(ticks "$@")
  rate=$(echo "$j" | jq -r '.produce.msgs_per_s')
  cpu=$(echo "scale=1; ($t1 - $t0) * 1000000 / $tck / $count" | bc)
  if [ "$target" = replicated ]; then
    mcpu=$(echo "scale=1; ($(ticks "$master_pid") - $m0) * 1000000 / $tck / $count" | bc)
  fi
  printf '%-10s %-12s %10s msg/s  %7s us CPU/msg (servers)  %s\n' "$target" "${b:-unbatched}" \
    "$rate" "$cpu" "${mcpu:+$mcpu us on the master}"
}

n=0
for r in $(seq 1 "$rounds"); do
  for b in "" "--batch $batch"; do
    n=$((n + 1))
    if [ $((r % 2)) = 1 ]; then order="lone replicated"; else order="replicated lone"; fi
    for t in $order; do
      if [ "$t" = lone ]; then
        phase lone "$lone_ns" "Bench$n" "$b" "$lone_ns_pid" "$lone_pid"
      else
        phase replicated "$repl_ns" "Bench$n" "$b" "$repl_ns_pid" "$ctl_pid" "${repl_pids[@]}"
      fi
    done
  done
done
