#!/usr/bin/env bash
# RocketMQ 5's gRPC clients' path, side by side in one sitting: Shoal's broker serving the
# gRPC MessagingService itself (`shoal dev`) against Apache RocketMQ 5.3.3's name server,
# broker and gRPC proxy (three JVMs, the proxy in cluster mode), with the same client: the Go
# client golang/v5 (benches/peers/grpc-bench). Also Shoal's pull and POP paths over remoting
# with Shoal's own client (`shoal bench consume`, with and without `--pop`).
#
# Each round (the targets' order, and pull's and POP's, alternate from round to round), on each
# target: a fresh topic (8 queues, NORMAL), COUNT messages of SIZE bytes sent by PRODUCERS
# goroutines (synchronous sends), then received and acked by CONSUMERS simple consumers
# (batches of BATCH, invisible 30 s, one ack per message) until every message is acked. For
# each phase: messages per second (the client's clock) and the servers' CPU per message (utime
# + stime of the server processes from /proc/PID/stat over the phase; RocketMQ: name server +
# broker + proxy). The remoting rows: the same backlog on Shoal, sent again to further topics,
# consumed by `shoal bench consume` (PULL_MESSAGE after a rebalance) and `shoal bench consume
# --pop` (POP_MESSAGE, ACK_MESSAGE), CONSUMERS consumers each.
#
# Usage: benches/peers/grpc_vs_proxy.sh [ROUNDS]            (default 2)
#   SHOAL_BIN   default target/release/shoal (cargo build --release -p shoal)
#   COUNT, SIZE, PRODUCERS, CONSUMERS, BATCH   (defaults 50000, 128, 16, 4, 32)
#   WARM        messages sent and consumed on each target before the first round (50000)
#   BASE_PORT   first of 20 ports (default 27100)
# Needs: target/external/grpc-bench (in benches/peers/grpc-bench:
# GOPATH=$ROOT/target/external/gopath go build -o $ROOT/target/external/grpc-bench .) and
# target/external/rocketmq-proxy5.classpath (see benches/peers/rocketmq-proxy/pom.xml), java
# (17), jq.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-2}
bin=$(realpath "${SHOAL_BIN:-target/release/shoal}")
gb=$(realpath -m target/external/grpc-bench)
cpf=target/external/rocketmq-proxy5.classpath
[ -x "$bin" ] || { echo "no shoal binary at $bin" >&2; exit 1; }
[ -x "$gb" ] || { echo "no $gb: build benches/peers/grpc-bench" >&2; exit 1; }
[ -s "$cpf" ] || { echo "no $cpf: see benches/peers/rocketmq-proxy/pom.xml" >&2; exit 1; }
command -v jq >/dev/null || { echo "jq not found" >&2; exit 1; }
cp=$(cat "$cpf")
count=${COUNT:-50000}
size=${SIZE:-128}
producers=${PRODUCERS:-16}
consumers=${CONSUMERS:-4}
batch=${BATCH:-32}
warm=${WARM:-50000}
base=${BASE_PORT:-27100}
work=$(mktemp -d /tmp/shoal-grpc-bench.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

tck=$(getconf CLK_TCK)
ticks() { # PIDS...: utime + stime
  local t=0 p f
  for p in "$@"; do
    f=$(sed 's/.*) //' "/proc/$p/stat")
    set -- $f
    t=$((t + ${12} + ${13}))
  done
  echo "$t"
}

# Shoal: name server, broker and gRPC endpoint in one process.
shoal_ns=127.0.0.1:$base
shoal_grpc=127.0.0.1:$((base + 2))
"$bin" dev --namesrv-port "$base" --broker-port $((base + 1)) --grpc-port $((base + 2)) \
  --data-dir "$work/shoal" --flush async --no-http --no-kafka >"$work/shoal.out" 2>&1 &
shoal_pid=$!
pids+=("$shoal_pid")

# RocketMQ 5.3.3: name server, broker (it also binds port - 2 and port + 1), proxy.
rmq_ns=127.0.0.1:$((base + 10))
rmq_grpc=127.0.0.1:$((base + 16))
mkdir -p "$work/rmq"
echo "listenPort=$((base + 10))" >"$work/rmq/namesrv.conf"
cat >"$work/rmq/broker.conf" <<EOF
brokerClusterName=DefaultCluster
brokerName=broker-a
brokerId=0
listenPort=$((base + 13))
namesrvAddr=$rmq_ns
brokerIP1=127.0.0.1
storePathRootDir=$work/rmq/store
storePathCommitLog=$work/rmq/store/commitlog
flushDiskType=ASYNC_FLUSH
autoCreateTopicEnable=false
EOF
cat >"$work/rmq/proxy.json" <<EOF
{"rocketMQClusterName": "DefaultCluster", "namesrvAddr": "$rmq_ns",
 "grpcServerPort": $((base + 16)), "remotingListenPort": $((base + 17))}
EOF
jvm=(-server -XX:+UseG1GC -XX:-OmitStackTraceInFastThrow "-Duser.home=$work/rmq"
  "-Drocketmq.home.dir=$work/rmq")
(cd "$work/rmq" && exec java -Xms256m -Xmx256m "${jvm[@]}" -cp "$cp" \
  org.apache.rocketmq.namesrv.NamesrvStartup -c namesrv.conf >namesrv.out 2>&1) &
ns_pid=$!
pids+=("$ns_pid")
(cd "$work/rmq" && exec java -Xms1g -Xmx1g "${jvm[@]}" -cp "$cp" \
  org.apache.rocketmq.broker.BrokerStartup -c broker.conf >broker.out 2>&1) &
broker_pid=$!
pids+=("$broker_pid")

wait_port() { # HOST:PORT
  local i
  for i in $(seq 1 360); do
    (exec 3<>"/dev/tcp/${1%:*}/${1#*:}") 2>/dev/null && return 0
    sleep 0.5
  done
  echo "nothing listens on $1" >&2
  exit 1
}
wait_broker() { # NAMESRV
  local i
  for i in $(seq 1 360); do
    "$bin" --namesrv "$1" cluster list --json 2>/dev/null | grep -q broker-a && return 0
    sleep 0.5
  done
  echo "no broker behind $1" >&2
  exit 1
}
wait_broker "$shoal_ns"
wait_port "$shoal_grpc"
# The proxy creates its system topics on the cluster when it starts: the broker must be up.
wait_broker "$rmq_ns"
(cd "$work/rmq" && exec java -Xms512m -Xmx512m "${jvm[@]}" -cp "$cp" \
  org.apache.rocketmq.proxy.ProxyStartup -pc "$work/rmq/proxy.json" -pm cluster >proxy.out 2>&1) &
proxy_pid=$!
pids+=("$proxy_pid")
wait_port "$rmq_grpc"
grep -q "startup successfully" "$work/rmq/proxy.out" || sleep 5
echo "servers up: shoal dev (pid $shoal_pid); RocketMQ 5.3.3 name server $ns_pid, broker $broker_pid (-Xmx1g), proxy $proxy_pid (-Xmx512m)"
echo "shoal: $("$bin" --version); $(java -version 2>&1 | head -1); $(nproc) CPUs; $(uname -r)"

topic() { # NAMESRV TOPIC
  "$bin" --namesrv "$1" topic create "$2" --queues 8 --message-type NORMAL >/dev/null
}

# Warm-up (not reported): the JVMs compile their hot paths under the first load.
for t in "shoal $shoal_ns $shoal_grpc" "rocketmq $rmq_ns $rmq_grpc"; do
  set -- $t
  topic "$2" Warm
  "$gb" produce "$3" Warm "$warm" "$producers" "$size" >/dev/null
  "$gb" consume "$3" Warm warm "$warm" "$consumers" "$batch" >/dev/null
done

echo
echo "| round | phase | server | msgs/s | server CPU µs/msg | errors | duplicates | load |"
echo "|---|---|---|---:|---:|---:|---:|---:|"
row() { # ROUND PHASE SERVER JSON BEFORE AFTER
  local load
  load=$(cut -d' ' -f1 /proc/loadavg)
  echo "$4" | jq -r --arg r "$1" --arg p "$2" --arg s "$3" --arg load "$load" \
    --argjson cpu_us "$(( ($6 - $5) * 1000000 / tck ))" '
    "| \($r) | \($p) | \($s) | \(.msgs_per_s | round) | \(if .count > 0 then ($cpu_us / .count * 10 | round / 10) else "-" end) | \(.errors) | \(.duplicates // "-") | \($load) |"'
}
for round in $(seq 1 "$rounds"); do
  # The order rotates from round to round, so the machine's drift hits every target alike.
  targets=("shoal $shoal_ns $shoal_grpc $shoal_pid" "rocketmq $rmq_ns $rmq_grpc $ns_pid $broker_pid $proxy_pid")
  modes=(pull pop)
  if [ $((round % 2)) = 0 ]; then
    targets=("${targets[1]}" "${targets[0]}")
    modes=(pop pull)
  fi
  for t in "${targets[@]}"; do
    set -- $t
    server=$1 ns=$2 ep=$3
    shift 3
    tp="G_${round}_$server"
    topic "$ns" "$tp"
    b=$(ticks "$@"); j=$("$gb" produce "$ep" "$tp" "$count" "$producers" "$size"); a=$(ticks "$@")
    row "$round" "gRPC send" "$server" "$j" "$b" "$a"
    b=$(ticks "$@"); j=$("$gb" consume "$ep" "$tp" "g_$tp" "$count" "$consumers" "$batch"); a=$(ticks "$@")
    row "$round" "gRPC receive+ack (POP)" "$server" "$j" "$b" "$a"
  done
  # Shoal's pull and POP paths with Shoal's client on the same backlog (sent again by the same
  # client to further topics).
  for mode in "${modes[@]}"; do
    tp="${mode}_$round"
    topic "$shoal_ns" "$tp"
    "$gb" produce "$shoal_grpc" "$tp" "$count" "$producers" "$size" >/dev/null
    extra=()
    [ "$mode" = pop ] && extra=(--pop)
    b=$(ticks "$shoal_pid")
    j=$("$bin" --namesrv "$shoal_ns" bench consume --topic "$tp" --no-create --consumers "$consumers" \
      --from first --count "$count" "${extra[@]}" --json)
    a=$(ticks "$shoal_pid")
    j=$(echo "$j" | jq -c '{count: .consume.consumed, msgs_per_s: .consume.msgs_per_s, errors: 0, duplicates: .consume.duplicates}')
    row "$round" "remoting $mode (shoal bench consume)" shoal "$j" "$b" "$a"
  done
done
echo
echo "COUNT=$count SIZE=$size PRODUCERS=$producers CONSUMERS=$consumers BATCH=$batch"
