#!/usr/bin/python3
"""bench/store_abuse.py [--comm-store PATH] [--only NAME ...]

The memory of a TCPStore server (tools/comm-store) under the abusive clients
of issue 21 point 6, one fresh server per client so that each peak is that
client's alone:

  get_repeat     a GET that names one 4 MiB value 64 times (473 bytes that
                 asked for a 256 MiB reply)
  never_reads    a client that sends 1,000 GETs of a 4 MiB value and never
                 reads a reply (4 GB of replies if they were all queued)
  hello_64mib    a hello frame announcing 64 MiB, followed by 64 MiB of bytes
  silent_2000    2,000 connections that never say anything

For each it prints the server's peak resident memory (VmHWM from
/proc/PID/status) once it is ready for the client (started, and for the
first two holding the 4 MiB value) and after the client's abuse, its
resident memory at the end, and whether a well-behaved client was served
correctly while the abuse went on, with how long its set and get took. Memory figures do not
depend on the machine's load; the script's timings are only bounds.
Speaks the TCPStore protocol (version 2, no token) itself, so it needs only
the standard library. Exit status 1 when a well-behaved client was not
served.
"""

import argparse
import os
import pathlib
import resource
import signal
import socket
import struct
import subprocess
import sys
import time

MAGIC = 0x54534D43
VERSION = 2
OP_SET, OP_GET = 1, 2
STATUS_OK, STATUS_ERROR = 0, 1
MIB = 1 << 20


def frame(payload):
    return struct.pack("<Q", len(payload)) + payload


def hello():
    body = bytes([0]) + os.urandom(32)  # no token, a nonce
    return frame(struct.pack("<IHI", MAGIC, VERSION, len(body)) + body)


def message(code, keys=(), values=(), number=0):
    out = bytes([code]) + struct.pack("<I", len(keys))
    for key in keys:
        out += struct.pack("<I", len(key)) + key
    out += struct.pack("<I", len(values))
    for value in values:
        out += struct.pack("<I", len(value)) + value
    return frame(out + struct.pack("<q", number))


def recv_exact(sock, n):
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(min(n - len(data), 1 << 20))
        if not chunk:
            raise ConnectionError("the server closed the connection")
        data += chunk
    return bytes(data)


def recv_frame(sock):
    (length,) = struct.unpack("<Q", recv_exact(sock, 8))
    return recv_exact(sock, length)


def greeted(port, timeout=20.0):
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(hello())
    welcome = recv_frame(sock)
    magic, _, status = struct.unpack("<IHB", welcome[:7])
    if magic != MAGIC or status != STATUS_OK:
        raise RuntimeError(f"the server refused the hello (status {status})")
    return sock


def status_fields(pid):
    fields = {}
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmHWM", "VmRSS"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


class Server:
    def __init__(self, binary):
        self.process = subprocess.Popen(
            [binary, "--host", "127.0.0.1", "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.process.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"comm-store did not start: {line!r}")
        self.port = int(line.strip().rsplit(":", 1)[1])

    def memory(self):
        return status_fields(self.process.pid)

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def served(port):
    """A well-behaved client's set and get, and how long they took."""
    start = time.monotonic()
    with greeted(port) as sock:
        sock.sendall(message(OP_SET, [b"health"], [b"ok"]))
        sock.sendall(message(OP_GET, [b"health"]))
        reply = recv_frame(sock)
    ok = reply[0] == STATUS_OK and reply.find(b"ok") > 0
    return ok, time.monotonic() - start


def set_value(port, key, size):
    with greeted(port) as sock:
        sock.sendall(message(OP_SET, [key], [b"\x5a" * size]))
        sock.sendall(message(OP_GET, [key]))
        recv_frame(sock)  # the get's answer: the set has landed


def get_repeat(port):
    with greeted(port) as sock:
        request = message(OP_GET, [b"big"] * 64)
        sock.sendall(request)
        reply = recv_frame(sock)
        healthy = served(port)
    text = reply.decode("latin-1")
    what = ("refused: " + text[text.find("a get"):text.find("bytes per")]
            if reply[0] == STATUS_ERROR else f"answered ({len(reply)} bytes)")
    return f"request {len(request)} bytes, {what}", healthy


def never_reads(port):
    sock = greeted(port)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    request = message(OP_GET, [b"big"])
    sock.setblocking(False)
    sent = 0
    deadline = time.monotonic() + 10
    # The server stops reading once its queue passes the bound, so the
    # socket fills and the rest cannot be sent: bounded by the deadline.
    while sent < 1000 and time.monotonic() < deadline:
        try:
            sock.sendall(request)
            sent += 1
        except BlockingIOError:
            time.sleep(0.05)
    time.sleep(1)
    healthy = served(port)
    sock.close()
    return (f"{sent:,} GETs of the 4 MiB value sent, no reply read "
            f"({sent * 4:,} MiB of replies asked for)"), healthy


def hello_64mib(port):
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    sock.sendall(struct.pack("<Q", 64 * MIB))
    pushed = 0
    block = b"\xab" * MIB
    try:
        while pushed < 64 * MIB:
            sock.sendall(block)
            pushed += len(block)
    except OSError:
        pass  # closed by the server, as it should be
    healthy = served(port)
    sock.close()
    return (f"closed by the server; {pushed // MIB} MiB of the 64 MiB body "
            f"were sent before"), healthy


def silent_2000(port):
    sockets = [socket.create_connection(("127.0.0.1", port), timeout=20)
               for _ in range(2000)]
    time.sleep(1)
    healthy = served(port)
    for sock in sockets:
        sock.close()
    return "2,000 connections held open", healthy


def store_4mib_value(port):
    set_value(port, b"big", 4 * MIB)


# Each client's set-up, measured before the abuse begins.
PREPARE = {
    "get_repeat": store_4mib_value,
    "never_reads": store_4mib_value,
}

SCENARIOS = {
    "get_repeat": get_repeat,
    "never_reads": never_reads,
    "hello_64mib": hello_64mib,
    "silent_2000": silent_2000,
}


def main():
    here = pathlib.Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[2])
    parser.add_argument("--comm-store", default=str(here / "build/tools/comm-store"))
    parser.add_argument("--only", nargs="*", choices=list(SCENARIOS))
    args = parser.parse_args()
    # 2,000 sockets here and 2,000 in the server: both inherit this limit.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))

    failed = False
    print(f"{'client':<12} {'ready MiB':>9} {'peak MiB':>9} {'end RSS MiB':>12} "
          f"{'served':>7} {'get s':>6}  what happened")
    for name in args.only or SCENARIOS:
        server = Server(args.comm_store)
        try:
            served(server.port)
            PREPARE.get(name, lambda port: None)(server.port)
            ready = server.memory()["VmHWM"]
            what, (ok, seconds) = SCENARIOS[name](server.port)
            time.sleep(0.5)
            memory = server.memory()
        finally:
            server.stop()
        failed |= not ok
        print(f"{name:<12} {ready / MIB:>9.1f} {memory['VmHWM'] / MIB:>9.1f} "
              f"{memory['VmRSS'] / MIB:>12.1f} {'yes' if ok else 'NO':>7} "
              f"{seconds:>6.2f}  {what}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
