"""Holds N connections open to host:port for S seconds, sending nothing
(half-open: issue 15, F5) or, with --greet, nng's 8-byte SP greeting first
(so each becomes a pipe that never sends a request). Prints "held N"."""
import socket
import sys
import time

host, port, n, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
greet = "--greet" in sys.argv
held = []
for i in range(n):
    try:
        s = socket.create_connection((host, port), timeout=5)
        if greet:
            s.sendall(b"\x00SP\x00\x00\x30\x00\x00")  # req0 (protocol 48)
        held.append(s)
    except OSError as e:
        print("connect %d failed: %s" % (i, e), flush=True)
        break
print("held %d" % len(held), flush=True)
time.sleep(secs)
