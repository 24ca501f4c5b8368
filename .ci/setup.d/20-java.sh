#!/usr/bin/env bash
# Apache RocketMQ's Java side from Maven Central into target/external/m2 (a local Maven
# repository), so that the Java compatibility tests run offline: rocketmq-client/-tools 4.9.8
# and 5.3.3 (tests/compat/java profiles client4, client5) with the test plugins, and
# rocketmq-namesrv/-broker 5.3.3 (profile broker5) with their class path written to
# target/external/rocketmq-broker5.classpath (it holds, through their dependencies, the
# controller and mqadmin that benches/peers/replicated.sh runs too).
set -euo pipefail
if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -q && apt-get install -y -q openjdk-17-jdk-headless maven
    apt-get clean
  else
    echo "java/mvn not found and cannot be installed here: the Java compatibility tests will skip"
    exit 0
  fi
fi
repo=$PWD/target/external/m2
marker=$repo/.shoal-java-prefetched
pom=tests/compat/java/pom.xml
# Redo when the pom changed since the last prefetch.
if [ -f "$marker" ] && [ "$(cat "$marker")" = "$(sha256sum "$pom" | cut -d' ' -f1)" ]; then
  echo "Java dependencies already prefetched"
  exit 0
fi
mkdir -p "$repo"
mvn=(mvn -B -q -ntp -Dmaven.repo.local="$repo" -f "$pom")
for profile in client4 client5; do
  # test-compile fetches the clients and the JUnit launcher; loading Surefire (a test run that
  # selects nothing) fetches its JUnit Platform provider, a plugin dependency in the pom. Both
  # are named in the pom because Surefire would otherwise resolve them only when a test runs,
  # and the tests run offline (mvn -o).
  "${mvn[@]}" -P "$profile" test -Dtest=NONE -Dsurefire.failIfNoSpecifiedTests=false
done
"${mvn[@]}" -P broker5 dependency:build-classpath \
  -Dmdep.outputFile="$PWD/target/external/rocketmq-broker5.classpath"
sha256sum "$pom" | cut -d' ' -f1 > "$marker"
echo "Java dependencies ready in $repo ($(du -sh "$repo" | cut -f1))"
