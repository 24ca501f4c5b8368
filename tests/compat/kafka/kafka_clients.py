"""Real Kafka clients against `shoal dev` (see run-kafka-clients.sh).

Usage: kafka_clients.py SCENARIO BOOTSTRAP NAMESRV SHOAL_BIN
Scenarios: roundtrip, headers, interop, group-range, group-cooperative, group-consumer, static, commit-before, commit-after.
Each prints what it checked and exits non-zero on the first failed check.
"""
import base64
import json
import subprocess
import sys
import threading
import time
import uuid

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
import kafka as kafka_python

BS, NS, SHOAL = sys.argv[2], sys.argv[3], sys.argv[4]


def check(cond, what):
    if not cond:
        print("FAILED:", what, flush=True)
        sys.exit(1)
    print("ok:", what, flush=True)


def create_topic(name, partitions):
    a = AdminClient({"bootstrap.servers": BS})
    for _, f in a.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)]).items():
        f.result(15)


def consume_all(conf, topic, n, timeout=30):
    c = Consumer({"bootstrap.servers": BS, "auto.offset.reset": "earliest", **conf})
    c.subscribe([topic])
    got, t0 = [], time.time()
    while len(got) < n and time.time() - t0 < timeout:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            raise KafkaException(m.error())
        got.append(m)
    c.close()
    return got


def roundtrip():
    for comp in ["none", "gzip", "snappy", "lz4", "zstd"]:
        topic = f"KRound-{comp}"
        create_topic(topic, 3)
        p = Producer({"bootstrap.servers": BS, "compression.type": comp, "enable.idempotence": True,
                      "acks": "all", "linger.ms": 5})
        sent = {}
        for i in range(30):
            key, value = f"key-{i}".encode(), f"{comp}-value-{i}".encode() * (i % 5 + 1)
            hdrs = [("trace-id", f"t{i}".encode()), ("bin", bytes([0, 1, 2, i]))]
            sent[key] = (value, hdrs)
            p.produce(topic, key=key, value=value, headers=hdrs)
        p.produce(topic, key=b"tombstone", value=None)
        check(p.flush(15) == 0, f"confluent-kafka idempotent producer, {comp}: 31 records acknowledged")
        got = consume_all({"group.id": f"g-{comp}-{uuid.uuid4().hex[:6]}"}, topic, 31)
        check(len(got) == 31, f"confluent-kafka consumer read back 31 records ({comp})")
        for m in got:
            if m.key() == b"tombstone":
                check(m.value() is None, "a null value comes back null")
                continue
            value, hdrs = sent[m.key()]
            if m.value() != value or m.headers() != hdrs:
                check(False, f"record {m.key()} came back as {m.value()!r} {m.headers()!r}")
        check(True, f"keys, values and headers identical ({comp})")
        # kafka-python reads the same records and writes its own.
        kp = kafka_python.KafkaProducer(bootstrap_servers=BS,
                                        compression_type="gzip" if comp == "gzip" else None)
        for i in range(10):
            kp.send(topic, key=b"py-%d" % i, value=b"py-value-%d" % i, headers=[("from", b"kafka-python")])
        kp.flush()
        kp.close()
        kc = kafka_python.KafkaConsumer(topic, bootstrap_servers=BS, group_id=f"py-{comp}",
                                        auto_offset_reset="earliest", consumer_timeout_ms=8000)
        py = [m for m in kc]
        kc.close()
        check(len(py) == 41, f"kafka-python consumer read 41 records ({comp}), got {len(py)}")
        mine = [m for m in py if m.key and m.key.startswith(b"py-")]
        check(all(m.headers == [("from", b"kafka-python")] for m in mine), "kafka-python headers kept")


# The headers of issue 45: order, a repeated name, binary, empty and null values.
HEADERS = [("seq", b"0"), ("codec", b"gzip"), ("bin", b"\x00\xff\x00\n\r"), ("dup", b"first"),
           ("dup", b"second"), ("empty", b""), ("null", None)]


def headers():
    for comp in ["none", "gzip", "snappy", "lz4", "zstd"]:
        topic = f"KHeaders-{comp}"
        create_topic(topic, 1)
        p = Producer({"bootstrap.servers": BS, "compression.type": comp, "linger.ms": 5})
        for i in range(3):
            p.produce(topic, key=f"h-{i}", value=f"v-{i}", headers=HEADERS)
        check(p.flush(15) == 0, f"confluent-kafka: 3 records with repeated, binary, empty and null headers ({comp})")
        got = consume_all({"group.id": f"gh-{comp}"}, topic, 3)
        check(len(got) == 3 and all(m.headers() == HEADERS for m in got),
              f"confluent-kafka reads the headers back exactly: order, repeats, binary, empty, null ({comp}): "
              f"{[m.headers() for m in got]!r}")
        # A RocketMQ consumer sees the plain-text headers as properties (a repeated name: its
        # last value) and the whole list in KAFKA_HEADER_LIST.
        out = shoal("consume", topic, "--group", f"rmq-h-{comp}", "--from", "first", "--count", "3", "--json")
        msgs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        check(len(msgs) == 3, f"a RocketMQ consumer reads the 3 records ({comp})")
        for m in msgs:
            props = m["properties"]
            listed = [(n, None if v is None else base64.b64decode(v))
                      for n, v in json.loads(props["KAFKA_HEADER_LIST"])]
            check(props.get("seq") == "0" and props.get("codec") == "gzip" and props.get("dup") == "second"
                  and "bin" not in props and listed == HEADERS,
                  f"RocketMQ properties of a Kafka record ({comp}): {props!r}")


def group_listed(gid, mode):
    """The row of `shoal group list --json` for gid, once it shows 3 members of `mode`, STABLE
    (or the last row seen after 20 s)."""
    t0, row = time.time(), {}
    while time.time() - t0 < 20:
        rows = json.loads(shoal("group", "list", "--json"))
        row = next((r for r in rows if r.get("group") == gid), {})
        if row.get("members") == 3 and row.get("mode") == mode and row.get("state") == "STABLE":
            break
        time.sleep(0.5)
    return row


def progress_owners(gid, topic, members, what):
    """`shoal group progress --json` names the member owning each partition (client id @ host,
    the member id after it where client ids repeat: librdkafka's default is `rdkafka`), and
    groups the partitions the way the members themselves report owning them."""
    t0, by_owner, want, rows = time.time(), {}, set(), []
    while time.time() - t0 < 20:
        want = {frozenset(m.owned) for m in members}
        p = json.loads(shoal("group", "progress", gid, "--json"))
        rows = [q for q in p.get("queues", []) if q.get("topic") == topic]
        by_owner = {}
        for q in rows:
            by_owner.setdefault(q.get("owner"), set()).add(q["queue"])
        if None not in by_owner and {frozenset(v) for v in by_owner.values()} == want:
            break
        time.sleep(0.5)
    check(None not in by_owner and {frozenset(v) for v in by_owner.values()} == want
          and len(by_owner) == len(members)
          and all("@127.0.0.1" in o for o in by_owner if o),
          f"{what}: shoal group progress shows each partition's owner "
          f"({ {o: sorted(v) for o, v in by_owner.items()} }, members own {[sorted(w) for w in want]})")


def shoal(*args):
    return subprocess.run([SHOAL, *args, "--namesrv", NS], check=True, capture_output=True, text=True,
                          timeout=60).stdout


def interop():
    create_topic("KInterop", 2)
    shoal("send", "KInterop", "--body", "from-rocketmq-{i}", "--key", "rk-{i}", "--tag", "TagA", "--count", "4")
    got = consume_all({"group.id": "g-interop"}, "KInterop", 4)
    check(len(got) == 4, "a Kafka consumer reads the 4 messages a RocketMQ producer sent")
    for m in got:
        h = dict(m.headers() or [])
        check(m.value().startswith(b"from-rocketmq-") and m.key().startswith(b"rk-")
              and h.get("TAGS") == b"TagA" and h.get("KEYS") == m.key(),
              f"RocketMQ key -> Kafka key, tag and keys -> headers ({m.key()!r})")
    p = Producer({"bootstrap.servers": BS})
    for i in range(3):
        p.produce("KInterop", key=f"kk-{i}", value=f"from-kafka-{i}", headers=[("TAGS", b"TagK")])
    p.flush(10)
    out = shoal("consume", "KInterop", "--group", "rmq-interop", "--from", "first", "--tag-expr", "TagK",
                "--count", "3", "--json")
    msgs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    check(len(msgs) == 3, "a RocketMQ consumer (tag filter TagK) reads the 3 Kafka records")
    check(all(m["body"].startswith("from-kafka-") and m["keys"].startswith("kk-") and m["tags"] == "TagK"
              for m in msgs), "Kafka key -> RocketMQ KEYS, header TAGS -> RocketMQ tag")


class Member:
    """A consumer in a thread that records what it owns and what it consumed."""

    def __init__(self, group, topic, strategy, instance=None, extra=None):
        self.owned, self.revoked_events, self.assigned_events = set(), [], []
        self.seen = []
        conf = {"bootstrap.servers": BS, "group.id": group, "auto.offset.reset": "earliest",
                "enable.auto.commit": True, "auto.commit.interval.ms": 200}
        if strategy == "consumer":
            conf["group.protocol"] = "consumer"
        else:
            conf.update({"partition.assignment.strategy": strategy, "session.timeout.ms": 10000,
                         "heartbeat.interval.ms": 500})
        if instance:
            conf["group.instance.id"] = instance
        conf.update(extra or {})
        self.cooperative = strategy in ("cooperative-sticky", "consumer")
        self.c = Consumer(conf)
        self.stop = False
        self.c.subscribe([topic], on_assign=self._assign, on_revoke=self._revoke)
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _assign(self, c, parts):
        ps = {p.partition for p in parts}
        self.assigned_events.append(ps)
        if self.cooperative:
            c.incremental_assign(parts)
            self.owned |= ps
        else:
            c.assign(parts)
            self.owned = ps

    def _revoke(self, c, parts):
        ps = {p.partition for p in parts}
        self.revoked_events.append(ps)
        if self.cooperative:
            c.incremental_unassign(parts)
            self.owned -= ps
        else:
            self.owned = set()

    def _run(self):
        while not self.stop:
            m = self.c.poll(0.2)
            if m is not None and not m.error():
                self.seen.append((m.partition(), m.offset()))

    def close(self):
        self.stop = True
        self.t.join()
        self.c.close()


def wait_converged(members, partitions, what, timeout=40):
    t0 = time.time()
    while time.time() - t0 < timeout:
        owned = [m.owned for m in members]
        union = set().union(*owned)
        if union == set(range(partitions)) and sum(len(o) for o in owned) == partitions \
                and all(owned) and all(abs(len(a) - len(b)) <= 1 for a in owned for b in owned):
            check(True, f"{what}: {len(members)} members own {partitions} partitions once each, "
                        f"balanced, after {time.time() - t0:.1f}s ({[sorted(o) for o in owned]})")
            return
        time.sleep(0.2)
    check(False, f"{what}: no convergence, owned {[sorted(m.owned) for m in members]}")


def group(strategy):
    topic, partitions = f"KGroup-{strategy}", 6
    create_topic(topic, partitions)
    gid = f"g-{strategy}-{uuid.uuid4().hex[:6]}"
    p = Producer({"bootstrap.servers": BS})
    stop = threading.Event()
    produced = []

    def produce():
        i = 0
        while not stop.is_set():
            p.produce(topic, value=b"m%d" % i, partition=i % partitions)
            produced.append(i)
            i += 1
            p.poll(0)
            time.sleep(0.005)
        p.flush(10)

    pt = threading.Thread(target=produce, daemon=True)
    pt.start()
    members = [Member(gid, topic, strategy)]
    wait_converged(members, partitions, f"{strategy}: first member")
    members.append(Member(gid, topic, strategy))
    members.append(Member(gid, topic, strategy))
    wait_converged(members, partitions, f"{strategy}: two members joined")
    if strategy in ("range", "cooperative-sticky"):
        # Classic groups live in the Kafka listener; the broker's GROUP_DESCRIBE asks it, so
        # `shoal group describe` shows generation, leader and the decoded assignments.
        t0, d, owned = time.time(), {}, []
        while time.time() - t0 < 20:
            d = json.loads(shoal("group", "describe", gid, "--json"))
            owned = sorted(q["queueId"] for m in d.get("members", []) for q in m.get("owned", []))
            if d.get("mode") == "kafkaClassic" and d.get("state") == "Stable" \
                    and len(d.get("members", [])) == 3 and owned == list(range(partitions)):
                break
            time.sleep(0.5)
        check(d.get("mode") == "kafkaClassic" and d.get("state") == "Stable"
              and len(d.get("members", [])) == 3 and d.get("assignor") == strategy
              and d.get("generation", 0) >= 1
              and sum(1 for m in d.get("members", []) if m.get("leader")) == 1,
              f"{strategy}: shoal group describe shows the classic group of 3 ({d})")
        check(owned == list(range(partitions)), f"{strategy}: describe shows every partition assigned once ({owned})")
        row = group_listed(gid, "kafkaClassic")
        check(row.get("members") == 3 and row.get("state") == "STABLE",
              f"{strategy}: shoal group list shows the classic group: 3 members, kafkaClassic, STABLE ({row})")
        progress_owners(gid, topic, members, strategy)
    if strategy == "consumer":
        # KIP-848 groups live in the broker's coordinator, the one of Shoal's coordinated mode:
        # `shoal group describe` shows them (owned queues as the members last reported them).
        t0, d, owned = time.time(), {}, []
        while time.time() - t0 < 20:
            d = json.loads(shoal("group", "describe", gid, "--json"))
            owned = sorted(q["queueId"] for m in d.get("members", []) for q in m.get("owned", []))
            if d.get("mode") == "coordinated" and len(d.get("members", [])) == 3 \
                    and owned == list(range(partitions)):
                break
            time.sleep(0.5)
        check(d.get("mode") == "coordinated" and len(d.get("members", [])) == 3,
              f"consumer: shoal group describe shows the coordinated group of 3 ({d})")
        check(owned == list(range(partitions)), f"consumer: describe shows every queue owned once ({owned})")
        row = group_listed(gid, "coordinated")
        check(row.get("members") == 3 and row.get("state") == "STABLE",
              f"consumer: shoal group list shows the group: 3 members, coordinated, STABLE ({row})")
        progress_owners(gid, topic, members, "consumer")
    before = [set(m.owned) for m in members[:2]]
    revokes_before = [len(m.revoked_events) for m in members[:2]]
    leaving = members.pop()
    leaving.close()
    wait_converged(members, partitions, f"{strategy}: one member left")
    if strategy in ("cooperative-sticky", "consumer"):
        kept = all(b <= m.owned for b, m in zip(before, members))
        check(kept, f"{strategy}: the remaining members kept every partition they had")
        revoked = [set().union(*m.revoked_events[n:]) if m.revoked_events[n:] else set()
                   for m, n in zip(members, revokes_before)]
        check(all(not r for r in revoked), f"{strategy}: nothing revoked from them ({revoked})")
    time.sleep(1)
    stop.set()
    pt.join()
    total = len(produced)
    seen = set()
    t0 = time.time()
    while time.time() - t0 < 20:
        seen = set(s for m in members + [leaving] for s in m.seen)
        if len(seen) >= total:
            break
        time.sleep(0.3)
    dups = sum(len(m.seen) for m in members + [leaving]) - len(seen)
    check(len(seen) == total, f"{strategy}: all {total} messages consumed ({dups} duplicates)")
    for m in members:
        m.close()


def static():
    topic, partitions = "KStatic", 6
    create_topic(topic, partitions)
    gid = f"g-static-{uuid.uuid4().hex[:6]}"
    members = [Member(gid, topic, "range", instance=f"inst-{i}") for i in range(3)]
    wait_converged(members, partitions, "static: three static members")
    time.sleep(2)
    events = [(len(m.assigned_events), len(m.revoked_events)) for m in members[:2]]
    owned_before = [set(m.owned) for m in members]
    a = AdminClient({"bootstrap.servers": BS})
    desc = a.describe_consumer_groups([gid])[gid].result(10)
    old_ids = {m.group_instance_id: m.member_id for m in desc.members}
    members[2].close()  # a static member closes without leaving the group
    time.sleep(1)
    members[2] = Member(gid, topic, "range", instance="inst-2")
    t0 = time.time()
    while not members[2].owned and time.time() - t0 < 20:
        time.sleep(0.2)
    check(members[2].owned == owned_before[2],
          f"static: the restarted member got its partitions back {sorted(members[2].owned)}")
    time.sleep(2)
    check([(len(m.assigned_events), len(m.revoked_events)) for m in members[:2]] == events
          and [m.owned for m in members[:2]] == owned_before[:2],
          "static: the other members saw no rebalance (no assign or revoke callbacks)")
    desc = a.describe_consumer_groups([gid])[gid].result(10)
    new_ids = {m.group_instance_id: m.member_id for m in desc.members}
    check(new_ids["inst-2"] != old_ids["inst-2"] and new_ids["inst-0"] == old_ids["inst-0"],
          "static: the restarted member has a new member id, the others kept theirs")
    for m in members:
        m.close()


def commit_before():
    create_topic("KCommit", 1)
    p = Producer({"bootstrap.servers": BS})
    for i in range(20):
        p.produce("KCommit", value=b"c%d" % i)
    p.flush(10)
    c = Consumer({"bootstrap.servers": BS, "group.id": "g-commit", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe(["KCommit"])
    n = 0
    while n < 12:
        m = c.poll(1.0)
        if m is not None and not m.error():
            n += 1
            if n == 12:
                c.commit(message=m, asynchronous=False)
    c.close()
    check(True, "committed offset 12 of KCommit[0] before the restart")


def commit_after():
    c = Consumer({"bootstrap.servers": BS, "group.id": "g-commit", "auto.offset.reset": "earliest"})
    committed = c.committed([TopicPartition("KCommit", 0)], timeout=10)
    check(committed[0].offset == 12, f"after the restart OffsetFetch gives 12 (got {committed[0].offset})")
    c.subscribe(["KCommit"])
    first = None
    t0 = time.time()
    while first is None and time.time() - t0 < 20:
        m = c.poll(1.0)
        if m is not None and not m.error():
            first = m
    c.close()
    check(first is not None and first.offset() == 12 and first.value() == b"c12",
          "after the restart the group resumes at offset 12")


SCENARIOS = {
    "roundtrip": roundtrip,
    "headers": headers,
    "interop": interop,
    "group-range": lambda: group("range"),
    "group-cooperative": lambda: group("cooperative-sticky"),
    "group-consumer": lambda: group("consumer"),
    "static": static,
    "commit-before": commit_before,
    "commit-after": commit_after,
}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
