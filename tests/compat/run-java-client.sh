#!/usr/bin/env bash
# Runs the Java compatibility suite (tests/compat/java, JUnit through Maven Surefire) for one
# client profile (client4: rocketmq-client 4.9.8, client5: 5.3.3) against Shoal processes the
# tests start themselves (SHOAL_BIN, default target/debug/shoal). Offline: needs the local
# repository made by .ci/setup.d/20-java.sh (target/external/m2).
# Exit 0: passed; 1: failed; 77: skipped (java, mvn or the prefetched repository missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
profile=${1:?usage: run-java-client.sh client4|client5 [-Dtest=...]}
shift
SHOAL_BIN=$(realpath "${SHOAL_BIN:-target/debug/shoal}")
export SHOAL_BIN
repo=$PWD/target/external/m2
if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
  echo "Java client compatibility ($profile): SKIPPED (java or mvn not installed)"
  exit 77
fi
if [ ! -f "$repo/.shoal-java-prefetched" ]; then
  echo "Java client compatibility ($profile): SKIPPED (run .ci/setup.d/20-java.sh to fetch the Maven dependencies)"
  exit 77
fi
log=target/external/java-compat/$profile.log
mkdir -p "$(dirname "$log")"
started=$(mktemp)
set +e
mvn -B -o -ntp -Dmaven.repo.local="$repo" -f tests/compat/java/pom.xml -P "$profile" test "$@" >"$log" 2>&1
status=$?
set -e
grep -E 'Tests run:|FAIL|BUILD|mixed group|exclusive and complete' "$log" || true
# FailoverTest's figures (test output goes to Surefire's report files), from this run only.
find target/external/java-compat/"$profile"/surefire-reports -name '*-output.txt' -newer "$started" \
  -exec grep -h '^failover' {} + 2>/dev/null || true
rm -f "$started"
if [ "$status" != 0 ]; then
  echo "--- $log (tail)"
  tail -60 "$log"
  exit 1
fi
