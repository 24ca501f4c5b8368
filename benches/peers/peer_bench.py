#!/usr/bin/env python3
"""The workload shape of `shoal bench produce` / `shoal bench e2e`, against Redis Streams
(consumer groups) or NATS JetStream (a durable pull consumer shared by the consumers), with
the same message header and the same JSON report keys, so that run.sh can put them side by
side. `compare` prints the reports of one run as a table with ratios.

Bodies carry the same 24-byte header as Shoal's (magic, run id, key, send time in µs), so
end-to-end latency, duplicates and losses are measured the same way.

  peer_bench.py redis --addr 127.0.0.1:6379 produce --size 128 --producers 1 --seconds 10
  peer_bench.py nats  --addr 127.0.0.1:4222 e2e --size 128 --rate 2000 --consumers 2 --seconds 10
  peer_bench.py compare shoal.json redis.json nats.json
"""

import argparse
import asyncio
import json
import os
import random
import struct
import sys
import time

MAGIC = 0x5348_4F4C
HEADER = struct.Struct(">IIQQ")


def now_us():
    return time.time_ns() // 1000


def make_body(size, run, key, sent_us):
    filler = bytes(ord("a") + i % 26 for i in range(size))
    if size < HEADER.size:
        return filler
    return HEADER.pack(MAGIC, run, key, sent_us) + filler[HEADER.size:]


def parse_body(body):
    if len(body) < HEADER.size:
        return None
    magic, run, key, sent = HEADER.unpack_from(body)
    return (run, key, sent) if magic == MAGIC else None


def latency(samples_us):
    """Percentiles in ms, as Shoal's report (nearest rank)."""
    if not samples_us:
        return {"count": 0, "mean_ms": 0, "p50_ms": 0, "p90_ms": 0, "p99_ms": 0,
                "p999_ms": 0, "max_ms": 0}
    s = sorted(samples_us)
    n = len(s)

    def q(p):
        return round(s[min(n - 1, max(0, int(p * n + 0.5) - 1))] / 1000.0, 3)
    return {"count": n, "mean_ms": round(sum(s) / n / 1000.0, 3), "p50_ms": q(0.5),
            "p90_ms": q(0.9), "p99_ms": q(0.99), "p999_ms": q(0.999),
            "max_ms": round(s[-1] / 1000.0, 3)}


class Stats:
    def __init__(self, size):
        self.size = size
        self.sent = self.acked = self.errors = 0
        self.errors_by_kind = {}
        self.ack_us = []
        self.acked_keys = []
        self.first = self.last = None

    def ok(self, key, took_us):
        self.acked += 1
        self.ack_us.append(max(1, took_us))
        self.acked_keys.append(key)
        self.last = time.monotonic()

    def err(self, e):
        self.errors += 1
        kind = type(e).__name__
        self.errors_by_kind[kind] = self.errors_by_kind.get(kind, 0) + 1

    def report(self):
        secs = (self.last - self.first) if self.first and self.last else 0
        rate = self.acked / secs if secs > 0 else 0
        return {"sent": self.sent, "acknowledged": self.acked, "errors": self.errors,
                "errors_by_kind": self.errors_by_kind, "msgs_per_s": round(rate, 1),
                "mb_per_s": round(rate * self.size / 1e6, 3),
                "ack_latency": latency(self.ack_us)}


class Tracker:
    def __init__(self, run):
        self.run = run
        self.seen = {}
        self.consumed = self.bytes = self.duplicates = self.foreign = 0
        self.e2e_us = []
        self.first = self.last = None

    def record(self, body):
        now = now_us()
        t = time.monotonic()
        self.first = self.first or t
        self.last = t
        self.consumed += 1
        self.bytes += len(body)
        h = parse_body(body)
        if h is None or h[0] != self.run:
            self.foreign += 1
            return
        self.e2e_us.append(max(1, now - h[2]))
        c = self.seen.get(h[1], 0) + 1
        self.seen[h[1]] = c
        if c > 1:
            self.duplicates += 1

    def report(self, acked_keys):
        secs = (self.last - self.first) if self.first and self.last else 0
        lost = sum(1 for k in acked_keys if k not in self.seen)
        return {"consumed": self.consumed, "unique": len(self.seen),
                "duplicates": self.duplicates, "foreign": self.foreign, "lost": lost,
                "msgs_per_s": round(self.consumed / secs, 1) if secs > 0 else 0,
                "mb_per_s": round(self.bytes / secs / 1e6, 3) if secs > 0 else 0,
                "e2e_latency": latency(self.e2e_us)}


async def producer_loop(idx, send, args, stats, run, deadline):
    """Closed loop (rate 0: one send at a time) or open loop at rate/producers with up to 256
    sends in flight; latency from when the timer let the send go, a wait for a free in-flight
    slot included (as `shoal bench`)."""
    period = args.producers / args.rate if args.rate > 0 else None
    start = time.monotonic() + (period * idx / args.producers if period else 0)
    slots = asyncio.Semaphore(256 if period else 1)
    tasks = set()
    seq = 0

    async def one(key, body, due):
        try:
            await send(body)
            stats.ok(key, int((time.monotonic() - due) * 1e6))
        except Exception as e:  # counted by kind, the run goes on
            stats.err(e)
        finally:
            slots.release()

    while True:
        if period:
            due = start + seq * period
            if due >= deadline:
                break
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        elif time.monotonic() >= deadline:
            break
        due = time.monotonic()
        await slots.acquire()
        key = (idx << 40) | seq
        seq += 1
        body = make_body(args.size, run, key, now_us())
        stats.sent += 1
        if period:
            t = asyncio.create_task(one(key, body, due))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        else:
            await one(key, body, due)
    if tasks:
        await asyncio.gather(*tasks)


# ---- Redis Streams -------------------------------------------------------------------

async def redis_run(args, run):
    import redis.asyncio as aioredis
    host, port = args.addr.rsplit(":", 1)
    stream, group = f"shoalbench-{run}", f"g-{run}"
    admin = aioredis.Redis(host=host, port=int(port))
    await admin.xgroup_create(stream, group, id="$", mkstream=True)
    stats, tracker = Stats(args.size), Tracker(run)
    stop = asyncio.Event()

    async def consumer(i):
        r = aioredis.Redis(host=host, port=int(port))
        while not stop.is_set():
            resp = await r.xreadgroup(group, f"c{i}", {stream: ">"}, count=32, block=100)
            for _, entries in resp or []:
                ids = []
                for entry_id, fields in entries:
                    tracker.record(fields.get(b"d", b""))
                    ids.append(entry_id)
                if ids:
                    await r.xack(stream, group, *ids)
        await r.aclose()

    consumers = [asyncio.create_task(consumer(i)) for i in range(args.consumers)] \
        if args.mode == "e2e" else []
    conns = [aioredis.Redis(host=host, port=int(port)) for _ in range(args.producers)]
    for c in conns:
        await c.ping()
    stats.first = time.monotonic()
    deadline = stats.first + args.seconds
    await asyncio.gather(*(producer_loop(i, (lambda b, c=c: c.xadd(stream, {"d": b})),
                                         args, stats, run, deadline)
                           for i, c in enumerate(conns)))
    await drain(args, stats, tracker)
    stop.set()
    await asyncio.gather(*consumers)
    for c in conns:
        await c.aclose()
    await admin.delete(stream)
    await admin.aclose()
    return stats, tracker


# ---- NATS JetStream ------------------------------------------------------------------

async def nats_run(args, run):
    import nats
    from nats.errors import TimeoutError as NatsTimeout
    subject, stream, durable = f"bench.{run}", f"BENCH{run}", f"g{run}"
    nc = await nats.connect(f"nats://{args.addr}")
    js = nc.jetstream()
    await js.add_stream(name=stream, subjects=[subject])
    stats, tracker = Stats(args.size), Tracker(run)
    stop = asyncio.Event()
    consumer_conns = []

    async def consumer(i):
        c = await nats.connect(f"nats://{args.addr}")
        consumer_conns.append(c)
        sub = await c.jetstream().pull_subscribe(subject, durable=durable, stream=stream)
        while not stop.is_set():
            try:
                msgs = await sub.fetch(32, timeout=0.1)
            except (NatsTimeout, asyncio.TimeoutError):
                continue
            for m in msgs:
                tracker.record(m.data)
                await m.ack()

    consumers = []
    if args.mode == "e2e":
        consumers = [asyncio.create_task(consumer(i)) for i in range(args.consumers)]
        await asyncio.sleep(0.5)  # the durable consumer exists before the first publish
    conns = [await nats.connect(f"nats://{args.addr}") for _ in range(args.producers)]
    stats.first = time.monotonic()
    deadline = stats.first + args.seconds

    def sender(c):
        j = c.jetstream()
        return lambda b: j.publish(subject, b)
    await asyncio.gather(*(producer_loop(i, sender(c), args, stats, run, deadline)
                           for i, c in enumerate(conns)))
    await drain(args, stats, tracker)
    stop.set()
    await asyncio.gather(*consumers)
    for c in conns + consumer_conns:
        await c.close()
    await js.delete_stream(stream)
    await nc.close()
    return stats, tracker


async def drain(args, stats, tracker):
    if args.mode != "e2e":
        return
    end = time.monotonic() + args.drain
    while time.monotonic() < end and len(tracker.seen) < stats.acked:
        await asyncio.sleep(0.05)


def bench(args):
    run = random.getrandbits(32)
    t0 = time.monotonic()
    fn = redis_run if args.peer == "redis" else nats_run
    stats, tracker = asyncio.run(fn(args, run))
    report = {"mode": args.mode, "system": args.peer, "size": args.size, "batch": 1,
              "producers": args.producers,
              "consumers": args.consumers if args.mode == "e2e" else 0,
              "target_rate": args.rate or None,
              "elapsed_s": round(time.monotonic() - t0, 3),
              "produce": stats.report(),
              "consume": tracker.report(stats.acked_keys) if args.mode == "e2e" else None}
    print(json.dumps(report, indent=2))


# ---- comparison ----------------------------------------------------------------------

ROWS = [
    ("produce msgs/s", "/produce/msgs_per_s", True),
    ("produce MB/s", "/produce/mb_per_s", True),
    ("send ack p50 ms", "/produce/ack_latency/p50_ms", False),
    ("send ack p99 ms", "/produce/ack_latency/p99_ms", False),
    ("send ack p99.9 ms", "/produce/ack_latency/p999_ms", False),
    ("e2e p50 ms", "/consume/e2e_latency/p50_ms", False),
    ("e2e p99 ms", "/consume/e2e_latency/p99_ms", False),
    ("e2e p99.9 ms", "/consume/e2e_latency/p999_ms", False),
    ("consumed msgs/s", "/consume/msgs_per_s", True),
    ("errors", "/produce/errors", False),
    ("lost", "/consume/lost", False),
    ("duplicates", "/consume/duplicates", False),
]


def pointer(doc, path):
    for part in path.strip("/").split("/"):
        if not isinstance(doc, dict) or doc.get(part) is None:
            return None
        doc = doc[part]
    return doc


def compare(paths):
    """First report is Shoal's; the ratio columns are Shoal / peer."""
    docs = []
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        d.setdefault("system", "shoal")
        docs.append(d)
    base = docs[0]
    names = [d["system"] for d in docs]
    head = f"{'':<20}" + "".join(f"{n:>12}" for n in names) + \
        "".join(f"{names[0] + '/' + n:>14}" for n in names[1:])
    print(f"== {base['mode']}: {base['size']} B, {base['producers']} producer(s), "
          f"{base.get('consumers', 0)} consumer(s), rate "
          f"{base.get('target_rate') or 'max'} ==")
    print(head)
    for label, path, higher_better in ROWS:
        vals = [pointer(d, path) for d in docs]
        if all(v is None for v in vals):
            continue
        cells = "".join(f"{'-' if v is None else v:>12}" for v in vals)
        ratios = ""
        for v in vals[1:]:
            b = vals[0]
            if isinstance(b, (int, float)) and isinstance(v, (int, float)) and v:
                ratios += f"{b / v:>13.2f}x"
            else:
                ratios += f"{'-':>14}"
        hint = "  (higher is better)" if higher_better else "  (lower is better)"
        print(f"{label:<20}{cells}{ratios}{hint}")
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="peer", required=True)
    for peer, port in (("redis", 6379), ("nats", 4222)):
        p = sub.add_parser(peer)
        p.add_argument("--addr", default=f"127.0.0.1:{port}")
        p.add_argument("mode", choices=["produce", "e2e"])
        p.add_argument("--size", type=int, default=128)
        p.add_argument("--producers", type=int, default=1)
        p.add_argument("--consumers", type=int, default=2)
        p.add_argument("--rate", type=float, default=0.0)
        p.add_argument("--seconds", type=float, default=10.0)
        p.add_argument("--drain", type=float, default=10.0)
    c = sub.add_parser("compare")
    c.add_argument("reports", nargs="+")
    args = ap.parse_args()
    if args.peer == "compare":
        compare(args.reports)
        return
    if args.size < 1 or args.producers < 1 or args.consumers < 1 or args.rate < 0 \
            or args.seconds <= 0:
        sys.exit("--size, --producers, --consumers must be >= 1, --rate >= 0, --seconds > 0")
    bench(args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
