#!/usr/bin/python3
"""Runs store_perf --processes and torch_store_perf.py alternately, several
times, and prints per operation the median rate of each and their ratio.

    bench/store_compare.py [--build build] [--runs 5] [--clients 64] [--ops 2000]

Needs Debian's python3-torch for the torch side.
"""
import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def table(lines):
    rates = {}
    for line in lines.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[0] in ("set", "get", "add", "wait"):
            rates[fields[0]] = float(fields[1])
    return rates


def main():
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--ops", type=int, default=2000)
    args = parser.parse_args()
    workload = ["--clients", str(args.clients), "--ops", str(args.ops)]
    ours_cmd = [os.path.join(args.build, "bench", "store_perf"), "--processes"] + workload
    torch_cmd = ["/usr/bin/python3", os.path.join(HERE, "torch_store_perf.py")] + workload
    ours, torch = [], []
    for run in range(args.runs):
        for command, sink in ((ours_cmd, ours), (torch_cmd, torch)):
            output = subprocess.run(command, check=True, capture_output=True,
                                    text=True, timeout=600).stdout
            sink.append(table(output))
        print("run %d/%d done" % (run + 1, args.runs), file=sys.stderr)
    print("# %d process clients x %d calls per phase, median of %d alternating runs"
          % (args.clients, args.ops, args.runs))
    print("%-6s %14s %14s %12s" % ("op", "libcomm_ops/s", "torch_ops/s", "ratio"))
    for op in ("set", "get", "add", "wait"):
        a = statistics.median(r[op] for r in ours)
        b = statistics.median(r[op] for r in torch)
        print("%-6s %14.0f %14.0f %12.2f" % (op, a, b, a / b))
    return 0


if __name__ == "__main__":
    sys.exit(main())
