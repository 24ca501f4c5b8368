#!/usr/bin/env python3
"""Interleaved A/B runs of `shoal bench produce` against a fresh `shoal dev` per run.

Each round runs every build once, starting with a different build each round (the order
rotates); each run starts `shoal dev` on a new data directory, creates the topic, runs
`shoal bench produce` and stops the server. It reports msgs/s, the broker's
CPU per acknowledged message (utime+stime from /proc/PID/stat), the client's (getrusage of
the finished bench process) and the send p99, per run and as medians, and for each build after
the first the median of its per-round ratios to the first build. A fresh data directory
per run keeps the page cache the broker writes into warm (see docs/benchmarks.md, "What limits
the figures on this machine").

Usage:
  benches/peers/ab.py [--inflight 16] [--batch 1] [--rounds 3] [--duration 5] \\
      [--port 27200] BINARY[,EXTRA CLIENT FLAGS] BINARY2 ...

A build given as "path,--serialize-type rocketmq" runs its bench client with those global
flags (the same binary may be listed twice to compare client settings). Leading
"NAME=VALUE:" parts set environment variables of that build's server only, e.g.
"TOKIO_WORKER_THREADS=1:target/release/shoal" for a broker with one tokio worker; parts
written "@NAME=VALUE:" set them for the bench client only, e.g.
"@TOKIO_WORKER_THREADS=1:target/release/shoal". Leading "+ARG:" parts are added to that
build's `shoal dev` command line, e.g. "+--config=mmap.toml:target/release/shoal" for a broker
with the keys of mmap.toml.
"""
import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import tempfile
import time


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def parse_build(build):
    """'[[@]NAME=VALUE:|+ARG:]...BINARY[,EXTRA CLIENT FLAGS]' -> (server env, client env,
    binary, client flags, server flags)."""
    env, client_env, dev_args = {}, {}, []
    while True:
        if (m := re.match(r"(@?)([A-Z_][A-Z0-9_]*)=([^:]*):", build)):
            (client_env if m.group(1) else env)[m.group(2)] = m.group(3)
        elif (m := re.match(r"\+([^:]+):", build)):
            dev_args.append(m.group(1))
        else:
            break
        build = build[m.end():]
    binary, _, extra = build.partition(",")
    return env, client_env, binary, extra.split(), dev_args


def one_run(binary, extra, a, data_dir, env=None, client_env=None, dev_args=()):
    ns = f"127.0.0.1:{a.port}"
    shutil.rmtree(data_dir, ignore_errors=True)
    dev = subprocess.Popen([binary, "dev", "--namesrv-port", str(a.port), "--broker-port", str(a.port + 1),
                            "--data-dir", data_dir, "--flush", "async", *dev_args],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env={**os.environ, **(env or {})})
    try:
        for _ in range(100):
            r = subprocess.run([binary, "--namesrv", ns, "topic", "create", "AbTopic", "--queues", "8"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if r.returncode == 0:
                break
            time.sleep(0.2)
        c0 = cpu_seconds(dev.pid)
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run([binary, "--namesrv", ns, "--json"] + extra +
                             ["bench", "produce", "--topic", "AbTopic", "--size", str(a.size), "--producers",
                              str(a.producers), "--duration", f"{a.duration}s", "--inflight", str(a.inflight),
                              "--batch", str(a.batch)], capture_output=True, text=True, check=True,
                             env={**os.environ, **(client_env or {})}).stdout
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        c1 = cpu_seconds(dev.pid)
    finally:
        dev.terminate()
        dev.wait()
    rep = json.loads(out)["produce"]
    n = max(rep["acknowledged"], 1)
    client = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
    return rep["msgs_per_s"], (c1 - c0) * 1e6 / n, client * 1e6 / n, rep["ack_latency"]["p99_ms"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("builds", nargs="+", help="[[@]NAME=VALUE:|+ARG:]...BINARY[,EXTRA CLIENT FLAGS]")
    ap.add_argument("--inflight", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--producers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--port", type=int, default=27200, help="name server port (the broker uses the next)")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="shoal-ab.")
    results = {b: [] for b in a.builds}
    try:
        for rnd in range(a.rounds):
            # The order rotates from round to round: a machine that drifts within a round
            # (the first run of a round came out ahead in every round of one sitting) then
            # favours no build.
            shift = rnd % len(a.builds)
            for build in a.builds[shift:] + a.builds[:shift]:
                env, client_env, binary, extra, dev_args = parse_build(build)
                r = one_run(binary, extra, a, os.path.join(work, "data"), env, client_env, dev_args)
                results[build].append(r)
                print(f"{build} r{rnd}: {r[0]:,.0f} msgs/s, broker {r[1]:.2f} µs/msg, client {r[2]:.2f} µs/msg, "
                      f"p99 {r[3]} ms", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nMedians of {a.rounds} interleaved rounds ({a.producers} producers x {a.inflight} in flight, "
          f"batch {a.batch}, {a.size} B):")
    print("| build | msgs/s | broker µs/msg | client µs/msg | p99 ms |\n|---|---:|---:|---:|---:|")
    for build, runs in results.items():
        med = [statistics.median(r[i] for r in runs) for i in range(4)]
        print(f"| {build} | {med[0]:,.0f} | {med[1]:.2f} | {med[2]:.2f} | {med[3]:.2f} |")
    # Ratios of runs of the same round (neighbours in time) are steadier on a noisy machine than
    # ratios of medians: each build against the first, the median of its per-round ratios.
    first = a.builds[0]
    if len(a.builds) > 1:
        print(f"\nPer-round ratios to {first}, medians (and the range over rounds):")
        print("| build | msgs/s | broker µs/msg | client µs/msg |\n|---|---|---|---|")
        for build in a.builds[1:]:
            cells = []
            for i in range(3):
                ratios = sorted(r[i] / b[i] for r, b in zip(results[build], results[first]) if b[i])
                cells.append(f"{statistics.median(ratios):.3f}x ({ratios[0]:.3f}-{ratios[-1]:.3f})"
                             if ratios else "-")
            print(f"| {build} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
