#!/usr/bin/env python3
"""What a new connection costs vallumd (#33 item 1), without a process per call: the request
`vallum-iptables -A INPUT -s 192.168.0.1 -j DROP` sends on the local socket (the local-call
magic, then one EditRuleset frame of ruleset `bench`, as vallum_proto::local frames it), CALLS
times on a new connection each, then CALLS times on one kept connection; prints p50 and mean
of each, in microseconds, per round.

Usage: local_conn.py SOCKET [CALLS]   (vallumd serving SOCKET, ruleset `bench` with a chain
INPUT in table filter: cli/benches/dropin.sh runs it after its other cases). Each call appends
a rule, as the drop-in calls do.
"""
import socket
import struct
import sys
import time

# MAGIC "VALLUM/1"; u32 frame length 0x70; u8 path length, the path; u16 authorization length
# 0; the EditRulesetRequest (ruleset "bench", one ipv4 filter command `-A INPUT -s
# 192.168.0.1 -j DROP`, message "iptables -A", durability unset: vallum-iptables's own request).
REQUEST = bytes.fromhex(
    "56414c4c554d2f3100000070252f76616c6c756d2e76312e52756c65736574536572766963652f45646974"
    "52756c657365740000 0a0562656e636812300801120666696c7465721a022d411a05494e5055541a022d73"
    "1a0b3139322e3136382e302e311a022d6a1a0444524f50320b69707461626c6573202d413802".replace(" ", "")
)
MAGIC, FRAME = REQUEST[:8], REQUEST[8:]


def answer(s):
    """Reads one answer frame; fails unless it is OK (status 0)."""
    buf = b""
    while len(buf) < 4:
        buf += s.recv(65536)
    n = struct.unpack(">I", buf[:4])[0]
    while len(buf) < 4 + n:
        buf += s.recv(65536)
    code = struct.unpack(">I", buf[4:8])[0]
    if code != 0:
        sys.exit(f"local_conn.py: the call failed with status {code}: {buf[8:]!r}")


def stats(t):
    t = sorted(t)
    return f"p50 {t[len(t) // 2] * 1e6:.0f} us (mean {sum(t) / len(t) * 1e6:.0f})"


def main():
    path, calls = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 200
    for r in (1, 2):
        new, kept = [], []
        for _ in range(calls):
            t = time.perf_counter()
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(path)
                s.sendall(REQUEST)
                answer(s)
            new.append(time.perf_counter() - t)
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            s.sendall(MAGIC)
            for _ in range(calls):
                t = time.perf_counter()
                s.sendall(FRAME)
                answer(s)
                kept.append(time.perf_counter() - t)
        print(f"local calls, round {r}: a new connection per call {stats(new)}, one connection {stats(kept)}")


main()
