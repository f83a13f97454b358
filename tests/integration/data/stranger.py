"""A stranger on a rank's data port (issue 15, F2 and F3): one garbage
connection, one that never speaks, and finding F2's injection (a guessed
hello posing as rank 1, then floats) behind a proof that is not one.
Holds the sockets open until killed."""
import socket
import struct
import sys
import time

host, port, job, gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
held = []
garbage = socket.create_connection((host, port))
garbage.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
held.append(garbage)
held.append(socket.create_connection((host, port)))  # idle
inject = socket.create_connection((host, port))
hello = struct.pack("<IHHIIQQii", 0x584C4F4B, 2, 1, 0, 0, job, gen, 1, 0) + b"\x5a" * 16
inject.sendall(hello + b"\xab" * 32 + struct.pack("<4f", 1000, 1000, 1000, 1000))
held.append(inject)
print("stranger connected 3 times", flush=True)
time.sleep(600)
