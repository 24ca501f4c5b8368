"""Apache RocketMQ's official C++ client (librocketmq, bundled by PyPI `rocketmq` 0.4.4) through
a failover of `shoal dev --replicas 3` (run by tests/compat/run-failover.sh cpp): a producer
sending one message every 20 ms with send_sync and a clustering push consumer (from each
queue's last offset, chosen before the counted sends begin); once the consumer received 50
messages, and not sooner than 5 s after the clients started (FAILOVER_KILL_AFTER_S), the
master's process is SIGKILLed; the producer goes on until sends are acknowledged again and
3 s more; then every acknowledged message (send_sync returned SEND_OK) must reach the consumer
(duplicates allowed). Prints the time from the kill until the first send that began after it
was acknowledged, and until the consumer first received a message sent after it.

The client reads its topics' routes from the name server when it starts, 3 s later and every
30 s after that (constants of librocketmq, no setting changes them), so sends resume at the
first route poll after the new master registered. A pull held at the master when it dies
fails only at its 30 s timeout, and the consumer pulls again at once.

Usage: python cpp_failover.py NAMESRV_ADDR MASTER_ADDR MASTER_PID
The topic is created on MASTER_ADDR with `$SHOAL_BIN topic create`. Exit 0: passed.
"""
import os
import signal
import subprocess
import sys
import threading
import time

from rocketmq.client import Message, Producer, PushConsumer

NS, MASTER, PID = sys.argv[1], sys.argv[2], int(sys.argv[3])
RUN = str(int(time.time() * 1000) % 1000000)
TOPIC = "CppFailover" + RUN
# The longest wait for sends to resume after the kill: the client's 30 s route poll, the
# election and a margin.
RESUME_LIMIT = 45.0
# The kill comes this long after the clients started, at the earliest: past the client's
# first scheduled route poll (3 s after it starts), so the kill falls in the poll's 30 s period
# at a point that does not depend on how fast the consumer started.
# FAILOVER_KILL_AFTER_S places it elsewhere in the period.
KILL_AFTER = float(os.environ.get("FAILOVER_KILL_AFTER_S", "5"))


def check(ok, what):
    print(("ok: " if ok else "FAILED: ") + what, flush=True)
    if not ok:
        sys.exit(1)


def wait_for(limit, cond):
    deadline = time.time() + limit
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def main():
    subprocess.run([os.environ["SHOAL_BIN"], "topic", "create", TOPIC, "--queues", "4",
                    "--brokers", MASTER, "--namesrv", NS, "--json"],
                   check=True, capture_output=True, timeout=60)
    lock = threading.Lock()
    first = {}  # key -> first receipt (time.monotonic())
    total = [0]

    def on_message(msg):
        now = time.monotonic()
        key = msg.keys.decode() if isinstance(msg.keys, bytes) else msg.keys
        with lock:
            if key.startswith("k-"):
                total[0] += 1
            first.setdefault(key, now)

    clients_started = time.monotonic()
    consumer = PushConsumer("CPP_FAILOVER_CG_" + RUN)
    consumer.set_namesrv_addr(NS)
    consumer.subscribe(TOPIC, on_message, "*")
    consumer.start()

    producer = Producer("CPP_FAILOVER_PG_" + RUN, timeout=3000)
    producer.set_namesrv_addr(NS)
    producer.start()

    # The consumer starts from each queue's last offset (the binding has no setting for where a
    # new group starts): once it received a warm-up message, it has chosen its offsets, and
    # every message sent from then on is one it must consume.
    def warm_up():
        i = 0
        def warmed():
            with lock:
                return any(k.startswith("w-") for k in first)

        while not wait_for(0.2, warmed):
            m = Message(TOPIC)
            m.set_keys("w-%d" % i)
            m.set_body("warm-up %d" % i)
            try:
                producer.send_sync(m)
            except Exception:  # the route may not be there yet
                pass
            i += 1
            if i > 150:
                return False
        return True

    check(warm_up(), "the consumer receives a warm-up message")

    acks = []  # (key, started, acked_at)
    failed = []  # when each failed send began
    stop = threading.Event()

    def send_loop():
        i = 0
        while not stop.is_set():
            key = "k-%d" % i
            m = Message(TOPIC)
            m.set_keys(key)
            m.set_body("failover %d" % i)
            started = time.monotonic()
            try:
                r = producer.send_sync(m)
                ok = int(r.status) == 0
            except Exception:  # the binding raises on every failed send
                ok = False
            with lock:
                if ok:
                    acks.append((key, started, time.monotonic()))
                else:
                    failed.append(started)
            i += 1
            time.sleep(0.02)

    sender = threading.Thread(target=send_loop, name="sender")
    sender.start()
    try:
        def received():
            with lock:
                return sum(1 for k in first if k.startswith("k-"))

        check(wait_for(60, lambda: received() >= 50), "the consumer receives before the kill")
        time.sleep(max(0.0, clients_started + KILL_AFTER - time.monotonic()))
        os.kill(PID, signal.SIGKILL)
        killed_at = time.monotonic()
        print("master %s (pid %d) SIGKILLed %d ms after the clients started"
              % (MASTER, PID, (killed_at - clients_started) * 1000), flush=True)

        def first_after():
            with lock:
                return next((a for a in acks if a[1] > killed_at), None)

        resumed = wait_for(RESUME_LIMIT, lambda: first_after() is not None)
        if resumed:
            time.sleep(3)
    finally:
        stop.set()
        sender.join()
    with lock:
        n_acked = len(acks)
        failed_after = sum(1 for t in failed if t > killed_at)
        sent_after = set(a[0] for a in acks if a[1] > killed_at)
    check(resumed, "a send that began after the kill acknowledged within %.0f s (%d failed)"
          % (RESUME_LIMIT, failed_after))

    def missing():
        with lock:
            return sorted(a[0] for a in acks if a[0] not in first)

    ok = wait_for(60, lambda: not missing())
    check(ok, "every acknowledged message consumed after the failover (%d acknowledged, %d missing, "
          "e.g. %s)" % (n_acked, len(missing()), missing()[:5]))
    fa = first_after()
    with lock:
        consumed = min(first[k] for k in sent_after if k in first)
        received_total = total[0]
        distinct = sum(1 for k in first if k.startswith("k-"))
    print("failover (cpp client, route poll 30 s): %d acknowledged, %d sends failed after the kill; "
          "first send acknowledged %d ms after the kill; consumer resumed %d ms after the kill (first "
          "message sent after the kill received); received %d (%d distinct); 0 acknowledged lost"
          % (n_acked, failed_after, (fa[2] - killed_at) * 1000, (consumed - killed_at) * 1000,
             received_total, distinct), flush=True)
    producer.shutdown()
    consumer.shutdown()
    print("rocketmq cpp client failover: passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
