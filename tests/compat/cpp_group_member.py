"""One member of a consumer group run by Apache RocketMQ's official C++ client (PyPI
`rocketmq` 0.4.4): a clustering push consumer that prints every message body on its own line
and shuts down cleanly (unregistering from the broker) when its standard input closes.

Usage: python cpp_group_member.py NAMESRV_ADDR GROUP TOPIC
"""
import sys

from rocketmq.client import PushConsumer


def main():
    ns, group, topic = sys.argv[1], sys.argv[2], sys.argv[3]

    def on_message(msg):
        body = msg.body.decode() if isinstance(msg.body, bytes) else msg.body
        sys.stdout.write(body + "\n")
        sys.stdout.flush()

    c = PushConsumer(group)
    c.set_namesrv_addr(ns)
    c.subscribe(topic, on_message, "*")
    c.start()
    sys.stdout.write("STARTED\n")
    sys.stdout.flush()
    sys.stdin.read()
    c.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
