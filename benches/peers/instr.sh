#!/usr/bin/env bash
# Instructions per message in the broker: a CPU figure that does not depend on the machine's
# speed or on its neighbours (this shared machine's CPU time per message moves by up to 2x
# within minutes; instruction counts repeat to about 0.1%).
#
# Starts `shoal dev` under valgrind's callgrind with instrumentation off, warms it up with
# COUNT/4 sends, switches instrumentation on, runs `shoal bench produce --count COUNT`,
# switches it off and dumps, then prints the user-space instructions the broker process
# executed (every thread) per message. Under callgrind the broker runs some 50x slower, so a
# run covers how much work a send costs, not how requests batch at full speed: compare builds
# with the same arguments. Kernel work (syscalls, TCP) is not counted.
#
#   benches/peers/instr.sh target/release/shoal [INFLIGHT=16] [BATCH=1] [COUNT=20000] [PORT=28600]
#
# With TOP=N it also prints the N functions with the most instructions (callgrind_annotate,
# self cost). KEEP=1 keeps the callgrind output; BENCH_ARGS adds arguments to the measured
# `shoal bench produce` (e.g. BENCH_ARGS="--serialize-type rocketmq"). Needs valgrind
# (Debian's package). Run by hand, not in CI.
set -euo pipefail

BIN=$(readlink -f "${1:?usage: instr.sh SHOAL_BINARY [INFLIGHT] [BATCH] [COUNT] [PORT]}")
INFLIGHT=${2:-16}
BATCH=${3:-1}
COUNT=${4:-20000}
PORT=${5:-28600}
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
WORK=$(mktemp -d /tmp/shoal-instr.XXXXXX)

cleanup() {
    [[ -n "${DEV:-}" ]] && kill "$DEV" 2>/dev/null && wait "$DEV" 2>/dev/null || true
    if [[ -n "${KEEP:-}" ]]; then echo "callgrind output kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$WORK/callgrind.out" \
    "$BIN" dev --namesrv-port "$PORT" --broker-port $((PORT + 11)) --http-port 0 --kafka-port 0 \
    --data-dir "$WORK/data" >"$WORK/dev.log" 2>&1 &
DEV=$!

bench() {
    "$BIN" bench produce --namesrv "127.0.0.1:$PORT" --producers 8 --inflight "$INFLIGHT" \
        --batch "$BATCH" ${BENCH_ARGS:-} "$@"
}
# Ready when a send goes through (the broker registers with the name server first).
for _ in $(seq 1 120); do
    if "$BIN" bench produce --namesrv "127.0.0.1:$PORT" --count 8 >/dev/null 2>&1; then break; fi
    sleep 1
done
bench --count $((COUNT / 4)) >/dev/null
callgrind_control -i on "$DEV" >/dev/null 2>&1
bench --count "$COUNT" --no-create | grep -E '^sent'
callgrind_control -i off "$DEV" >/dev/null 2>&1
callgrind_control -d "$DEV" >/dev/null 2>&1

# The dump is callgrind.out.1 (callgrind.out itself is written at exit, with nothing counted).
OUT="$WORK/callgrind.out.1"
for _ in $(seq 1 50); do [[ -s "$OUT" ]] && grep -q '^totals:' "$OUT" && break; sleep 0.2; done
TOTAL=$(awk '/^totals:/ {print $2}' "$OUT")
echo "instructions per message: $((TOTAL / COUNT)) (${TOTAL} in all, ${COUNT} messages, ${INFLIGHT} in flight x 8 producers, batch ${BATCH})"
if [[ -n "${TOP:-}" ]]; then
    callgrind_annotate --inclusive=no "$OUT" 2>/dev/null | grep -E '^ *[0-9,]+ \(' | sed -n "2,$((TOP + 1))p"
fi
