#!/usr/bin/env bash
# RocketMQ 5's Python client (PyPI rocketmq-python-client, gRPC) in a venv under
# target/external, for crates/shoal/tests/compat_grpc_python.rs (tests/compat/grpc_python.py).
set -euo pipefail
version=5.1.2
venv=target/external/venv-rocketmq5
if [ ! -x "$venv/bin/python" ] || [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("rocketmq-python-client"))' 2>/dev/null)" != "$version" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --no-cache-dir "rocketmq-python-client==$version"
fi
"$venv/bin/python" -c 'import rocketmq.v5; print("RocketMQ 5 Python client ready")'
