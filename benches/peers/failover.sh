#!/usr/bin/env bash
# How long a replicated group's sends stop when its master is SIGKILLed, as a Shoal-client
# producer sees it. Each run, from scratch: a name server, one controller voter and three
# brokers of `broker-a` (sync flush, `ack = in_sync_set`), a topic of 4 queues, a producer
# (`shoal send --interval-ms 10`) sending one message every 10 ms; once all three are in sync
# and sends flow, the master is SIGKILLed. Per run it prints when the new master took over
# (its log's "replication role changed ... to=Master" line) and when the first send made
# after the kill was acknowledged, both counted from the kill, the sends that failed in
# between (they are not acknowledged, so not lost), and when a Shoal consumer (`shoal consume`,
# one member of a classic group, reading from the first message) first received a message
# acknowledged after the kill. Then the median, p99 and max.
#
# With KILL=replica a replica of the in-sync set is SIGKILLed instead, and each run prints the
# longest time between two acknowledgements after the kill (sends should not stop).
#
# Usage: benches/peers/failover.sh [RUNS]        (default 20)
#   KILL        master (default) or replica
#   SHOAL_BIN   default target/release/shoal (cargo build --release -p shoal)
#   BASE_PORT   first of 5 ports (default 27800)
#   RUST_LOG    the servers' log filter (default info)
#   KEEP=1      keep the logs and data (under $TMPDIR, /tmp by default) and print where
# Needs: jq, python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-20}
bin=$(realpath "${SHOAL_BIN:-target/release/shoal}")
[ -x "$bin" ] || { echo "no shoal binary at $bin" >&2; exit 1; }
base=${BASE_PORT:-27800}
victim=${KILL:-master}
work=$(mktemp -d "${TMPDIR:-/tmp}/shoal-failover.XXXXXX")
log=${RUST_LOG:-info}
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
if [ "${KEEP:-}" = 1 ]; then
  trap 'stop_all; echo "logs kept in $work" >&2' EXIT
else
  trap 'stop_all; rm -rf "$work"' EXIT
fi
results=$work/results
: >"$results"

for run in $(seq 1 "$runs"); do
  d=$work/run$run
  mkdir -p "$d"
  ns=127.0.0.1:$base
  ctl=127.0.0.1:$((base + 1))
  RUST_LOG=$log "$bin" namesrv --listen "$ns" >"$d/ns.out" 2>&1 &
  pids+=($!)
  RUST_LOG=$log "$bin" controller --listen "$ctl" --data-dir "$d/ctl" >"$d/ctl.out" 2>&1 &
  pids+=($!)
  brokers=()
  for i in 1 2 3; do
    RUST_LOG=$log "$bin" broker --listen 127.0.0.1:$((base + 1 + i)) --namesrv "$ns" \
      --broker-name broker-a --data-dir "$d/r$i" --flush sync --controller "$ctl" >"$d/r$i.out" 2>&1 &
    brokers+=($!)
    pids+=($!)
  done
  for _ in $(seq 1 200); do
    n=$("$bin" cluster status --controller "$ctl" --json 2>/dev/null | jq '.groups["broker-a"].inSync | length' 2>/dev/null || echo 0)
    [ "$n" = 3 ] && break
    sleep 0.3
  done
  "$bin" --namesrv "$ns" topic create Failover --queues 4 >/dev/null
  sleep 2
  # Each acknowledgement line stamped with the time it came.
  SHOAL_NAMESRV=$ns "$bin" send Failover --body 'm-{i}' --count 1000000 --interval-ms 10 --json \
    2>"$d/prod.err" > >(python3 -u -c '
import sys, time
for line in sys.stdin:
    print("%.3f %s" % (time.time(), line.strip()))' >"$d/prod.out") &
  pids+=($!)
  SHOAL_NAMESRV=$ns "$bin" consume Failover --group failover-readers --from first --json \
    2>"$d/cons.err" > >(python3 -u -c '
import sys, time
for line in sys.stdin:
    print("%.3f %s" % (time.time(), line.strip()))' >"$d/cons.out") &
  pids+=($!)
  sleep 3
  addrs=$("$bin" --namesrv "$ns" cluster list --json | jq -r '.brokerAddrTable["broker-a"].brokerAddrs')
  if [ "$victim" = replica ]; then
    target=$(echo "$addrs" | jq -r 'to_entries[] | select(.key != "0") | .value' | head -1)
  else
    target=$(echo "$addrs" | jq -r '.["0"]')
  fi
  i=$((${target##*:} - base - 1))
  killed=$(date +%s.%N)
  kill -9 "${brokers[$((i - 1))]}"
  wait "${brokers[$((i - 1))]}" 2>/dev/null || true
  sleep 4
  stop_all
  if [ "$victim" = replica ]; then
    python3 - "$d" "$killed" <<'EOF'
import sys
d, killed = sys.argv[1], float(sys.argv[2])
acks = [float(l.split()[0]) for l in open(d + "/prod.out")]
after = [t for t in acks if t > killed]
gap = max((b - a for a, b in zip([killed] + after, after)), default=float("nan"))
failed = sum(1 for l in open(d + "/prod.err") if "not sent" in l)
print("run: replica killed; %d sends acknowledged after it, longest time between two %.3f s, %d failed" % (len(after), gap, failed))
EOF
    continue
  fi
  python3 - "$d" "$killed" >>"$results" <<'EOF'
import datetime, glob, sys
d, killed = sys.argv[1], float(sys.argv[2])
took = []
for f in glob.glob(d + "/r*.out"):
    for line in open(f):
        if "replication role changed" in line and "to=Master" in line:
            t = datetime.datetime.strptime(line[:26] + "Z", "%Y-%m-%dT%H:%M:%S.%fZ")
            took.append(t.replace(tzinfo=datetime.timezone.utc).timestamp())
elected = max(took) - killed
# The first acknowledgement of a send made after the kill (not one in flight then).
first = next(float(l.split()[0]) for l in open(d + "/prod.out") if float(l.split()[0]) > killed + 0.05)
failed = sum(1 for l in open(d + "/prod.err") if "not sent" in l)
# The first message consumed whose send was acknowledged after the kill.
import json
after = set()
for l in open(d + "/prod.out"):
    t, rest = l.split(" ", 1)
    if float(t) > killed + 0.05 and rest.strip().startswith("{"):
        after.add("m-%d" % json.loads(rest)["n"])
consumed = float("nan")
for l in open(d + "/cons.out"):
    t, rest = l.split(" ", 1)
    if rest.strip().startswith("{") and json.loads(rest).get("body") in after:
        consumed = float(t)
        break
print("%.3f %.3f %d %.3f" % (elected, first - killed, failed, consumed - killed))
EOF
  read -r e f n c < <(tail -1 "$results")
  printf 'run %3d: new master after %.3f s, first send acknowledged after %.3f s, %d sends failed in between, first such message consumed after %.3f s\n' "$run" "$e" "$f" "$n" "$c"
done

[ "$victim" = replica ] && exit 0
python3 - "$results" <<'EOF'
import sys
rows = [tuple(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, round((len(v) - 1) * p))]
for name, i in (("new master after", 0), ("first send acknowledged after", 1),
                ("a message acknowledged after the kill first consumed after", 3)):
    v = [r[i] for r in rows]
    print("%s: min %.3f s, median %.3f s, p99 %.3f s, max %.3f s (%d runs)" % (name, min(v), pct(v, 0.5), pct(v, 0.99), max(v), len(v)))
EOF
