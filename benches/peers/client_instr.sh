#!/usr/bin/env bash
# Instructions per send in the client: `shoal bench produce` run under valgrind's callgrind
# against a `shoal dev` running at full speed, counting every user-space instruction of the
# client process (start-up, route lookups and the report included, which at 20,000 sends add
# under 1% per send). The machine-independent companion of instr.sh, which counts the broker.
#
#   benches/peers/client_instr.sh BROKER_BINARY CLIENT_BINARY [INFLIGHT=16] [COUNT=20000] [PORT=28700]
#
# The two binaries may differ (e.g. a client build against one broker build). With TOP=N it
# also prints the N functions with the most instructions (INCLUSIVE=1: inclusive cost);
# KEEP=1 keeps the callgrind output; BENCH_ARGS adds arguments to both `shoal bench produce`
# runs (e.g. BENCH_ARGS="--batch 32": COUNT is then messages, and the figure is per message).
# Needs valgrind. Run by hand, not in CI.
set -euo pipefail

BROKER=$(readlink -f "${1:?usage: client_instr.sh BROKER_BINARY CLIENT_BINARY [INFLIGHT] [COUNT] [PORT]}")
CLIENT=$(readlink -f "${2:?usage: client_instr.sh BROKER_BINARY CLIENT_BINARY [INFLIGHT] [COUNT] [PORT]}")
INFLIGHT=${3:-16}
COUNT=${4:-20000}
PORT=${5:-28700}
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
WORK=$(mktemp -d /tmp/shoal-client-instr.XXXXXX)

cleanup() {
    [[ -n "${DEV:-}" ]] && kill "$DEV" 2>/dev/null && wait "$DEV" 2>/dev/null || true
    if [[ -n "${KEEP:-}" ]]; then echo "callgrind output kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

"$BROKER" dev --namesrv-port "$PORT" --broker-port $((PORT + 11)) --http-port 0 --kafka-port 0 \
    --data-dir "$WORK/data" >"$WORK/dev.log" 2>&1 &
DEV=$!
for _ in $(seq 1 120); do
    if "$BROKER" bench produce --namesrv "127.0.0.1:$PORT" --count 8 >/dev/null 2>&1; then break; fi
    sleep 1
done
# Warm the broker (page cache, topic) at full speed first.
"$BROKER" bench produce --namesrv "127.0.0.1:$PORT" --producers 8 --inflight "$INFLIGHT" \
    --count "$COUNT" ${BENCH_ARGS:-} >/dev/null
valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.out" \
    "$CLIENT" bench produce --namesrv "127.0.0.1:$PORT" --producers 8 --inflight "$INFLIGHT" \
    --count "$COUNT" --no-create ${BENCH_ARGS:-} 2>&1 | grep -E '^sent'
TOTAL=$(awk '/^totals:/ {print $2}' "$WORK/callgrind.out")
echo "client instructions per message: $((TOTAL / COUNT)) (${TOTAL} in all, ${COUNT} messages, ${INFLIGHT} in flight x 8 producers)"
if [[ -n "${TOP:-}" ]]; then
    callgrind_annotate --inclusive="$([[ -n "${INCLUSIVE:-}" ]] && echo yes || echo no)" \
        "$WORK/callgrind.out" 2>/dev/null | grep -E '^ *[0-9,]+ \(' | sed -n "2,$((TOP + 1))p"
fi
