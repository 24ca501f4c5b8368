"""Apache RocketMQ's official C++ client (librocketmq, bundled by PyPI `rocketmq` 0.4.4)
against a Shoal name server + broker: auto-create on first send, sync sends with keys and tags,
a clustering push consumer with a tag filter, and an orderly consumer.

Usage: python cpp_client.py NAMESRV_ADDR
Exit code 0 when every sent message was consumed, 1 otherwise.
"""
import json
import os
import subprocess
import sys
import threading
import time

from rocketmq.client import Message, Producer, PushConsumer

NS = sys.argv[1]
N = 20


def send_all(topic, tags):
    p = Producer("CPP_PG_" + topic)
    p.set_namesrv_addr(NS)
    p.start()
    sent = []
    for i in range(N):
        m = Message(topic)
        m.set_keys("k%d" % i)
        m.set_tags(tags[i % len(tags)])
        m.set_body("%s-%d" % (topic, i))
        r = p.send_sync(m)
        if int(r.status) != 0:
            raise SystemExit("send %d failed with status %s" % (i, r.status))
        sent.append((tags[i % len(tags)], "%s-%d" % (topic, i)))
    p.shutdown()
    return sent


def consume(topic, group, expression, want, orderly=False):
    got = []
    lock = threading.Lock()

    def on_message(msg):
        with lock:
            got.append(msg.body.decode() if isinstance(msg.body, bytes) else msg.body)

    c = PushConsumer(group, orderly=orderly)
    c.set_namesrv_addr(NS)
    c.subscribe(topic, on_message, expression)
    c.start()
    deadline = time.time() + 60
    while time.time() < deadline:
        with lock:
            if len(set(got)) >= want:
                break
        time.sleep(0.1)
    owners_ok = check_owners(group, topic)
    c.shutdown()
    return got if owners_ok else []


def check_owners(group, topic):
    """`shoal group progress` reads the C++ consumer's running info (its 64-bit fields arrive as
    JSON strings): every queue of the topic has the consumer as its owner."""
    shoal = os.environ.get("SHOAL_BIN")
    if not shoal:
        return True
    out = subprocess.run([shoal, "--namesrv", NS, "--json", "group", "progress", group],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        print("group progress failed:", out.stderr)
        return False
    p = json.loads(out.stdout)
    queues = [q for q in p["queues"] if q["topic"] == topic]
    owners = set(q["owner"] for q in queues)
    print("group progress %s: %d queues, owners %s, unreachable %s"
          % (group, len(queues), sorted(map(str, owners)), p["unreachableMembers"]))
    return bool(queues) and None not in owners and len(owners) == 1 and not p["unreachableMembers"]


def main():
    ok = True
    sent = send_all("CppTopic", ["tagA", "tagB"])
    want = sorted(b for t, b in sent if t == "tagA")
    got = consume("CppTopic", "CPP_CG", "tagA", len(want))
    print("push consumer (tagA): sent %d matching, consumed %d distinct, %d total"
          % (len(want), len(set(got)), len(got)))
    if sorted(set(got)) != want:
        print("MISMATCH: missing %s" % sorted(set(want) - set(got)))
        ok = False
    sent = send_all("CppOrdered", ["x"])
    got = consume("CppOrdered", "CPP_OG", "*", N, orderly=True)
    print("orderly consumer: sent %d, consumed %d distinct" % (len(sent), len(set(got))))
    if len(set(got)) != N:
        ok = False
    print("cpp client compatibility:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
