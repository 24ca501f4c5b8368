#!/usr/bin/env bash
# Apache RocketMQ's Go client (github.com/apache/rocketmq-client-go/v2 from the Go module
# proxy, pinned by tests/compat/go/go.mod and go.sum) built with tests/compat/go into
# target/external/rocketmq-go-check, for crates/shoal/tests/compat_go.rs. Modules are kept in
# target/external/gopath. Rebuilt when the program (tests/compat/go/*.go) or its module files
# changed.
set -euo pipefail
root=$(pwd)
if ! command -v go >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends golang-go >/dev/null
    apt-get clean
  else
    echo "go not found and cannot be installed here: the Go client test will skip"
    exit 0
  fi
fi
out=$root/target/external/rocketmq-go-check
stamp=$root/target/external/rocketmq-go-check.sha256
sum=$(cat tests/compat/go/go.mod tests/compat/go/go.sum tests/compat/go/*.go | sha256sum | cut -d' ' -f1)
if [ -x "$out" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ]; then
  echo "rocketmq go client already built"
  exit 0
fi
mkdir -p "$root/target/external"
(cd tests/compat/go && GOPATH="$root/target/external/gopath" GOFLAGS=-mod=mod go build -o "$out" .)
echo "$sum" > "$stamp"
echo "rocketmq go client ready: $(go version)"
