#!/usr/bin/python3
"""Runs libcomm's all_reduce_perf and the peers of ../shared/peers/ (Gloo
through Debian's python3-torch, Open MPI over TCP) alternately, several
times, and prints per size the median time of each and the ratios
ours/Gloo and ours/Open MPI (below 1: libcomm is faster).

    bench/compare.py [--np 2] [--runs 5] [--build build] [--peers ../shared/peers]
                  [--skip-gloo] [--skip-mpi] [--skip-iperf]

Rounds alternate the order of the programs (ours, Open MPI, Gloo; then
the reverse). Ours runs as the peers do: all sizes in one process, in
ascending order, each with the peers' iteration count (64 MiB / size,
between 3 and 200; all_reduce_perf --iteration-bytes) after 2 warm-up
calls. (Run each in a process of its own, a size is timed just after
start-up, on CPUs that had been idle: 1 KiB took about twice as long as
after a few milliseconds of traffic.) The out-of-place time is compared. Both peers call a blocking all_reduce in a loop, so ours runs
blocking too (-z 1: each call waited before the next is issued). Both
place rank r on CPU r mod n: all_reduce_perf's default --bind-to core,
and mpirun's --bind-to core:overload-allowed (which also binds ranks that
outnumber the CPUs, where mpirun's default leaves them unbound).

It also runs `iperf3 -P NP` on loopback in every round (the TCP ceiling)
and prints, for the largest size, the loopback traffic libcomm's ring moved
per second (2(n-1) x size bytes per all_reduce) as a share of iperf3's.
iperf3 -P NP sends one way: one process only sends, the other only
receives, while a ring rank does both. So it also prints the share of
`iperf3 --bidir -P NP/2`, whose two processes each send and receive.

Installs what the peers need when it is missing (tools/install_packages):
python3-torch for Gloo, libopenmpi-dev and openmpi-bin for MPI (the MPI
peer is compiled into the build directory on first use), iperf3.
"""
import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


SIZES = [1024 << (2 * i) for i in range(9)]  # 1 KiB to 64 MiB, as the peers


def table(output, time_column):
    """bytes -> time_us from a table whose rows start with the size."""
    times = {}
    for line in output.splitlines():
        fields = line.split()
        if len(fields) > time_column and fields[0].isdigit():
            times[int(fields[0])] = float(fields[time_column])
    return times


def run(command, time_column=1):
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        sys.exit("%s failed:\n%s%s" % (" ".join(command), result.stdout, result.stderr))
    return table(result.stdout, time_column)


def run_ours(binary, ranks):
    """Our all_reduce_perf over all sizes in one process, as each peer runs,
    with the peers' iteration count per size (--iteration-bytes); the
    out-of-place time (column 5) of the nccl-tests table."""
    return run([binary, "-np", str(ranks), "-b", str(SIZES[0]), "-e", str(SIZES[-1]),
                "-f", "4", "-n", "200", "--iteration-bytes", str(64 << 20),
                "-w", "2", "-c", "0", "-z", "1"],
               time_column=5)


def iperf(streams, bidir=False):
    """Loopback bytes/s of iperf3 with `streams` parallel streams, 3 s; with
    `bidir`, the streams run both ways and their sum is returned."""
    import json
    import socket
    import time
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(["iperf3", "-s", "-1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):  # bounded: up to 5 s for the server to listen
            time.sleep(0.1)
            result = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", str(port),
                                     "-P", str(streams), "-t", "3", "-J"]
                                    + (["--bidir"] if bidir else []),
                                    capture_output=True, text=True, timeout=60)
            if result.returncode == 0:
                end = json.loads(result.stdout)["end"]
                received = end["sum_received"]["bits_per_second"]
                if bidir:
                    received += end["sum_received_bidir_reverse"]["bits_per_second"]
                return received / 8
        sys.exit("iperf3 did not run: " + result.stderr)
    finally:
        server.kill()
        server.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    parser.add_argument("--peers", default=os.path.join(HERE, "..", "..", "shared", "peers"))
    parser.add_argument("--skip-gloo", action="store_true")
    parser.add_argument("--skip-mpi", action="store_true")
    parser.add_argument("--skip-iperf", action="store_true")
    args = parser.parse_args()

    ours = os.path.join(args.build, "bench", "all_reduce_perf")
    if not os.path.exists(ours):
        sys.exit("%s is missing; build it first: tools/setup && ninja -C build" % ours)
    needed = ((["openmpi-bin", "libopenmpi-dev"] if not args.skip_mpi else [])
              + (["python3-torch"] if not args.skip_gloo else [])
              + (["iperf3"] if not args.skip_iperf else []))
    if needed:
        installer = os.path.join(HERE, "..", "tools", "install_packages")
        if subprocess.run([installer] + needed).returncode != 0:
            sys.exit("bench/compare.py: the peers need " + " ".join(needed))
    commands = {"libcomm": None}
    if not args.skip_mpi:
        mpi_binary = os.path.join(args.build, "bench", "mpi_allreduce_peer")
        if not os.path.exists(mpi_binary):
            subprocess.run(["mpicc", "-O2", os.path.join(args.peers, "mpi_allreduce.c"),
                            "-o", mpi_binary], check=True)
        commands["mpi_tcp"] = ["mpirun", "--allow-run-as-root", "--oversubscribe",
                               "--bind-to", "core:overload-allowed",
                               "-np", str(args.np), "--mca", "btl", "tcp,self",
                               "--mca", "btl_tcp_if_include", "lo", mpi_binary]
    if not args.skip_gloo:
        commands["gloo"] = ["/usr/bin/python3", os.path.join(args.peers, "gloo_allreduce.py"),
                            str(args.np)]
    samples = {name: [] for name in commands}
    ceilings = []
    bidir_ceilings = []
    for r in range(args.runs):
        # Odd rounds run the programs in the opposite order, so that none
        # is always the one that follows iperf3 or another program.
        order = list(commands.items())
        for name, command in order if r % 2 == 0 else reversed(order):
            samples[name].append(run_ours(ours, args.np) if command is None else run(command))
        if not args.skip_iperf:
            ceilings.append(iperf(args.np))
            bidir_ceilings.append(iperf(max(1, args.np // 2), bidir=True))
        print("run %d/%d done" % (r + 1, args.runs), file=sys.stderr)

    sizes = sorted(set.intersection(*(set(s[0]) for s in samples.values())))
    medians = {name: {size: statistics.median(run[size] for run in runs) for size in sizes}
               for name, runs in samples.items()}
    names = list(commands)
    print("# all_reduce float32 sum, world=%d, median time_us of %d alternating runs"
          % (args.np, args.runs))
    header = "%10s" % "bytes" + "".join("%12s" % n for n in names)
    header += "".join("%14s" % ("ours/" + n) for n in names[1:])
    print(header)
    for size in sizes:
        line = "%10d" % size + "".join("%12.1f" % medians[n][size] for n in names)
        line += "".join("%14.2f" % (medians["libcomm"][size] / medians[n][size])
                        for n in names[1:])
        print(line)
    if ceilings:
        largest = sizes[-1]
        moved = 2 * (args.np - 1) * largest / (medians["libcomm"][largest] / 1e6)
        ceiling = statistics.median(ceilings)
        print("# %d bytes: libcomm's ring moved %.2f GB/s over loopback; iperf3 -P %d: "
              "%.2f GB/s; ratio %.2f" % (largest, moved / 1e9, args.np, ceiling / 1e9,
                                         moved / ceiling))
        bidir = statistics.median(bidir_ceilings)
        print("# iperf3 --bidir -P %d (each process sends and receives, as a ring rank "
              "does): %.2f GB/s; ratio %.2f" % (max(1, args.np // 2), bidir / 1e9,
                                                moved / bidir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
