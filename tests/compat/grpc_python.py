"""RocketMQ 5's Python client (PyPI rocketmq-python-client 5.x) against Shoal's gRPC endpoint.

Run by tests/compat/run-grpc-client.sh, which starts `shoal dev` and creates the topics:
  P5Normal (2 queues), P5Fifo (FIFO), P5Delay (DELAY), P5Tx (TRANSACTION), P5Sql.
Usage: grpc_python.py GRPC_ENDPOINT. Exit 0 when every check passed; a failed check raises.
"""

import sys
import time

from rocketmq import (ClientConfiguration, Credentials, FilterExpression,
                      Message, Producer, SimpleConsumer, TransactionChecker)
from rocketmq.grpc_protocol import FilterType, TransactionResolution

ENDPOINT = sys.argv[1]


def config():
    return ClientConfiguration(ENDPOINT, Credentials(), request_timeout=10)


def message(topic, body, tag=None, keys=None, group=None, props=None, at=None):
    m = Message()
    m.topic = topic
    m.body = body.encode()
    if tag:
        m.tag = tag
    if keys:
        m.keys = keys
    if group:
        m.message_group = group
    if at:
        m.delivery_timestamp = at
    for k, v in (props or {}).items():
        m.add_property(k, v)
    return m


def consumer(group, topic, expr=None):
    c = SimpleConsumer(config(), group, {topic: expr or FilterExpression()}, await_duration=2)
    c.startup()
    return c


def receive_n(c, n, invisible, seconds=20):
    """Receives until n messages came or the time passed."""
    got = []
    deadline = time.time() + seconds
    while len(got) < n and time.time() < deadline:
        got.extend(c.receive(16, invisible))
    return got


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok: {what}", flush=True)


def normal_and_simple_consumer():
    p = Producer(config(), ("P5Normal",))
    p.startup()
    c = consumer("py-simple", "P5Normal")
    try:
        for i in range(4):
            r = p.send(message("P5Normal", f"m{i}", tag="t", keys=f"k-m{i}", props={"origin": "py"}))
            check(r.message_id, f"send m{i}: message id {r.message_id}")
        got = receive_n(c, 4, 2)
        bodies = sorted(m.body.decode() for m in got)
        check(bodies == ["m0", "m1", "m2", "m3"], f"received each message once: {bodies}")
        for m in got:
            b = m.body.decode()
            check(m.delivery_attempt == 1 and m.tag == "t" and m.keys == {f"k-{b}"}
                  and m.properties.get("origin") == "py",
                  f"{b}: attempt 1, tag, keys and property kept")
        stale = None
        for m in got:
            b = m.body.decode()
            if b == "m2":
                # A new lease, and an ack with the new receipt.
                c.change_invisible_duration(m, 30)
                c.ack(m)
            elif b == "m3":
                stale = m  # no ack: it comes again after its 2 s lease
            else:
                c.ack(m)
        again = receive_n(c, 1, 10)
        check(len(again) == 1 and again[0].body.decode() == "m3" and again[0].delivery_attempt == 2,
              "the unacknowledged message redelivered after its lease, attempt 2")
        old_handle = stale.receipt_handle
        c.ack(again[0])
        try:
            c.ack(stale)
            refused = False
        except Exception as e:  # the client raises on a non-OK status
            refused = True
            print(f"stale receipt refused: {e}", flush=True)
        check(refused and old_handle != again[0].receipt_handle, "the lapsed receipt's ack is refused")
        more = c.receive(16, 2)
        check(more == [], "nothing left after the acks")
    finally:
        c.shutdown()
        p.shutdown()


def fifo_and_delay():
    p = Producer(config(), ("P5Fifo", "P5Delay"))
    p.startup()
    c = consumer("py-delay", "P5Delay")
    f = consumer("py-fifo", "P5Fifo")
    try:
        try:
            p.send(message("P5Fifo", "plain"))
            refused = False
        except Exception as e:
            refused = True
            print(f"plain message to a FIFO topic refused: {e}", flush=True)
        check(refused, "a plain message to a FIFO topic is refused from the route's types")
        for i in range(3):
            p.send(message("P5Fifo", f"f{i}", group="order-1"))
        got = receive_n(f, 3, 10)
        bodies = [m.body.decode() for m in got]
        check(bodies == ["f0", "f1", "f2"], f"FIFO messages of one group in order: {bodies}")
        check(all(m.message_group == "order-1" for m in got), "the message group is kept")
        for m in got:
            f.ack(m)
        # This client takes the delivery time in seconds (it fills the Timestamp's seconds).
        due_s = int(time.time()) + 3
        due = due_s * 1000
        p.send(message("P5Delay", "later", at=due_s))
        got = receive_n(c, 1, 10)
        now = int(time.time() * 1000)
        check(len(got) == 1 and got[0].body.decode() == "later", "the delayed message is received")
        check(now >= due, f"not before its time ({now - due} ms after)")
        check(got[0].delivery_timestamp == due, "its delivery timestamp is kept")
        c.ack(got[0])
    finally:
        f.shutdown()
        c.shutdown()
        p.shutdown()


class Committer(TransactionChecker):
    def __init__(self):
        self.checks = 0

    def check(self, message):
        self.checks += 1
        print(f"check-back for {message.body.decode()}", flush=True)
        return TransactionResolution.COMMIT


def transactions():
    checker = Committer()
    p = Producer(config(), ("P5Tx",), checker)
    p.startup()
    c = consumer("py-tx", "P5Tx")
    try:
        t1 = p.begin_transaction()
        p.send(message("P5Tx", "committed"), t1)
        t1.commit()
        t2 = p.begin_transaction()
        p.send(message("P5Tx", "rolled-back"), t2)
        t2.rollback()
        t3 = p.begin_transaction()
        p.send(message("P5Tx", "checked"), t3)
        # t3 stays open: the broker asks this producer, whose checker commits.
        got = receive_n(c, 2, 10)
        bodies = sorted(m.body.decode() for m in got)
        for m in got:
            c.ack(m)
        check(bodies == ["checked", "committed"], f"committed and checked-back transactions: {bodies}")
        check(checker.checks >= 1, f"the broker checked back ({checker.checks} checks)")
        check(c.receive(16, 2) == [], "the rolled-back message is never delivered")
    finally:
        c.shutdown()
        p.shutdown()


def sql92():
    p = Producer(config(), ("P5Sql",))
    p.startup()
    c = consumer("py-sql", "P5Sql", FilterExpression("amount > 5 AND origin = 'py'", FilterType.SQL))
    try:
        for i in range(10):
            p.send(message("P5Sql", f"a{i}", props={"amount": str(i), "origin": "py"}))
        got = receive_n(c, 4, 10)
        bodies = sorted(m.body.decode() for m in got)
        for m in got:
            c.ack(m)
        check(bodies == ["a6", "a7", "a8", "a9"], f"SQL92 filter: exactly the matching messages {bodies}")
    finally:
        c.shutdown()
        p.shutdown()


def main():
    started = time.time()
    normal_and_simple_consumer()
    fifo_and_delay()
    transactions()
    sql92()
    print(f"python gRPC client: all checks passed in {time.time() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
