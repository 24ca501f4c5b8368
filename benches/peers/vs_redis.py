#!/usr/bin/env python3
"""Shoal next to Redis XADD, in one sitting, interleaved, with CPU per message.

Runs `shoal bench produce` against `shoal dev` (one or more Shoal builds, e.g. a "before" and
an "after" binary, for A/B comparisons) and `redis-benchmark XADD` against a local
`redis-server` (AOF, `appendfsync everysec`) at the same client concurrency, round after
round, each round running every case once on every target (the Shoal targets in an order
that rotates from round to round), so a noisy machine hits every target alike. Reports
medians of msgs/s, p50/p99 and the **server CPU per message**
(utime+stime of the server process from /proc/PID/stat, before and after each run) and the
client's CPU per message (getrusage of the finished client process), with ratios.

Also, per Shoal target: consume from a backlog (1, 4, 16 consumers) and end-to-end latency
at a fixed rate.

With `--floor BINARY` (the `resp_floor` example of shoal-net: `cargo build --release -p
shoal-net --example resp_floor`), the same `redis-benchmark XADD` runs also go to a tokio
server that answers every command without doing anything: what a tokio server costs per
request on this machine before any work, the floor under Shoal's figures.

With `--fresh`, every server is restarted on an empty data directory before each of its runs,
so no run pays for the page cache an earlier run filled (on this VM, writing into page cache
the guest has not touched recently costs about twice as much; see docs/benchmarks.md).

Usage (see benches/peers/README.md):

  benches/peers/vs_redis.py --shoal after=target/release/shoal [--shoal before=/tmp/shoal-old]
      [--rounds 3] [--duration 8] [--sizes 128,1024] [--cases 1,16,b32] [--no-redis]
      [--consume] [--e2e] [--floor target/release/examples/resp_floor] [--fresh]
      [--port-base 26000] [--json out.json]

Ports: the servers listen on `--port-base` and up (name server, broker; Redis), so manual runs
stay in a port range of one's own. Data directories live in a temporary directory removed at
the end. Needs redis-server and redis-benchmark (Debian: `apt-get install redis-server`) unless
`--no-redis`.
"""

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """utime + stime of a process, in seconds (fields 14 and 15 of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        raw = f.read()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def wait_port(port, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port}")


def run_child(cmd, timeout=600):
    """Runs a client to completion; returns (stdout, CPU seconds it used)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-2000:]}")
    return p.stdout, cpu


class ShoalServer:
    def __init__(self, label, binary, port, work, flush, client_args=()):
        self.label, self.binary, self.port, self.flush = label, binary, port, flush
        # Extra global flags for this target's `shoal bench` client (e.g. --serialize-type).
        self.client_args = list(client_args)
        self.dir = os.path.join(work, f"shoal-{label}")
        self.proc = None

    def start(self):
        shutil.rmtree(self.dir, ignore_errors=True)
        log = open(self.dir + ".log", "w")
        self.proc = subprocess.Popen(
            [self.binary, "dev", "--namesrv-port", str(self.port), "--broker-port", str(self.port + 1),
             "--data-dir", self.dir, "--flush", self.flush],
            stdout=log, stderr=subprocess.STDOUT)
        wait_port(self.port + 1)
        # The broker registers with the name server shortly after listening.
        for _ in range(100):
            r = subprocess.run([self.binary, "--namesrv", self.ns(), "topic", "create", "VsReady", "--queues", "1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if r.returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError(f"shoal {self.label} did not come up")

    def ns(self):
        return f"127.0.0.1:{self.port}"

    def stop(self):
        if self.proc:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def bench(self, mode, args, timeout=600):
        cmd = [self.binary, "--namesrv", self.ns(), "--json"] + self.client_args + ["bench", mode] + args
        c0 = cpu_seconds(self.proc.pid)
        t0 = time.time()
        out, client_cpu = run_child(cmd, timeout)
        wall = time.time() - t0
        server_cpu = cpu_seconds(self.proc.pid) - c0
        return json.loads(out), server_cpu, client_cpu, wall


class RedisServer:
    def __init__(self, port, work):
        self.port = port
        self.dir = os.path.join(work, "redis")
        self.proc = None

    def start(self):
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
             "--save", "", "--appendonly", "yes", "--appendfsync", "everysec"],
            stdout=open(self.dir + ".log", "w"), stderr=subprocess.STDOUT)
        wait_port(self.port)

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait(20)
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def xadd(self, clients, pipeline, size, n):
        subprocess.run(["redis-cli", "-p", str(self.port), "DEL", "vs"], stdout=subprocess.DEVNULL, check=True)
        payload = "a" * size
        cmd = ["redis-benchmark", "-p", str(self.port), "-c", str(clients), "-P", str(pipeline), "-n", str(n),
               "--csv", "XADD", "vs", "*", "d", payload]
        c0 = cpu_seconds(self.proc.pid)
        out, client_cpu = run_child(cmd)
        server_cpu = cpu_seconds(self.proc.pid) - c0
        # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
        rows = [l for l in out.splitlines() if l.startswith('"XADD')]
        vals = [float(v.strip('"')) for v in rows[-1].split(",")[1:]]
        subprocess.run(["redis-cli", "-p", str(self.port), "DEL", "vs"], stdout=subprocess.DEVNULL, check=True)
        return {"msgs_per_s": vals[0], "p50_ms": vals[3], "p99_ms": vals[5],
                "server_cpu_us_per_msg": server_cpu * 1e6 / n, "client_cpu_us_per_msg": client_cpu * 1e6 / n}


class FloorServer(RedisServer):
    """shoal-net's `resp_floor` example: answers every RESP command, stores nothing."""

    def __init__(self, binary, port, work):
        super().__init__(port, work)
        self.binary = binary
        self.dir = os.path.join(work, "floor")

    def start(self):
        os.makedirs(self.dir, exist_ok=True)
        self.proc = subprocess.Popen([self.binary, f"127.0.0.1:{self.port}"],
                                     stdout=open(self.dir + ".log", "w"), stderr=subprocess.STDOUT)
        wait_port(self.port)


def produce_case(server, case, size, producers, duration, topic):
    inflight, batch = case_params(case)
    args = ["--topic", topic, "--size", str(size), "--producers", str(producers), "--duration", f"{duration}s",
            "--inflight", str(inflight), "--batch", str(batch)]
    report, scpu, ccpu, _ = server.bench("produce", args)
    p = report["produce"]
    acked = max(p["acknowledged"], 1)
    return {"msgs_per_s": p["msgs_per_s"], "p50_ms": p["ack_latency"]["p50_ms"], "p99_ms": p["ack_latency"]["p99_ms"],
            "errors": p["errors"], "server_cpu_us_per_msg": scpu * 1e6 / acked,
            "client_cpu_us_per_msg": ccpu * 1e6 / acked}


def case_params(case):
    if case.startswith("b"):
        return 1, int(case[1:])
    return int(case), 1


def case_name(case, producers):
    inflight, batch = case_params(case)
    if batch > 1:
        return f"{producers} producers, batches of {batch}"
    return f"{producers} x {inflight} in flight"


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def fmt(v, unit=""):
    if v != v:  # NaN
        return "-"
    if unit == "rate":
        return f"{v:,.0f}"
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shoal", action="append", default=[], help="LABEL=BINARY (repeatable)")
    ap.add_argument("--client-args", action="append", default=[], metavar="LABEL=ARGS",
                    help="extra global flags for LABEL's bench client, e.g. "
                         "'bin=--serialize-type rocketmq' (repeatable; the same BINARY may be given "
                         "under two labels to compare client settings)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=8, help="seconds per Shoal produce run")
    ap.add_argument("--sizes", default="128,1024")
    ap.add_argument("--cases", default="1,16,b32", help="in flight per producer, or bN for batches of N")
    ap.add_argument("--producers", type=int, default=8)
    ap.add_argument("--flush", default="async", choices=["async", "sync"])
    ap.add_argument("--no-redis", action="store_true")
    ap.add_argument("--consume", action="store_true", help="also consume a backlog at 1, 4, 16 consumers")
    ap.add_argument("--backlog", type=int, default=500_000)
    ap.add_argument("--e2e", action="store_true", help="also end-to-end latency at --e2e-rate")
    ap.add_argument("--e2e-rate", type=int, default=10_000)
    ap.add_argument("--floor", metavar="BINARY", help="also run the XADD cases against this resp_floor server")
    ap.add_argument("--fresh", action="store_true",
                    help="restart every server on an empty data directory before each of its runs")
    ap.add_argument("--port-base", type=int, default=26000)
    ap.add_argument("--json", help="write every run and the medians here")
    a = ap.parse_args()
    if not a.shoal:
        ap.error("give at least one --shoal LABEL=BINARY")
    targets = []
    for spec in a.shoal:
        label, _, binary = spec.partition("=")
        if not binary or not os.access(binary, os.X_OK):
            ap.error(f"--shoal {spec}: not LABEL=BINARY of an executable")
        targets.append((label, os.path.abspath(binary)))
    client_args = {}
    for spec in a.client_args:
        label, _, args = spec.partition("=")
        if label not in dict(targets):
            ap.error(f"--client-args {spec}: no --shoal target labelled {label}")
        client_args[label] = args.split()
    sizes = [int(s) for s in a.sizes.split(",")]
    cases = a.cases.split(",")
    work = tempfile.mkdtemp(prefix="shoal-vs-redis.")
    servers = {label: ShoalServer(label, b, a.port_base + 10 * i, work, a.flush, client_args.get(label, ()))
               for i, (label, b) in enumerate(targets)}
    redis = None if a.no_redis else RedisServer(a.port_base + 90, work)
    if a.floor and not os.access(a.floor, os.X_OK):
        ap.error(f"--floor {a.floor}: not an executable")
    floor = FloorServer(os.path.abspath(a.floor), a.port_base + 95, work) if a.floor else None
    xadd_targets = [(n, x) for n, x in (("redis", redis), ("floor", floor)) if x]

    def fresh(server):
        if a.fresh:
            server.stop()
            server.start()
    runs = []
    print(f"# {os.cpu_count()} CPU, {os.uname().release}; load at start {load()}; flush {a.flush}", flush=True)
    try:
        for s in servers.values():
            s.start()
        for _, x in xadd_targets:
            x.start()
        for rnd in range(a.rounds):
            for size in sizes:
                for case in cases:
                    inflight, batch = case_params(case)
                    # The Shoal targets' order rotates from round to round, so that a machine
                    # drifting within a round favours none of them.
                    shoal_targets = list(servers.items())
                    shift = rnd % len(shoal_targets)
                    for label, s in shoal_targets[shift:] + shoal_targets[:shift]:
                        fresh(s)
                        r = produce_case(s, case, size, a.producers, a.duration, f"Vs{size}c{case}r{rnd}")
                        r.update(target=label, size=size, case=case, round=rnd, load=load())
                        runs.append(r)
                        print(json.dumps(r), flush=True)
                    for xname, x in xadd_targets:
                        if batch != 1:
                            break
                        n = 300_000 if inflight == 1 else 2_000_000
                        if size > 512:
                            n //= 2
                        fresh(x)
                        r = x.xadd(a.producers, inflight, size, n)
                        r.update(target=xname, size=size, case=case, round=rnd, load=load())
                        runs.append(r)
                        print(json.dumps(r), flush=True)
        extra = []
        if a.consume or a.e2e:
            for rnd in range(a.rounds):
                for label, s in servers.items():
                    fresh(s)
                    if a.consume:
                        topic = f"VsBacklog{rnd}"
                        s.bench("produce", ["--topic", topic, "--size", "128", "--producers", "8", "--batch", "32",
                                            "--count", str(a.backlog)])
                        for consumers in (1, 4, 16):
                            rep, scpu, ccpu, _ = s.bench("consume", ["--topic", topic, "--no-create", "--consumers",
                                                                     str(consumers), "--from", "first", "--count",
                                                                     str(a.backlog), "--idle", "3s"])
                            c = rep["consume"]
                            r = {"target": label, "kind": "consume", "consumers": consumers, "round": rnd,
                                 "msgs_per_s": c["msgs_per_s"], "consumed": c["consumed"],
                                 "server_cpu_us_per_msg": scpu * 1e6 / max(c["consumed"], 1),
                                 "client_cpu_us_per_msg": ccpu * 1e6 / max(c["consumed"], 1), "load": load()}
                            extra.append(r)
                            print(json.dumps(r), flush=True)
                    if a.e2e:
                        rep, scpu, ccpu, _ = s.bench("e2e", ["--topic", f"VsE2e{rnd}", "--size", "128", "--rate",
                                                             str(a.e2e_rate), "--consumers", "4", "--duration",
                                                             f"{a.duration}s"])
                        c = rep["consume"]
                        r = {"target": label, "kind": "e2e", "round": rnd, "rate": a.e2e_rate,
                             "e2e_p50_ms": c["e2e_latency"]["p50_ms"], "e2e_p99_ms": c["e2e_latency"]["p99_ms"],
                             "e2e_p999_ms": c["e2e_latency"]["p999_ms"], "lost": c["lost"],
                             "ack_p99_ms": rep["produce"]["ack_latency"]["p99_ms"], "load": load()}
                        extra.append(r)
                        print(json.dumps(r), flush=True)
    finally:
        for s in servers.values():
            s.stop()
        for _, x in xadd_targets:
            x.stop()
        shutil.rmtree(work, ignore_errors=True)

    labels = [l for l, _ in targets] + [n for n, _ in xadd_targets]
    print()
    print(f"Medians of {a.rounds} interleaved rounds, {a.producers} producers/clients; load at end {load()}.")
    print("server CPU = utime+stime of the server process per acknowledged message; client CPU likewise.")
    print()
    head = "| size | case | " + " | ".join(f"{l} msgs/s | {l} p50/p99 ms | {l} server µs/msg | {l} client µs/msg" for l in labels)
    ratio_cols = []
    if len(targets) > 0 and redis:
        ratio_cols = [f"{l}/redis msgs/s" for l, _ in targets]
    if len(targets) > 1:
        ratio_cols.append(f"{targets[-1][0]}/{targets[0][0]} msgs/s")
    if floor:
        ratio_cols += [f"{l}/floor server µs" for l in labels if l != "floor"]
    print(head + (" | " + " | ".join(ratio_cols) if ratio_cols else "") + " |")
    print("|" + "---|" * (2 + 4 * len(labels) + len(ratio_cols)))
    summary = []
    for size in sizes:
        for case in cases:
            row = {"size": size, "case": case}
            cells = []
            for l in labels:
                rs = [r for r in runs if r["target"] == l and r["size"] == size and r["case"] == case]
                m = {k: median([r[k] for r in rs]) for k in ("msgs_per_s", "p50_ms", "p99_ms", "server_cpu_us_per_msg",
                                                              "client_cpu_us_per_msg")}
                row[l] = m
                cells += [fmt(m["msgs_per_s"], "rate"), f"{fmt(m['p50_ms'])} / {fmt(m['p99_ms'])}",
                          fmt(m["server_cpu_us_per_msg"]), fmt(m["client_cpu_us_per_msg"])]
            ratios = []
            if redis:
                for l, _ in targets:
                    rr = row["redis"]["msgs_per_s"]
                    ratios.append(fmt(row[l]["msgs_per_s"] / rr) + "x" if rr == rr else "-")
            if len(targets) > 1:
                ratios.append(fmt(row[targets[-1][0]]["msgs_per_s"] / row[targets[0][0]]["msgs_per_s"]) + "x")
            if floor:
                fc = row["floor"]["server_cpu_us_per_msg"]
                for l in labels:
                    if l != "floor":
                        ratios.append(fmt(row[l]["server_cpu_us_per_msg"] / fc) + "x" if fc == fc else "-")
            summary.append(row)
            print(f"| {size} B | {case_name(case, a.producers)} | " + " | ".join(cells + ratios) + " |")
    if extra:
        print()
        for l, _ in targets:
            for consumers in (1, 4, 16):
                rs = [r for r in extra if r["target"] == l and r["kind"] == "consume" and r["consumers"] == consumers]
                if rs:
                    print(f"{l}: consume {a.backlog} backlog, {consumers} consumer(s): "
                          f"{fmt(median([r['msgs_per_s'] for r in rs]), 'rate')} msgs/s, server "
                          f"{fmt(median([r['server_cpu_us_per_msg'] for r in rs]))} µs/msg")
            rs = [r for r in extra if r["target"] == l and r["kind"] == "e2e"]
            if rs:
                print(f"{l}: e2e at {a.e2e_rate} msgs/s: p50 {fmt(median([r['e2e_p50_ms'] for r in rs]))} ms, "
                      f"p99 {fmt(median([r['e2e_p99_ms'] for r in rs]))} ms, p99.9 "
                      f"{fmt(median([r['e2e_p999_ms'] for r in rs]))} ms, lost {sum(r['lost'] or 0 for r in rs)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runs": runs, "extra": extra, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
