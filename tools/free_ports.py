#!/usr/bin/env python3
"""Prints N distinct free TCP ports on 127.0.0.1 for test and benchmark scripts.

The ports come from below the system's ephemeral range (net.ipv4.ip_local_port_range): a port
the kernel hands out for ephemeral use (port 0, or the local end of an outgoing connection) can
be taken by any other process between this script and the server's bind, which a busy test run
does often enough to fail a run. Each port is checked by binding it; all stay bound until every
one is chosen, so the N are distinct.

usage: free_ports.py N
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


def main():
    n = int(sys.argv[1])
    high = ephemeral_low() - 1
    low = 10000 if high > 11000 else 1024
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
