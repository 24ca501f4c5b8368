#!/usr/bin/env bash
# RocketMQ 5's Java clients from Maven Central into target/external/m2 (the local Maven
# repository 20-java.sh fills), so that tests/compat/grpc-java runs offline: rocketmq-client-java
# 5.0.8 (gRPC) and rocketmq-client / rocketmq-tools 5.3.3 (remoting POP and SQL92), with the
# test plugins.
set -euo pipefail
if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
  echo "java/mvn not found (20-java.sh installs them): the RocketMQ 5 Java client tests will skip"
  exit 0
fi
repo=$PWD/target/external/m2
marker=$repo/.shoal-grpc-java-prefetched
pom=tests/compat/grpc-java/pom.xml
if [ -f "$marker" ] && [ "$(cat "$marker")" = "$(sha256sum "$pom" | cut -d' ' -f1)" ]; then
  echo "RocketMQ 5 Java client dependencies already prefetched"
  exit 0
fi
mkdir -p "$repo"
# test-compile fetches the clients and JUnit; loading Surefire (a run that selects no test)
# fetches its JUnit Platform provider.
mvn -B -q -ntp -Dmaven.repo.local="$repo" -f "$pom" test -Dtest=NONE -Dsurefire.failIfNoSpecifiedTests=false
sha256sum "$pom" | cut -d' ' -f1 > "$marker"
echo "RocketMQ 5 Java client dependencies ready in $repo"
