#!/usr/bin/env bash
# Fetches Apache Kafka's broker (org.apache.kafka:kafka_2.13, KAFKA_VERSION, default 4.1.1, the
# version of the Java client in the compat tests) and its dependencies from Maven Central into
# target/external/kafka-broker/libs, for `KAFKA_LIBS=target/external/kafka-broker/libs
# benches/kafka/run.sh`. Idempotent; uses the Maven repository of .ci/setup.d (target/external/m2).
set -euo pipefail
cd "$(dirname "$0")/../.."
v=${KAFKA_VERSION:-4.1.1}
out=target/external/kafka-broker
mkdir -p "$out"
[ -f "$out/libs/kafka_2.13-$v.jar" ] && { echo "$out/libs has Kafka $v"; exit 0; }
cat >"$out/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local</groupId><artifactId>kafka-broker-peer</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$v</version></dependency>
  </dependencies>
</project>
POM
mvn -q -B -Dstyle.color=never -f "$out/pom.xml" -Dmaven.repo.local="$PWD/target/external/m2/repository" \
  dependency:copy-dependencies -DoutputDirectory="$PWD/$out/libs"
echo "Kafka $v broker jars in $out/libs"
