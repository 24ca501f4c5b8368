#!/usr/bin/env python3
"""Prints N distinct free TCP ports on 127.0.0.1 for test and benchmark scripts.

The ports come from below the system's ephemeral range (net.ipv4.ip_local_port_range): a port
the kernel hands out for ephemeral use (port 0, or the local end of an outgoing connection) can
be taken by any other process between this script and the server's bind, which a busy test run
does often enough to fail a run. Each port is checked by binding it; all stay bound until every
one is chosen, so the N are distinct.

usage: free_ports.py N
       free_ports.py --block OFFSETS   (e.g. 0,2,10,20,30: prints a base port B such that B+o
                                        is free for every offset o, as `shoal dev --replicas`
                                        needs)
"""
import random
import socket
import sys


def ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def block(offsets, low, high):
    top = high - max(offsets)
    for _ in range(1000):
        base = random.randint(low, top)
        if all(free(base + o) for o in offsets):
            return base
    sys.exit("no free block of ports found")


def main():
    high = ephemeral_low() - 1
    low = 10000 if high > 11000 else 1024
    if sys.argv[1] == "--block":
        print(block([int(o) for o in sys.argv[2].split(",")], low, high))
        return
    n = int(sys.argv[1])
    held = []
    chosen = []
    for _ in range(100 * n + 1000):
        if len(chosen) == n:
            break
        port = random.randint(low, high)
        if port in chosen:
            continue
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        held.append(s)
        chosen.append(port)
    if len(chosen) < n:
        sys.exit("no free ports found")
    print(*chosen)
    for s in held:
        s.close()


if __name__ == "__main__":
    main()
