"""Consumer-group changes under load, one run (the `groups` mode of kafka_bench.py, driven by
benches/kafka/groups.sh).

A topic of PARTITIONS (16) partitions gets RATE (2000) records/s from a producer thread. Each
group member is a process of its own (`kafka_groups.py member`, a confluent-kafka Consumer)
that reports on its stdout, as JSON lines, what it is assigned and revoked, every pause of more
than 50 ms between two records of a partition it owns, the records it received, and on demand
its librdkafka request counters. This process measures, from the members' reports:

- first: from the moment the first MEMBERS (4) subscribe until every partition has exactly
  one owner and every member owns some;
- heartbeats per member per minute over STEADY_S (30) seconds of steady state (librdkafka's
  request counters: ConsumerGroupHeartbeat, or Heartbeat for the classic protocol);
- join: JOINERS (4) more members subscribe at once; convergence as above; rounds = the most
  generations one of the old members joined during the join (classic protocol); the
  longest pause of a partition whose owner did not change (from just before the change until
  one second after convergence);
- leave: the JOINERS newest members close(); convergence and longest pause as above;
- kill (KILL=1, the default; 0 skips it): one member is SIGKILLed; convergence (bound by
  the session timeout, 45 s by default on both brokers);
- at the end: records lost (produced, never received) and duplicates (received twice).

PROTOCOL: consumer (KIP-848, `group.protocol=consumer`) or classic (STRATEGY,
cooperative-sticky by default). Client settings are librdkafka's defaults otherwise.
TRACE_DIR: each member writes librdkafka's debug log (categories TRACE_DEBUG, `cgrp` by
default; `cgrp,fetch` shows the fetcher) and its pauses to TRACE_DIR/PID.log.
DUMP: each run writes every member event (assignments, revocations, offsets seen) as JSON lines
to DUMP.<unix time>, to find a lost record's partition and offset afterwards.
"""
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid

PARTS = int(os.environ.get("PARTITIONS", "16"))
PROTOCOL = os.environ.get("PROTOCOL", "consumer")
STRATEGY = os.environ.get("STRATEGY", "cooperative-sticky")
GAP_S = 0.05


def emit(**kv):
    sys.stdout.write(json.dumps(kv) + "\n")
    sys.stdout.flush()


def member(bs, group, topic):
    """One group member: waits for `go`, subscribes, consumes; `stats` prints the request
    counters, `close` closes the consumer and exits."""
    from confluent_kafka import Consumer

    # Heartbeats and JoinGroup answers are counted from librdkafka's `cgrp` debug log (its
    # statistics count neither ConsumerGroupHeartbeat nor generations).
    counts = {"heartbeats": 0, "generations": []}

    trace = open(os.path.join(os.environ["TRACE_DIR"], f"{os.getpid()}.log"), "a") \
        if os.environ.get("TRACE_DIR") else None

    class Counter(logging.Handler):
        def emit(self, record):
            msg = record.getMessage()
            if trace:
                trace.write(f"{time.time():.3f} {msg}\n")
            if "ConsumerGroupHeartbeat response received" in msg or "Heartbeat for group" in msg:
                counts["heartbeats"] += 1
            elif "JoinGroup response: GenerationId " in msg:
                gen = int(msg.split("JoinGroup response: GenerationId ")[1].split(",")[0])
                if gen >= 0:
                    counts["generations"].append(gen)

    log = logging.getLogger("rdkafka-" + uuid.uuid4().hex[:6])
    log.propagate = False
    log.setLevel(logging.DEBUG)
    log.addHandler(Counter())
    conf = {"bootstrap.servers": bs, "group.id": group, "auto.offset.reset": "earliest",
            "debug": os.environ.get("TRACE_DEBUG", "cgrp"), "logger": log}
    if PROTOCOL == "consumer":
        conf["group.protocol"] = "consumer"
    else:
        conf["partition.assignment.strategy"] = STRATEGY
    c = Consumer(conf)
    cmds = queue.Queue()
    threading.Thread(target=lambda: [cmds.put(line.strip()) for line in sys.stdin], daemon=True).start()
    eager = PROTOCOL == "classic" and STRATEGY != "cooperative-sticky"
    last = {}

    def on_assign(cons, ps):
        if eager:
            cons.assign(ps)
        else:
            cons.incremental_assign(ps)
        for p in ps:
            last[p.partition] = None
        emit(ev="assign", t=time.time(), parts=[p.partition for p in ps], eager=eager)

    def on_revoke(cons, ps):
        if eager:
            cons.unassign()
        else:
            cons.incremental_unassign(ps)
        for p in ps:
            last.pop(p.partition, None)
        emit(ev="revoke", t=time.time(), parts=[p.partition for p in ps], eager=eager)

    emit(ev="ready", t=time.time())
    while cmds.get() != "go":
        pass
    c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
    emit(ev="subscribed", t=time.time())
    seen, flushed = {}, time.time()

    def record(m):
        if m is None or m.error():
            return
        now, p = time.time(), m.partition()
        prev = last.get(p)
        if prev is not None and now - prev > GAP_S:
            emit(ev="gap", p=p, start=prev, end=now)
            if trace:
                trace.write(f"{now:.3f} GAP partition {p} {now - prev:.3f} s\n")
        last[p] = now
        seen.setdefault(p, []).append(m.offset())

    while True:
        try:
            cmd = cmds.get_nowait()
        except queue.Empty:
            cmd = None
        if cmd == "stats":
            # poll() serves the callbacks that count heartbeats, and may return a record:
            # counted like any other (dropping it showed as a record lost).
            record(c.poll(0))
            emit(ev="stats", t=time.time(), heartbeats=counts["heartbeats"],
                 generations=counts["generations"])
        elif cmd == "close":
            break
        for m in c.consume(1000, 0.05):
            record(m)
        if time.time() - flushed > 1.0:
            emit(ev="seen", offsets=seen)
            seen, flushed = {}, time.time()
    emit(ev="seen", offsets=seen)
    c.close()
    emit(ev="closed", t=time.time())


class Member:
    def __init__(self, bs, group, topic, name, log):
        self.name, self.owned, self.alive = name, set(), True
        self.events, self.cond = [], threading.Condition()
        self.log = log
        env = dict(os.environ, PROTOCOL=PROTOCOL, STRATEGY=STRATEGY)
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "member", bs, group, topic],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        threading.Thread(target=self.read, daemon=True).start()

    def read(self):
        for line in self.p.stdout:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            with self.cond:
                if e["ev"] == "assign":
                    self.owned = set(e["parts"]) if e["eager"] else self.owned | set(e["parts"])
                elif e["ev"] == "revoke":
                    self.owned = set() if e["eager"] else self.owned - set(e["parts"])
                self.events.append(e)
                self.log.append((self.name, e))
                self.cond.notify_all()

    def wait_for(self, ev, after=0.0, timeout=30):
        end = time.time() + timeout
        with self.cond:
            while True:
                for e in self.events:
                    if e["ev"] == ev and e.get("t", 0) >= after:
                        return e
                if time.time() > end:
                    raise RuntimeError(f"member {self.name}: no {ev}")
                self.cond.wait(0.1)

    def send(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()

    def stats(self):
        t = time.time()
        self.send("stats")
        return self.wait_for("stats", after=t)


def converged(members):
    owned = [m.owned for m in members]
    return sum(len(o) for o in owned) == PARTS and set().union(*owned) == set(range(PARTS)) \
        and all(owned)


def wait_converged(members, since, timeout=90):
    while time.time() - since < timeout:
        if converged(members):
            return time.time() - since
        time.sleep(0.005)
    return None


def owners(members):
    return {p: m.name for m in members for p in m.owned}


def longest_kept_pause(log, before, after, start, end):
    """The longest pause of a partition whose owner is the same in `before` and `after` and
    that was not revoked from it in [start, end], among pauses overlapping [start, end]."""
    kept = {p for p, o in before.items() if after.get(p) == o}
    for name, e in log:
        if e["ev"] == "revoke" and start <= e["t"] <= end:
            kept -= {p for p in e["parts"] if before.get(p) == name}
    worst = 0.0
    for name, e in log:
        if e["ev"] == "gap" and e["p"] in kept and before.get(e["p"]) == name \
                and e["end"] >= start and e["start"] <= end:
            worst = max(worst, e["end"] - e["start"])
    return round(worst, 3)


def run(bs, cpu_s, create):
    from confluent_kafka import Producer

    rate = int(os.environ.get("RATE", "2000"))
    n_first = int(os.environ.get("MEMBERS", "4"))
    n_join = int(os.environ.get("JOINERS", "4"))
    steady_s = float(os.environ.get("STEADY_S", "30"))
    topic = f"KGroups-{uuid.uuid4().hex[:6]}"
    group = "groups-" + uuid.uuid4().hex[:6]
    create(topic, PARTS)
    time.sleep(1)
    log, out = [], {"bench": "kafka-groups", "broker": os.environ.get("BROKER", "shoal"),
                    "protocol": PROTOCOL if PROTOCOL == "consumer" else f"classic {STRATEGY}",
                    "partitions": PARTS, "rate": rate}
    stop, produced = threading.Event(), [0]

    def delivered(err, _msg):
        if err is None:
            produced[0] += 1

    def producer():
        # `produced` counts the records the broker acknowledged.
        p = Producer({"bootstrap.servers": bs, "linger.ms": 5})
        i, t0 = 0, time.time()
        while not stop.is_set():
            p.produce(topic, value=b"%d" % i, partition=i % PARTS, on_delivery=delivered)
            i += 1
            if i % 20 == 0:
                p.poll(0)
                d = t0 + i / rate - time.time()
                if d > 0:
                    time.sleep(d)
        p.flush(30)

    members = [Member(bs, group, topic, f"m{i}", log) for i in range(n_first)]
    for m in members:
        m.wait_for("ready")
    pt = threading.Thread(target=producer, daemon=True)
    pt.start()
    c0 = cpu_s()
    t = time.time()
    for m in members:
        m.send("go")
    out["first_s"] = wait_converged(members, t)
    time.sleep(2)
    s0 = [m.stats()["heartbeats"] for m in members]
    time.sleep(steady_s)
    s1 = [m.stats()["heartbeats"] for m in members]
    out["heartbeats_per_member_min"] = round(sum(b - a for a, b in zip(s0, s1)) / len(members) * 60 / steady_s, 1)

    joiners = [Member(bs, group, topic, f"m{n_first + i}", log) for i in range(n_join)]
    for m in joiners:
        m.wait_for("ready")
    gens0 = [len(m.stats()["generations"]) for m in members]
    before = owners(members)
    t = time.time()
    for m in joiners:
        m.send("go")
    members += joiners
    out["join_s"] = wait_converged(members, t)
    time.sleep(2)
    if PROTOCOL == "classic":
        # Rounds: the generations an old member joined during the join.
        out["join_rounds"] = max(len(set(m.stats()["generations"][g:])) for m, g in zip(members, gens0))
    out["join_kept_pause_s"] = longest_kept_pause(log, before, owners(members), t, time.time())
    time.sleep(1)

    before = owners(members)
    leaving, members = members[-n_join:], members[:-n_join]
    t = time.time()
    for m in leaving:
        m.send("close")
    out["leave_s"] = wait_converged(members, t)
    time.sleep(2)
    out["leave_kept_pause_s"] = longest_kept_pause(log, before, owners(members), t, time.time())
    for m in leaving:
        m.wait_for("closed")
    if os.environ.get("KILL", "1") == "1" and len(members) > 1:
        victim, members = members[-1], members[:-1]
        t = time.time()
        victim.p.send_signal(signal.SIGKILL)
        out["kill_s"] = wait_converged(members, t, timeout=120)

    stop.set()
    pt.join()
    # Wait until everything produced was received (or 30 s), then close the rest.
    deadline = time.time() + 30
    while time.time() < deadline:
        got = set()
        for _, e in list(log):
            if e["ev"] == "seen":
                for p, offs in e["offsets"].items():
                    got.update((int(p), o) for o in offs)
        if len(got) >= produced[0]:
            break
        time.sleep(0.5)
    for m in members:
        m.send("close")
    for m in members:
        m.wait_for("closed")
    if os.environ.get("DUMP"):
        with open(os.environ["DUMP"] + "." + str(int(time.time())), "w") as f:
            for name, e in log:
                f.write(json.dumps([name, e]) + "\n")
    received = [(int(p), o) for _, e in log if e["ev"] == "seen" for p, offs in e["offsets"].items() for o in offs]
    unique = set(received)
    out.update(produced=produced[0], lost=max(produced[0] - len(unique), 0),
               duplicates=len(received) - len(unique),
               broker_cpu_us_per_msg=round((cpu_s() - c0) / max(len(received), 1) * 1e6, 1))
    print(json.dumps(out), flush=True)


ROWS = [
    ("first_s", "first assignment of the first 4 members, s"),
    ("heartbeats_per_member_min", "heartbeats per member per minute, steady state"),
    ("join_s", "join +4, convergence, s"),
    ("join_rounds", "join +4, rounds (generations an old member joined)"),
    ("join_kept_pause_s", "join +4, longest pause of a partition that kept its owner, s"),
    ("leave_s", "leave -4 (close), convergence, s"),
    ("leave_kept_pause_s", "leave -4, longest pause of a partition that kept its owner, s"),
    ("kill_s", "kill -1 (SIGKILL), convergence, s"),
    ("lost", "records lost"),
    ("duplicates", "records delivered twice"),
    ("broker_cpu_us_per_msg", "broker CPU per consumed record, us"),
]


def table(path):
    """The runs of `path` (JSON lines) as a Markdown table: median (min-max) per broker."""
    runs = [json.loads(line) for line in open(path) if line.startswith("{")]
    brokers = sorted({r["broker"] for r in runs}, key=lambda b: b != "shoal")
    for proto in sorted({r["protocol"] for r in runs}):
        print(f"\n{proto}\n")
        print("| | " + " | ".join(brokers) + " |")
        print("|---|" + "---:|" * len(brokers))
        for key, label in ROWS:
            cells = []
            for b in brokers:
                vals = sorted(r[key] for r in runs if r["broker"] == b and r["protocol"] == proto
                              and r.get(key) is not None)
                if not vals:
                    cells.append("-")
                    continue
                med = vals[len(vals) // 2] if len(vals) % 2 else (vals[len(vals) // 2 - 1] + vals[len(vals) // 2]) / 2
                fmt = (lambda v: f"{v:.2f}") if isinstance(vals[0], float) else str
                cells.append(f"{fmt(med)} ({fmt(vals[0])}-{fmt(vals[-1])}, n={len(vals)})")
            if any(c != "-" for c in cells):
                print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__" and sys.argv[1] == "member":
    member(*sys.argv[2:5])
elif __name__ == "__main__" and sys.argv[1] == "table":
    table(sys.argv[2])
