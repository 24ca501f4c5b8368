"""Kafka-protocol throughput and rebalance on Shoal (see benches/kafka/run.sh).

kafka_bench.py BOOTSTRAP PIDS produce|fetch|rebalance|sync|e2e|groups [options as env]
Prints one JSON line per run: throughput, and the servers' CPU per message (utime+stime of
the comma-separated PIDS, the broker's or a cluster's server processes, from /proc/PID/stat
over the run). REPLICATION_FACTOR (1) is the replication factor of the topics it creates.
`groups` (benches/kafka/groups.sh) is in kafka_groups.py.
"""
import json
import os
import sys
import threading
import time
import uuid

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

BS, WHAT = sys.argv[1], sys.argv[3]
PIDS = [int(p) for p in sys.argv[2].split(",")]
RF = int(os.environ.get("REPLICATION_FACTOR", "1"))
SIZE = int(os.environ.get("SIZE", "128"))
COUNT = int(os.environ.get("COUNT", "200000"))
PARTS = int(os.environ.get("PARTITIONS", "8"))
COMP = os.environ.get("COMPRESSION", "none")
TOPIC = os.environ.get("TOPIC", "KBench")
TICK = os.sysconf("SC_CLK_TCK")
# The producer's linger.ms (librdkafka's default is 5): 0 sends as soon as the previous
# request of the connection is answered, so requests carry fewer records.
LINGER_MS = int(os.environ.get("LINGER_MS", "5"))


def cpu_s():
    total = 0
    for pid in PIDS:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / TICK


def create(topic, parts):
    a = AdminClient({"bootstrap.servers": BS})
    for _, f in a.create_topics([NewTopic(topic, num_partitions=parts, replication_factor=RF)]).items():
        try:
            f.result(15)
        except Exception as e:  # exists from an earlier run
            if "already exists" not in str(e):
                raise


def report(name, n, secs, cpu, extra=None):
    out = {"bench": name, "broker": os.environ.get("BROKER", "shoal"), "messages": n, "size": SIZE, "compression": COMP, "partitions": PARTS,
           "seconds": round(secs, 3), "msgs_per_s": round(n / secs), "mib_per_s": round(n * SIZE / secs / 2**20, 2),
           "broker_cpu_us_per_msg": round(cpu / n * 1e6, 2)}
    out.update(extra or {})
    print(json.dumps(out), flush=True)


def produce():
    create(TOPIC, PARTS)
    p = Producer({"bootstrap.servers": BS, "compression.type": COMP, "linger.ms": LINGER_MS, "acks": "all",
                  "enable.idempotence": True, "batch.size": 262144, "queue.buffering.max.messages": 500000})
    body = os.urandom(SIZE // 2).hex().encode()[:SIZE]
    c0, t0 = cpu_s(), time.time()
    for i in range(COUNT):
        while True:
            try:
                p.produce(TOPIC, value=body, key=b"k%d" % (i % 1000))
                break
            except BufferError:
                p.poll(0.01)
        if i % 1000 == 0:
            p.poll(0)
    p.flush(120)
    report("kafka-produce", COUNT, time.time() - t0, cpu_s() - c0)


def fetch():
    c = Consumer({"bootstrap.servers": BS, "group.id": "bench-" + uuid.uuid4().hex[:8], "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 4194304})
    c.subscribe([TOPIC])
    n, c0, t0, started = 0, None, None, None
    deadline = time.time() + 300
    while n < COUNT and time.time() < deadline:
        msgs = c.consume(10000, 1.0)
        for m in msgs:
            if m.error():
                continue
            if started is None:
                started, c0, t0 = True, cpu_s(), time.time()
            n += 1
    secs, cpu = time.time() - t0, cpu_s() - c0
    c.close()
    report("kafka-fetch", n, secs, cpu)


def rebalance():
    """Members join and leave a group while a producer writes; convergence = the time from a
    change until every partition has exactly one owner again; duplicates = records delivered
    more than once (at-least-once across hand-overs)."""
    strategy = os.environ.get("STRATEGY", "cooperative-sticky")
    topic = f"KRebal-{uuid.uuid4().hex[:6]}"
    create(topic, PARTS)
    gid = "rebal-" + uuid.uuid4().hex[:6]
    stop = threading.Event()
    produced = [0]

    def producer():
        p = Producer({"bootstrap.servers": BS, "linger.ms": 2})
        i = 0
        while not stop.is_set():
            p.produce(topic, value=b"%d" % i, partition=i % PARTS)
            i += 1
            if i % 100 == 0:
                p.poll(0)
                time.sleep(0.01)
        p.flush(30)
        produced[0] = i

    class M:
        def __init__(self):
            self.owned, self.seen, self.stop = set(), [], False
            self.c = Consumer({"bootstrap.servers": BS, "group.id": gid, "auto.offset.reset": "earliest",
                               "partition.assignment.strategy": strategy, "session.timeout.ms": 10000,
                               "heartbeat.interval.ms": 500, "auto.commit.interval.ms": 500})
            coop = strategy == "cooperative-sticky"

            def on_assign(c, ps):
                s = {p.partition for p in ps}
                if coop:
                    c.incremental_assign(ps)
                    self.owned |= s
                else:
                    c.assign(ps)
                    self.owned = s

            def on_revoke(c, ps):
                s = {p.partition for p in ps}
                if coop:
                    c.incremental_unassign(ps)
                    self.owned -= s
                else:
                    self.owned = set()
            self.c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
            self.t = threading.Thread(target=self.run, daemon=True)
            self.t.start()

        def run(self):
            while not self.stop:
                m = self.c.poll(0.1)
                if m is not None and not m.error():
                    self.seen.append((m.partition(), m.offset()))

        def close(self):
            self.stop = True
            self.t.join()
            self.c.close()

    def converge(ms):
        t0 = time.time()
        while time.time() - t0 < 60:
            owned = [m.owned for m in ms]
            # Every partition owned once and every member owning some (PARTITIONS >= members):
            # right after a join the old owners still cover everything, so that alone is not it.
            if sum(len(o) for o in owned) == PARTS and set().union(*owned) == set(range(PARTS)) \
                    and all(owned):
                return time.time() - t0
            time.sleep(0.02)
        return None

    pt = threading.Thread(target=producer, daemon=True)
    pt.start()
    c0 = cpu_s()
    members, phases = [M()], []
    phases.append(("1 member starts", converge(members)))
    for k in range(int(os.environ.get("JOINS", "3"))):
        members.append(M())
        phases.append((f"join -> {len(members)}", converge(members)))
        time.sleep(1)
    gone = []
    while len(members) > 1:
        m = members.pop()
        m.close()
        gone.append(m)
        phases.append((f"leave -> {len(members)}", converge(members)))
        time.sleep(1)
    stop.set()
    pt.join()
    t0 = time.time()
    while time.time() - t0 < 20:
        seen = set(x for m in members + gone for x in m.seen)
        if len(seen) >= produced[0]:
            break
        time.sleep(0.2)
    total = sum(len(m.seen) for m in members + gone)
    for m in members:
        m.close()
    print(json.dumps({"bench": "kafka-rebalance", "broker": os.environ.get("BROKER", "shoal"), "strategy": strategy, "partitions": PARTS,
                      "produced": produced[0], "consumed_unique": len(seen), "duplicates": total - len(seen),
                      "lost": produced[0] - len(seen),
                      "convergence_s": {k: (round(v, 3) if v is not None else None) for k, v in phases},
                      "broker_cpu_s": round(cpu_s() - c0, 2)}), flush=True)


def ctx_switches():
    """Context switches (voluntary and not) of every thread of the server processes."""
    n = 0
    for pid in PIDS:
        for t in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{t}/status") as f:
                    n += sum(int(l.split()[1]) for l in f if "ctxt_switches" in l)
            except FileNotFoundError:  # a thread that ended meanwhile
                pass
    return n


def wait_for_partitions(client, topic):
    for _ in range(100):
        md = client.list_topics(topic, timeout=5).topics.get(topic)
        if md is not None and md.error is None and len(md.partitions) == PARTS:
            return
        time.sleep(0.1)
    raise RuntimeError(f"{topic}: {PARTS} partitions not in the metadata")


def sync():
    """One record per request: idempotent, acks=all, linger.ms=0, produce then flush per record
    (COUNT records over the partitions). Reports the broker's CPU and context switches per
    request and the produce latency."""
    create(TOPIC, PARTS)
    p = Producer({"bootstrap.servers": BS, "linger.ms": 0, "acks": "all", "enable.idempotence": True})
    wait_for_partitions(p, TOPIC)
    body = b"x" * SIZE
    for i in range(200):  # warm-up: connections, producer id, every partition's leader
        p.produce(TOPIC, value=body, partition=i % PARTS)
        p.flush(10)
    failed = [0]

    def done(err, _msg):
        if err:
            failed[0] += 1

    lat = []
    c0, s0, t0 = cpu_s(), ctx_switches(), time.time()
    for i in range(COUNT):
        s = time.perf_counter()
        p.produce(TOPIC, value=body, partition=i % PARTS, on_delivery=done)
        p.flush(10)
        lat.append(time.perf_counter() - s)
    secs, cpu, switches = time.time() - t0, cpu_s() - c0, ctx_switches() - s0
    lat.sort()
    report("kafka-sync-produce", COUNT, secs, cpu, {
        "failed": failed[0], "ctx_switches_per_msg": round(switches / COUNT, 2),
        "p50_ms": round(lat[len(lat) // 2] * 1e3, 3), "p99_ms": round(lat[int(len(lat) * 0.99)] * 1e3, 3)})


def e2e():
    """End to end at RATE records/s: a producer (linger.ms=0, acks=all) and a group consumer
    (fetch.wait.max.ms=500) in this process; latency from the timestamp in each record's value
    to its delivery, and the broker's CPU and context switches per record."""
    rate = int(os.environ.get("RATE", "2000"))
    create(TOPIC, PARTS)
    c = Consumer({"bootstrap.servers": BS, "group.id": "e2e-" + uuid.uuid4().hex[:8],
                  "auto.offset.reset": "latest", "fetch.wait.max.ms": 500})
    c.subscribe([TOPIC])
    while not c.assignment():
        c.poll(0.1)
    time.sleep(1)
    p = Producer({"bootstrap.servers": BS, "linger.ms": 0, "acks": "all"})
    wait_for_partitions(p, TOPIC)
    lat = []
    finished = threading.Event()

    def consume():
        while len(lat) < COUNT:
            m = c.poll(1.0)
            if m is not None and not m.error():
                lat.append(time.time() - float(m.value()))
        finished.set()

    th = threading.Thread(target=consume)
    th.start()
    c0, s0, t0 = cpu_s(), ctx_switches(), time.time()
    for i in range(COUNT):
        p.produce(TOPIC, value=b"%.6f" % time.time())
        p.poll(0)
        d = t0 + (i + 1) / rate - time.time()
        if d > 0:
            time.sleep(d)
    p.flush(30)
    finished.wait(60)
    secs, cpu, switches = time.time() - t0, cpu_s() - c0, ctx_switches() - s0
    c.close()
    lat.sort()
    n = len(lat)
    report("kafka-e2e", n, secs, cpu, {
        "rate": rate, "ctx_switches_per_msg": round(switches / max(n, 1), 2),
        "p50_ms": round(lat[n // 2] * 1e3, 2), "p99_ms": round(lat[int(n * 0.99)] * 1e3, 2),
        "over_20ms": sum(1 for x in lat if x > 0.02)})


def groups():
    import kafka_groups
    kafka_groups.run(BS, cpu_s, create)


if __name__ == "__main__":
    {"produce": produce, "fetch": fetch, "rebalance": rebalance, "sync": sync, "e2e": e2e,
     "groups": groups}[WHAT]()
