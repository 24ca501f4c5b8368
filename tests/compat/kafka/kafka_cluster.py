"""Kafka clients against a cluster of two Shoal brokers (see crates/shoal/tests/kafka_cluster.rs).

Usage: kafka_cluster.py PHASE BOOTSTRAP_A BOOTSTRAP_B TOPIC
Phases:
  whole     metadata from either broker lists both listeners and every partition of TOPIC
            (queues of broker-a first, then broker-b), with the same leaders; an idempotent
            producer bootstrapped at one broker writes every partition; groups of two members
            (classic cooperative-sticky, then KIP-848) bootstrapped at different brokers consume
            every message once; their commits are read back through the other broker.
  departed  broker-b is gone: its partitions are still listed, without a leader (no partition
            renumbered), and broker-a's are still served.
  move      a classic (cooperative-sticky) and a KIP-848 group of two members each, whose
            coordinator is broker-a, consume under a producer sending every 20 ms; the script
            prints READY and waits for a line on standard input (the test stops broker-a
            meanwhile); then every record acknowledged to broker-b's partitions must be
            consumed by both groups, and the longest wait of a broker-b record is printed.
  failover  BOOTSTRAP_A lists every broker of one replicated broker group (BOOTSTRAP_B is
            unused): an idempotent acks=all producer sends every 10 ms and a KIP-848 consumer
            reads; READY, then a line on standard input (the test SIGKILLs the master); every
            acknowledged record must be consumed, and the times until sends and consumption
            resumed are printed.
Each prints what it checked and exits non-zero on the first failed check.
"""
import os
import sys
import threading
import time
import uuid

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

PHASE, BS_A, BS_B, TOPIC = sys.argv[1:5]
PER_BROKER = 2
PARTITIONS = 2 * PER_BROKER


def check(cond, what):
    if not cond:
        print("FAILED:", what, flush=True)
        sys.exit(1)
    print("ok:", what, flush=True)


def layout(bs):
    md = AdminClient({"bootstrap.servers": bs}).list_topics(TOPIC, timeout=15)
    t = md.topics[TOPIC]
    brokers = {b.id: f"{b.host}:{b.port}" for b in md.brokers.values()}
    return brokers, {p.id: p.leader for p in t.partitions.values()}


class Member:
    """A consumer in a thread that records what it consumed and what it owns."""

    def __init__(self, bs, group, protocol, track=False):
        self.track = track
        # Tracking members commit as applications usually do (every 200 ms here), so a
        # coordinator move re-delivers only what was consumed since the last commit.
        conf = {"bootstrap.servers": bs, "group.id": group, "auto.offset.reset": "earliest",
                "enable.auto.commit": track, "auto.commit.interval.ms": 200}
        if protocol == "consumer":
            conf["group.protocol"] = "consumer"
        else:
            conf.update({"partition.assignment.strategy": "cooperative-sticky",
                         "session.timeout.ms": 10000, "heartbeat.interval.ms": 500})
        if os.environ.get("KAFKA_DEBUG"):
            conf["debug"] = os.environ["KAFKA_DEBUG"]
        self.c = Consumer(conf)
        self.group = group
        self.seen, self.owned, self.stop, self.error = [], set(), False, None
        self.epochs = {}  # record value -> the leader epoch its batch carried
        self.c.subscribe([TOPIC], on_assign=self._assign, on_revoke=self._revoke)
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _assign(self, c, parts):
        c.incremental_assign(parts)
        self.owned |= {p.partition for p in parts}

    def _revoke(self, c, parts):
        c.incremental_unassign(parts)
        self.owned -= {p.partition for p in parts}

    def _run(self):
        while not self.stop:
            m = self.c.poll(0.2)
            if m is None:
                continue
            if m.error():
                self.error = m.error()
                continue
            if self.track:
                self.seen.append((m.partition(), m.offset(), m.value(), time.time()))
                self.epochs[m.value()] = m.leader_epoch()
            else:
                self.seen.append((m.partition(), m.offset(), m.value()))

    def close(self):
        self.stop = True
        self.t.join()
        try:
            self.c.commit(asynchronous=False)
        except KafkaException as e:
            print("commit at close:", e, flush=True)
        self.c.close()


def replication_view(bs, settled):
    """Partition -> (leader, replicas, in-sync replicas) as a listener's metadata shows them,
    asked again for up to 10 s until `settled` holds (registrations reach the listeners'
    route caches within about a second)."""
    admin = AdminClient({"bootstrap.servers": bs})
    t0 = time.time()
    while True:
        md = admin.list_topics(TOPIC, timeout=15)
        view = {p.id: (p.leader, sorted(p.replicas), sorted(p.isrs))
                for p in md.topics[TOPIC].partitions.values()}
        if settled(view) or time.time() - t0 > 10:
            return view
        time.sleep(0.2)


def whole():
    brokers_a, leaders_a = layout(BS_A)
    brokers_b, leaders_b = layout(BS_B)
    check(len(brokers_a) == 2 and brokers_a == brokers_b,
          f"both listeners list both brokers: {brokers_a}")
    check(sorted(leaders_a) == list(range(PARTITIONS)),
          f"{TOPIC} has {PARTITIONS} partitions: {leaders_a}")
    check(leaders_a == leaders_b, "both listeners name the same leader for every partition")
    by_addr = {addr: i for i, addr in brokers_a.items()}
    first = {leaders_a[p] for p in range(PER_BROKER)}
    second = {leaders_a[p] for p in range(PER_BROKER, PARTITIONS)}
    check(first == {by_addr[BS_A]} and second == {by_addr[BS_B]},
          "partitions 0-1 are led by broker-a's listener, 2-3 by broker-b's")

    p = Producer({"bootstrap.servers": BS_A, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 5})
    acked, failed = [], []

    def done(err, m):
        (failed if err else acked).append(err or (m.partition(), m.offset(), m.value()))

    n = 200
    for i in range(n):
        p.produce(TOPIC, value=f"m-{i}".encode(), partition=i % PARTITIONS, on_delivery=done)
    p.flush(30)
    check(not failed and len(acked) == n, f"{n} records acknowledged by both leaders ({failed[:3]})")
    check({a[0] for a in acked} == set(range(PARTITIONS)), "every partition took records")
    sent = {a[2] for a in acked}

    for protocol in ["classic", "consumer"]:
        gid = f"kc-{protocol}-{uuid.uuid4().hex[:6]}"
        members = [Member(BS_A, gid, protocol), Member(BS_B, gid, protocol)]
        t0 = time.time()
        while time.time() - t0 < 60:
            got = [s for m in members for s in m.seen]
            if len(got) >= n and all(m.owned for m in members):
                break
            time.sleep(0.2)
        owned = [sorted(m.owned) for m in members]
        got = [s for m in members for s in m.seen]
        values = [g[2] for g in got]
        for m in members:
            m.close()
        check(set(values) == sent, f"{protocol}: every record consumed ({len(values)} of {n})")
        check(len(values) == len(set(values)), f"{protocol}: none consumed twice")
        check(sorted(sum(owned, [])) == list(range(PARTITIONS)),
              f"{protocol}: the two members split the partitions of both brokers {owned}")
        c = Consumer({"bootstrap.servers": BS_B, "group.id": gid})
        committed = c.committed([TopicPartition(TOPIC, i) for i in range(PARTITIONS)], timeout=15)
        c.close()
        ends = {i: max(a[1] for a in acked if a[0] == i) + 1 for i in range(PARTITIONS)}
        offs = {tp.partition: tp.offset for tp in committed}
        check(offs == ends, f"{protocol}: commits of both brokers' partitions read back {offs}")


def departed():
    t0 = time.time()
    while True:
        brokers, leaders = layout(BS_A)
        if len(brokers) == 1 and leaders.get(PER_BROKER) == -1:
            break
        if time.time() - t0 > 30:
            check(False, f"broker-b's leaders gone from the metadata: {leaders}")
        time.sleep(0.5)
    check(sorted(leaders) == list(range(PARTITIONS)),
          f"broker-b's partitions keep their place without a leader: {leaders}")
    check(all(leaders[i] >= 0 for i in range(PER_BROKER)), "broker-a still leads 0-1")
    p = Producer({"bootstrap.servers": BS_A, "enable.idempotence": True, "acks": "all"})
    acked = []
    for i in range(10):
        p.produce(TOPIC, value=f"after-{i}".encode(), partition=i % PER_BROKER,
                  on_delivery=lambda e, m: acked.append(e is None))
    p.flush(30)
    check(len(acked) == 10 and all(acked), "broker-a's partitions still take records")


def java_hash(text):
    """Java's String.hashCode of an ASCII name."""
    h = 0
    for ch in text:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinated_by_a(prefix):
    """A group name whose coordinator is broker-a: brokers sorted by name, the group name's
    Java hash modulo their count (docs/kafka.md)."""
    while True:
        g = f"{prefix}-{uuid.uuid4().hex[:6]}"
        if abs(java_hash(g)) % 2 == 0:
            return g


def move():
    acked, lock, stop = [], threading.Lock(), threading.Event()

    def produce():
        p = Producer({"bootstrap.servers": BS_B, "acks": "all", "linger.ms": 0,
                      "message.timeout.ms": 5000})
        i = 0
        while not stop.is_set():
            part = i % PARTITIONS
            v = f"mv-{i}".encode()

            def done(err, m, part=part, v=v):
                if err is None:
                    with lock:
                        acked.append((part, v, time.time()))
            p.produce(TOPIC, value=v, partition=part, on_delivery=done)
            p.poll(0)
            i += 1
            time.sleep(0.02)
        p.flush(10)

    prod = threading.Thread(target=produce, daemon=True)
    prod.start()
    gids = {proto: coordinated_by_a(f"mv-{proto}") for proto in ["classic", "consumer"]}
    groups = {proto: [Member(BS_B, gid, proto, track=True) for _ in range(2)]
              for proto, gid in gids.items()}
    t0 = time.time()
    while time.time() - t0 < 60:
        ready = all(sorted(sum([sorted(m.owned) for m in ms], [])) == list(range(PARTITIONS))
                    and all(m.seen for m in ms) for ms in groups.values())
        if ready:
            break
        time.sleep(0.2)
    check(ready, "both groups consume every partition: "
          + str({p: [sorted(m.owned) for m in ms] for p, ms in groups.items()}))
    time.sleep(2)
    print("READY", flush=True)
    sys.stdin.readline()
    stopped = time.time()
    print(f"broker-a stopped", flush=True)
    time.sleep(10)
    stop.set()
    prod.join()
    with lock:
        on_b = [(part, v, at) for part, v, at in acked if part >= PER_BROKER]
    for proto, ms in groups.items():
        t1 = time.time()
        while time.time() - t1 < 40:
            got = {v for m in ms for (part, _, v, _) in m.seen if part >= PER_BROKER}
            if all(v in got for _, v, _ in on_b):
                break
            time.sleep(0.2)
        for m in ms:
            m.close()
        seen = [x for m in ms for x in m.seen if x[0] >= PER_BROKER]
        first = {}
        for part, _, v, at in seen:
            first.setdefault(v, at)
        missing = [v for _, v, _ in on_b if v not in first]
        check(not missing, f"{proto}: every record acknowledged to broker-b's partitions "
                           f"consumed ({len(on_b)}; missing {missing[:5]})")
        waits = [max(0.0, first[v] - at) for _, v, at in on_b if at >= stopped - 1]
        dup = len(seen) - len(first)
        print(f"{proto}: broker-b records sent from 1 s before the stop: {len(waits)}, longest wait "
              f"{max(waits):.2f} s, median {sorted(waits)[len(waits) // 2]:.3f} s; "
              f"delivered twice: {dup}", flush=True)


def failover():
    acked, failed, lock, stop = [], [], threading.Lock(), threading.Event()

    def produce():
        p = Producer({"bootstrap.servers": BS_A, "acks": "all", "enable.idempotence": True,
                      "linger.ms": 0, "message.timeout.ms": 30000})
        i = 0
        while not stop.is_set():
            v = f"fo-{i}".encode()
            sent_at = time.time()

            def done(err, m, v=v, sent_at=sent_at):
                with lock:
                    if err is None:
                        acked.append((v, sent_at, time.time()))
                    else:
                        failed.append((v, str(err)))
            p.produce(TOPIC, value=v, partition=i % PARTITIONS, on_delivery=done)
            p.poll(0)
            i += 1
            time.sleep(0.01)
        left = p.flush(40)
        check(left == 0, f"the producer delivered or failed every record ({left} left)")

    prod = threading.Thread(target=produce, daemon=True)
    prod.start()
    # A KIP-848 group and a classic (cooperative-sticky) group, one member each.
    members = {proto: Member(BS_A, f"fo-{proto}-{uuid.uuid4().hex[:6]}", proto, track=True)
               for proto in ("consumer", "classic")}
    m = members["consumer"]
    t0 = time.time()
    while time.time() - t0 < 60 and (min(len(x.seen) for x in members.values()) < 50
                                     or len(acked) < 50):
        time.sleep(0.1)
    for proto, x in members.items():
        check(len(x.seen) >= 50, f"{proto}: records flow through the first master "
                                 f"({len(x.seen)} consumed)")
    before = replication_view(BS_A, lambda v: all(len(r) == 3 and len(i) == 3 and lead in r
                                                  for lead, r, i in v.values()))
    check(all(len(r) == 3 and len(i) == 3 and lead in r for lead, r, i in before.values()),
          f"every partition has 3 replicas, all in sync: {before}")
    epochs_before = set(m.epochs.values())
    check(len(epochs_before) == 1 and min(epochs_before) >= 1,
          f"records carry the master epoch as leader epoch: {epochs_before}")
    def probe(tag):
        if not os.environ.get("PROBE"):
            return
        for proto, mm in members.items():
            c = Consumer({"bootstrap.servers": BS_A, "group.id": mm.group})
            got = c.committed([TopicPartition(TOPIC, i) for i in range(PARTITIONS)], timeout=15)
            print(f"PROBE {tag} {proto}: {[t.offset for t in got]} seen {len(mm.seen)}", flush=True)
            c.close()
    # Both groups commit what they read (every 200 ms) before the kill, so what is delivered
    # twice measures the failover, not a group that had not committed yet.
    time.sleep(1)
    probe("before")
    print("READY", flush=True)
    sys.stdin.readline()
    killed = time.time()
    if os.environ.get("PROBE") or os.environ.get("KAFKA_DEBUG"):
        print(f"PROBE killed at {killed:.3f}", flush=True)
    time.sleep(8)
    probe("after")
    stop.set()
    prod.join()
    with lock:
        all_acked = list(acked)
        fails = list(failed)
    want = {v for v, _, _ in all_acked}
    t1 = time.time()
    while time.time() - t1 < 60:
        if all(want <= {x[2] for x in mm.seen} for mm in members.values()):
            break
        time.sleep(0.2)
    for proto, mm in members.items():
        if want <= {x[2] for x in mm.seen}:
            continue
        # What the consumer and the leaders say, to tell a stuck consumer from a lost record
        # (its polling thread stopped first: the client serializes calls on one handle).
        mm.stop = True
        mm.t.join()
        missing = want - {x[2] for x in mm.seen}
        where = sorted({int(v.decode().split("-")[1]) % PARTITIONS for v in missing})
        print(f"{proto}: missing {len(missing)} records of partitions {where}", flush=True)
        for tp in mm.c.position(mm.c.assignment()):
            lo, hi = mm.c.get_watermark_offsets(tp, timeout=10)
            print(f"{proto}: partition {tp.partition}: position {tp.offset}, watermarks "
                  f"{lo}..{hi}", flush=True)
        print(f"{proto}: consumer error: {mm.error}; assignment {sorted(mm.owned)}", flush=True)
    for mm in members.values():
        mm.close()
    for proto, mm in members.items():
        got = {x[2] for x in mm.seen}
        missing = sorted(want - got)
        check(not missing, f"{proto}: every acknowledged record consumed ({len(want)}; "
                           f"missing {missing[:5]})")
    acks_after = sorted(at for _, _, at in all_acked if at > killed)
    gap, last = 0.0, killed
    for at in acks_after:
        gap, last = max(gap, at - last), at
    first_ack = next((at - killed for v, sent, at in sorted(all_acked, key=lambda a: a[2])
                      if sent > killed), None)
    sent_after = {v: sent for v, sent, _ in all_acked if sent > killed}

    def secs(x):
        return "never" if x is None else f"{x:.2f} s"
    consumed = []
    for proto, mm in members.items():
        first_seen = min((at for _, _, v, at in mm.seen if v in sent_after), default=None)
        dup = len(mm.seen) - len({x[2] for x in mm.seen})
        consumed.append(f"{proto} consumed it {secs(first_seen - killed if first_seen else None)}"
                        f" after the kill, delivered twice: {dup}")
    print(f"failover: {len(want)} acknowledged, {len(fails)} failed ({fails[:2]}); "
          f"longest time between acknowledgements after the kill {gap:.2f} s; first record "
          f"sent after the kill acknowledged {secs(first_ack)}; " + "; ".join(consumed),
          flush=True)
    check(first_ack is not None, "records sent after the kill were acknowledged")
    after = replication_view(BS_A, lambda v: all(lead != before[p][0] and lead in i
                                                 for p, (lead, _, i) in v.items()))
    check(all(lead != before[p][0] and lead in i for p, (lead, _, i) in after.items()),
          f"a new leader, in sync, for every partition: {after}")
    epochs_after = {m.epochs[v] for v in sent_after if v in m.epochs}
    check(epochs_after and min(epochs_after) > max(epochs_before),
          f"records written after the failover carry a later leader epoch: {epochs_after}")


{"whole": whole, "departed": departed, "move": move, "failover": failover}[PHASE]()
