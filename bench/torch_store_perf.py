#!/usr/bin/python3
"""The store_perf workload against torch.distributed.TCPStore.

Run with Debian's /usr/bin/python3 and python3-torch (1.13). Same phases and
table as `store_perf --processes`: every client process issues N calls of
each kind (set, get, add, wait) on keys of its own, all clients start each
phase together, and a phase's rate is C * N over its wall time.

    /usr/bin/python3 bench/torch_store_perf.py [--clients C] [--ops N]
                                               [--value-bytes B]
"""
import argparse
import datetime
import multiprocessing
import os
import socket
import sys
import time

import torch.distributed as dist

PHASES = ("set", "get", "add", "wait")
TIMEOUT = datetime.timedelta(seconds=120)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def client(port, ident, clients, ops, value_bytes, results):
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT,
                          wait_for_workers=False)
    value = b"v" * value_bytes
    prefix = "c%d/" % ident
    latencies = []
    for phase in PHASES:
        gate = "gate/" + phase
        if store.add(gate, 1) == clients:
            store.set(gate + "/open", "1")
        store.wait([gate + "/open"])
        samples = []
        for i in range(ops):
            key = prefix + str(i)
            start = time.perf_counter()
            if phase == "set":
                store.set(key, value)
            elif phase == "get":
                store.get(key)
            elif phase == "add":
                store.add(prefix + "counter", 1)
            else:
                store.wait([key])
            samples.append((time.perf_counter() - start) * 1e6)
        latencies.append(samples)
        done = "done/" + phase
        if store.add(done, 1) == clients:
            store.set(done + "/all", "1")
    results.put((ident, latencies))


def percentile(samples, p):
    samples = sorted(samples)
    return samples[int(p * (len(samples) - 1))] if samples else 0.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--value-bytes", type=int, default=64)
    args = parser.parse_args()

    port = free_port()
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    # Clients first: they retry until the server is up, and forking before
    # the server's thread exists keeps the children clean.
    procs = [context.Process(target=client,
                             args=(port, c, args.clients, args.ops,
                                   args.value_bytes, results))
             for c in range(args.clients)]
    for proc in procs:
        proc.start()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=TIMEOUT,
                           wait_for_workers=False)
    seconds = []
    for phase in PHASES:
        server.wait(["gate/%s/open" % phase])
        start = time.perf_counter()
        server.wait(["done/%s/all" % phase])
        seconds.append(time.perf_counter() - start)
    collected = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    print("# torch %s TCPStore: %d process clients x %d calls per phase, "
          "%d-byte values" % (dist.__name__.split(".")[0] and
                              __import__("torch").__version__,
                              args.clients, args.ops, args.value_bytes))
    print("%-6s %12s %10s %10s" % ("op", "ops/s", "p50_us", "p99_us"))
    for index, phase in enumerate(PHASES):
        samples = [s for _, lat in collected for s in lat[index]]
        rate = args.clients * args.ops / seconds[index]
        print("%-6s %12.0f %10.1f %10.1f" % (phase, rate, percentile(samples, 0.5),
                                             percentile(samples, 0.99)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
