#!/usr/bin/env bash
# Allocations per message in the broker: a count that does not depend on the machine's speed.
#
# Starts `shoal dev` on a fresh data directory, warms it up with 20 000 sends, then counts the
# calls of mimalloc's allocation entry points (uprobes) in the broker process while
# `shoal bench produce --count N` runs, and prints them per message. Needs perf and root
# (uprobes). Run by hand, not in CI.
#
#   benches/peers/allocs.sh target/release/shoal [INFLIGHT=16] [BATCH=1] [COUNT=100000] [PORT=27600]
#
# The binary must use mimalloc (the `shoal` binary does) and keep its symbol table (not
# stripped; this workspace's release builds keep it).
set -euo pipefail

BIN=$(readlink -f "${1:?usage: allocs.sh SHOAL_BINARY [INFLIGHT] [BATCH] [COUNT] [PORT]}")
INFLIGHT=${2:-16}
BATCH=${3:-1}
COUNT=${4:-100000}
PORT=${5:-27600}
DATA=$(mktemp -d /tmp/shoal-allocs.XXXXXX)
# The `shoal` binary's allocator enters mimalloc through the plain entry points for alignments
# up to a word and through the aligned ones above (crates/shoal/src/alloc.rs): each allocation
# is one call of one of these.
PROBES=(mi_malloc mi_zalloc mi_realloc mi_malloc_aligned mi_zalloc_aligned mi_realloc_aligned)

GROUP=shoal_allocs_$$
cleanup() {
    [[ -n "${DEV:-}" ]] && kill "$DEV" 2>/dev/null && wait "$DEV" 2>/dev/null || true
    perf probe -q -d "${GROUP}:*" 2>/dev/null || true
    rm -rf "$DATA"
}
trap cleanup EXIT

events=()
for p in "${PROBES[@]}"; do
    perf probe -q -f -x "$BIN" -a "${GROUP}:${p}=${p}"
    events+=("${GROUP}:${p}")
done

"$BIN" dev --namesrv-port "$PORT" --broker-port $((PORT + 1)) --data-dir "$DATA" --flush async \
    >"$DATA.log" 2>&1 &
DEV=$!
for _ in $(seq 100); do
    "$BIN" --namesrv "127.0.0.1:$PORT" topic create AllocT --queues 8 >/dev/null 2>&1 && break
    sleep 0.2
done
bench() {
    "$BIN" --namesrv "127.0.0.1:$PORT" --json bench produce --topic AllocT --size 128 \
        --producers 8 --count "$1" --inflight "$INFLIGHT" --batch "$BATCH" >/dev/null
}
bench 20000
OUT=$(mktemp)
perf stat -x, -e "$(IFS=,; echo "${events[*]}")" -p "$DEV" -o "$OUT" &
STAT=$!
sleep 0.5
bench "$COUNT"
sleep 0.3
kill -INT "$STAT"
wait "$STAT" || true
echo "broker allocations per message (8 producers x $INFLIGHT in flight, batch $BATCH, $COUNT messages):"
awk -F, -v n="$COUNT" '$1 ~ /^[0-9]+$/ { total += $1; printf "  %-40s %8.2f\n", $3, $1 / n }
    END { printf "  %-40s %8.2f\n", "total", total / n }' "$OUT"
rm -f "$OUT" "$DATA.log"
