#!/usr/bin/env python3
"""Broker CPU per failed message: consumers that fail every message (CONSUMER_SEND_MSG_BACK).

For each build, interleaved over rounds (order rotated per round), on a fresh `shoal dev`:
produce COUNT messages (batches of 32), then run `shoal consume --from first --fail '*'
--max-reconsume-times 0` until the group's dead-letter queue holds them all: every message is
consumed, failed and sent back, and goes straight to the dead-letter queue. Reports the wall
time and the broker's CPU (utime+stime from /proc/PID/stat) per message over it (the broker
also answers the script's polls of the queue's size, a few per second), per run and as
medians.

  benches/peers/sendback.py [--count 20000] [--rounds 3] [--port 27400] BINARY BINARY2 ...
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def dlq_size(binary, ns):
    r = subprocess.run([binary, "--namesrv", ns, "--json", "topic", "status", "%DLQ%sb"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return 0
    return sum(q["maxOffset"] - q["minOffset"] for q in json.loads(r.stdout))


def one_run(binary, a, data_dir):
    ns = f"127.0.0.1:{a.port}"
    shutil.rmtree(data_dir, ignore_errors=True)
    dev = subprocess.Popen([binary, "dev", "--namesrv-port", str(a.port), "--broker-port", str(a.port + 1),
                            "--http-port", "0", "--kafka-port", "0", "--data-dir", data_dir],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            r = subprocess.run([binary, "--namesrv", ns, "topic", "create", "SendBack", "--queues", "4"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if r.returncode == 0:
                break
            time.sleep(0.2)
        subprocess.run([binary, "--namesrv", ns, "bench", "produce", "--topic", "SendBack", "--no-create",
                        "--count", str(a.count), "--batch", "32", "--producers", "4"],
                       stdout=subprocess.DEVNULL, check=True)
        c0 = cpu_seconds(dev.pid)
        t0 = time.monotonic()
        # `--count` counts acknowledged messages, and a failed one is not: the run ends when
        # the dead-letter queue holds every message.
        consumer = subprocess.Popen([binary, "--namesrv", ns, "consume", "SendBack", "--group", "sb",
                                     "--from", "first", "--fail", "*", "--max-reconsume-times", "0"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while dlq_size(binary, ns) < a.count:
                if consumer.poll() is not None:
                    raise RuntimeError("the consumer exited early")
                time.sleep(0.05)
            wall = time.monotonic() - t0
            c1 = cpu_seconds(dev.pid)
        finally:
            consumer.terminate()
            consumer.wait()
    finally:
        dev.terminate()
        dev.wait()
    return wall, (c1 - c0) * 1e6 / a.count


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("builds", nargs="+")
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--port", type=int, default=27400, help="name server port (the broker uses the next)")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="shoal-sendback.")
    results = {b: [] for b in a.builds}
    try:
        for rnd in range(a.rounds):
            shift = rnd % len(a.builds)
            for build in a.builds[shift:] + a.builds[:shift]:
                r = one_run(build, a, os.path.join(work, "data"))
                results[build].append(r)
                print(f"{build} r{rnd}: consume {r[0]:.2f} s, broker {r[1]:.2f} µs/msg", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nMedians of {a.rounds} rounds ({a.count} messages, each failed once, to the DLQ):")
    print("| build | consume s | msgs/s | broker µs/msg |\n|---|---:|---:|---:|")
    for build, runs in results.items():
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        print(f"| {build} | {wall:.2f} | {a.count / wall:,.0f} | {cpu:.2f} |")


if __name__ == "__main__":
    main()
