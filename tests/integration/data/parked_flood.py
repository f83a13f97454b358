"""Parks StreamOutput long polls on a coordinator, as one admin client
holding the cluster token would (issue 28: 960 of them made a training
job fail). Usage: parked_flood.py HOST PORT TOKEN_FILE JOB CONNS PER_CONN SECS

Opens CONNS connections and keeps PER_CONN StreamOutput calls for JOB
outstanding on each for SECS seconds (a call that returns is sent again).
Prints "parked P busy B other O": replies that ended a parked call,
refusals with KOLO_EBUSY, anything else."""
import hashlib
import hmac
import os
import select
import socket
import struct
import sys
import time

host, port, token_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
job, conns_n, per_conn, secs = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7])
token = open(token_file).read().strip().encode()
EBUSY = 13
METHOD = b"AdminService.StreamOutput"
IDENT = b"parked-flood"


def varint(v):
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


BODY = b"\x08" + varint(job) + b"\x10" + varint(1 << 40) + b"\x18" + varint(5000)


def frame():
    head = bytearray(96)
    head[0:4] = b"KOLO"
    struct.pack_into(">HBB", head, 4, 1, 1, 1)  # version, request, MAC
    struct.pack_into(">Q", head, 40, int(time.time() * 1000))
    head[48:64] = os.urandom(16)
    struct.pack_into(">HHI", head, 88, len(METHOD), len(IDENT), len(BODY))
    data = bytes(head) + METHOD + IDENT + BODY
    mac = hmac.new(token, data, hashlib.sha256).digest()  # MAC field is zero here
    return data[:8] + mac + data[40:]


class Conn:
    def __init__(self):
        self.s = socket.create_connection((host, port), timeout=5)
        self.s.sendall(b"\x00SP\x00\x00\x30\x00\x00")
        self.buf = b""
        self.greeted = False
        self.next_id = 1

    def send_call(self):
        f = frame()
        rid = 0x80000000 | self.next_id
        self.next_id += 1
        try:
            self.s.sendall(struct.pack(">QI", len(f) + 4, rid) + f)
        except OSError:
            pass  # the server closed it: the read side notices

    def replies(self):
        data = self.s.recv(1 << 16)
        if not data:
            raise OSError("closed")
        self.buf += data
        if not self.greeted and len(self.buf) >= 8:
            self.buf = self.buf[8:]
            self.greeted = True
        out = []
        while self.greeted and len(self.buf) >= 8:
            (n,) = struct.unpack(">Q", self.buf[:8])
            if len(self.buf) < 8 + n:
                break
            msg = self.buf[8 + 4 : 8 + n]
            self.buf = self.buf[8 + n :]
            out.append(struct.unpack(">i", msg[84:88])[0] if len(msg) >= 96 else -1)
        return out


conns = [Conn() for _ in range(conns_n)]
for c in conns:
    for _ in range(per_conn):
        c.send_call()
parked = busy = other = 0
end = time.time() + secs
socks = {c.s: c for c in conns}
while time.time() < end and socks:
    r, _, _ = select.select(list(socks), [], [], 0.2)
    for s in r:
        c = socks[s]
        try:
            codes = c.replies()
        except OSError:
            del socks[s]
            continue
        for code in codes:
            if code == 0:
                parked += 1
            elif code == EBUSY:
                busy += 1
            else:
                other += 1
            if code != EBUSY:
                c.send_call()  # keep the pressure on
            elif busy % 50 == 0:
                time.sleep(0.01)
            if code == EBUSY:
                c.send_call()
print("parked %d busy %d other %d" % (parked, busy, other), flush=True)
