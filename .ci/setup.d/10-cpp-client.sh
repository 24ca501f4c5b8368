#!/usr/bin/env bash
# Apache RocketMQ's C++ client (PyPI `rocketmq` 0.4.4 bundles librocketmq) in a venv.
set -euo pipefail
venv=target/external/venv-cpp
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import rocketmq.client' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --no-cache-dir rocketmq==0.4.4
fi
"$venv/bin/python" -c 'import rocketmq.client; print("C++ client ready")'
