#!/usr/bin/env bash
# Runs the RocketMQ 5 Java clients' compatibility suite (tests/compat/grpc-java: the gRPC
# client rocketmq-client-java 5.x, and the 5.3 remoting client's POP and SQL92 consumers; JUnit
# through Maven Surefire, one JVM) against `shoal dev` processes the tests start themselves
# (SHOAL_BIN, default target/debug/shoal). Offline: needs the local repository made by
# .ci/setup.d/21-java-grpc.sh (target/external/m2).
# Exit 0: passed; 1: failed; 77: skipped (java, mvn or the prefetched dependencies missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
SHOAL_BIN=$(realpath "${SHOAL_BIN:-target/debug/shoal}")
export SHOAL_BIN
repo=$PWD/target/external/m2
if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
  echo "RocketMQ 5 Java clients: SKIPPED (java or mvn not installed)"
  exit 77
fi
if [ ! -f "$repo/.shoal-grpc-java-prefetched" ]; then
  echo "RocketMQ 5 Java clients: SKIPPED (run .ci/setup.d/21-java-grpc.sh to fetch the Maven dependencies)"
  exit 77
fi
log=target/external/grpc-java-compat/test.log
mkdir -p "$(dirname "$log")"
set +e
mvn -B -o -ntp -Dmaven.repo.local="$repo" -f tests/compat/grpc-java/pom.xml test "$@" >"$log" 2>&1
status=$?
set -e
grep -E 'Tests run:|FAIL|BUILD' "$log" || true
if [ "$status" != 0 ]; then
  echo "--- $log (tail)"
  tail -60 "$log"
  for f in target/external/grpc-java-compat/surefire-reports/*-output.txt; do
    [ -e "$f" ] && { echo "--- $f (tail)"; tail -40 "$f"; }
  done
  exit 1
fi
