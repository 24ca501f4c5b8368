#!/usr/bin/env bash
# Kafka clients for tests/compat/kafka: confluent-kafka (librdkafka) and kafka-python from PyPI
# in a venv, the Java kafka-clients from Maven Central (when Maven and a JDK are present), and
# franz-go from the Go module proxy (when Go is present). Everything under target/external/.
set -euo pipefail
root=$(pwd)
venv=target/external/venv-kafka
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import confluent_kafka, kafka' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --no-cache-dir confluent-kafka==2.16.1 kafka-python==3.0.12
fi
"$venv/bin/python" -c 'import confluent_kafka, kafka; print("kafka python clients ready:", confluent_kafka.libversion()[0], kafka.__version__)'

if [ -f tests/compat/kafka/java/pom.xml ] && command -v mvn >/dev/null && command -v javac >/dev/null; then
  (cd tests/compat/kafka/java && mvn -q -B -Dmaven.repo.local="$root/target/external/m2" \
      -DoutputDirectory="$root/target/external/kafka-java-lib" dependency:copy-dependencies >/dev/null)
  echo "kafka java client ready"
else
  echo "kafka java client: maven or javac missing, skipped"
fi

if [ -f tests/compat/kafka/go/go.mod ] && command -v go >/dev/null; then
  (cd tests/compat/kafka/go && GOPATH="$root/target/external/gopath" GOFLAGS=-mod=mod \
      go build -o "$root/target/external/kafka-go-check" . )
  echo "kafka go client ready"
else
  echo "kafka go client: go missing, skipped"
fi
