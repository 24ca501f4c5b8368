"""Apache RocketMQ's official C++ client (PyPI `rocketmq` 0.4.4) with ACL session credentials
against a Shoal broker with ACL on: a producer and a push consumer with valid credentials send
and receive; a producer without credentials, and one with a wrong secret, are refused.

Usage: python cpp_acl.py NAMESRV_ADDR ACCESS_KEY SECRET_KEY
Exit code 0 when all of that holds, 1 otherwise.
"""
import sys
import threading
import time

from rocketmq.client import Message, Producer, PushConsumer

NS, AK, SK = sys.argv[1], sys.argv[2], sys.argv[3]
TOPIC = "AclTopic"
N = 10


def producer(group, credentials):
    p = Producer(group)
    p.set_namesrv_addr(NS)
    if credentials is not None:
        p.set_session_credentials(credentials[0], credentials[1], "ALIYUN")
    p.start()
    return p


def try_send(p, body):
    m = Message(TOPIC)
    m.set_body(body)
    try:
        r = p.send_sync(m)
        return int(r.status) == 0
    except Exception as e:  # the C++ client raises on a refused send
        print("refused as expected: %s" % str(e).splitlines()[0][:160])
        return False


def main():
    ok = True
    good = producer("CPP_ACL_PG", (AK, SK))
    for i in range(N):
        if not try_send(good, "acl-%d" % i):
            print("send %d with valid credentials failed" % i)
            ok = False
    good.shutdown()

    for name, creds in (("no credentials", None), ("a wrong secret", (AK, SK + "x"))):
        p = producer("CPP_ACL_BAD_%d" % (creds is None), creds)
        if try_send(p, "must-not-arrive"):
            print("a send with %s was accepted" % name)
            ok = False
        p.shutdown()

    got = []
    lock = threading.Lock()

    def on_message(msg):
        with lock:
            got.append(msg.body.decode() if isinstance(msg.body, bytes) else msg.body)

    c = PushConsumer("CPP_ACL_CG")
    c.set_namesrv_addr(NS)
    c.set_session_credentials(AK, SK, "ALIYUN")
    c.subscribe(TOPIC, on_message, "*")
    c.start()
    deadline = time.time() + 60
    while time.time() < deadline:
        with lock:
            if len(set(got)) >= N:
                break
        time.sleep(0.1)
    c.shutdown()
    want = set("acl-%d" % i for i in range(N))
    if set(got) != want:
        print("consumer with credentials got %s, want %s" % (sorted(set(got)), sorted(want)))
        ok = False
    if "must-not-arrive" in got:
        print("a refused message was stored")
        ok = False
    print("cpp client ACL: %s" % ("PASSED" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
