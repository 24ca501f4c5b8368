#!/usr/bin/env bash
# Apache RocketMQ's official C++ client with ACL session credentials against `shoal namesrv` +
# `shoal broker` with ACL on (tests/compat/cpp_acl.py). Needs the venv made by
# .ci/setup.d/10-cpp-client.sh and the shoal binary (SHOAL_BIN, default target/debug/shoal).
# Exit 0: passed; 1: failed; 77: skipped (the client is not installed).
set -euo pipefail
cd "$(dirname "$0")/../.."
SHOAL_BIN=$(realpath "${SHOAL_BIN:-target/debug/shoal}")
venv=$(realpath -m target/external/venv-cpp)
if ! "$venv/bin/python" -c 'import rocketmq.client' 2>/dev/null; then
  echo "cpp client ACL compatibility: SKIPPED (run .ci/setup.d/10-cpp-client.sh to install the client)"
  exit 77
fi
work=$(mktemp -d)
cleanup() {
  for p in ${broker_pid:-} ${ns_pid:-}; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# Distinct free ports: every socket is bound before any is closed, so no two are the same
# (ports picked one at a time can repeat).
FREE_PORTS=$PWD/tools/free_ports.py  # the script runs from the repository root
ports() { python3 "$FREE_PORTS" "$1"; }
read -r ns_port broker_port < <(ports 2)
cat >"$work/plain_acl.toml" <<ACL
[[accounts]]
accessKey = "cppclient"
secretKey = "cpp-secret-key"
defaultTopicPerm = "DENY"
defaultGroupPerm = "SUB"
topicPerms = ["AclTopic=PUB|SUB"]

[[accounts]]
accessKey = "operator"
secretKey = "operator-secret"
admin = true
ACL
cat >"$work/broker.toml" <<CFG
listen_addr = "127.0.0.1:$broker_port"
data_dir = "$work/data"
acl_enabled = true
acl_file = "$work/plain_acl.toml"
namesrv_access_key = "operator"
namesrv_secret_key = "operator-secret"
CFG
"$SHOAL_BIN" namesrv --listen "127.0.0.1:$ns_port" --acl-file "$work/plain_acl.toml" >"$work/ns.out" 2>"$work/ns.err" &
ns_pid=$!
for _ in $(seq 1 150); do grep -q "listening" "$work/ns.err" "$work/ns.out" 2>/dev/null && break; sleep 0.2; done
"$SHOAL_BIN" broker --config "$work/broker.toml" --namesrv "127.0.0.1:$ns_port" >"$work/broker.out" 2>"$work/broker.err" &
broker_pid=$!
export SHOAL_NAMESRV="127.0.0.1:$ns_port" SHOAL_ACCESS_KEY=operator SHOAL_SECRET_KEY=operator-secret
created=no
for _ in $(seq 1 150); do
  "$SHOAL_BIN" topic create AclTopic --queues 2 >/dev/null 2>&1 && { created=yes; break; }
  sleep 0.2
done
if [ "$created" != yes ]; then
  echo "cpp client ACL: FAILED (topic AclTopic could not be created in 30 s)"
  echo "--- name server log"; tail -20 "$work/ns.err"; echo "--- broker log"; tail -30 "$work/broker.err"; exit 1
fi
# The topic's route is in the name server once the broker has registered it.
for _ in $(seq 1 150); do
  "$SHOAL_BIN" topic route AclTopic >/dev/null 2>&1 && break
  sleep 0.2
done
unset SHOAL_ACCESS_KEY SHOAL_SECRET_KEY
timeout 180 "$venv/bin/python" tests/compat/cpp_acl.py "127.0.0.1:$ns_port" cppclient cpp-secret-key || {
  echo "--- broker log"; tail -30 "$work/broker.err"; exit 1; }
# The refusals came from the broker's ACL (not from somewhere else).
grep "refused by the ACL" "$work/broker.err" | head -3
grep -q "refused by the ACL" "$work/broker.err" || { echo "the broker never refused a request"; exit 1; }
