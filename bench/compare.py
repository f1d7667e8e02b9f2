#!/usr/bin/python3
"""Runs libcomm's *_perf binaries and its peers alternately, several rounds,
and prints per collective and size the median time of each program and the
ratio of ours to each peer (below 1: libcomm is faster), with the range of
that ratio over the rounds.

    bench/compare.py [--np 2] [--runs 5] [--collectives all_reduce,broadcast]
                     [--ours-tcp] [--ours-shared] [--skip-gloo] [--skip-mpi-default]
                     [--skip-mpi-tcp] [--skip-iperf] [--fresh-inputs]
                     [--two-hosts] [--build build]

The programs, each timing every selected collective over 1 KiB to 64 MiB
(x4), float32, sum where it reduces, root 0:
- libcomm: build/bench/<collective>_perf with the default transport;
- libcomm-tcp (--ours-tcp): the same with COMM_TRANSPORT=tcp, libcomm's
  own TCP path, for the shared-memory transport's speed-up in the same run,
  and, in the column tcp/mpi-tcp, against Open MPI forced onto TCP;
- libcomm-shared (--ours-shared): the same with -R 1, its buffers in shared
  host memory (Tensor::shared_host_zeros), which the ranks of one host read
  directly, as nccl-tests' -R registers them; in the column
  shared/mpi-default, against Open MPI with its default transports;
- mpi-default: Open MPI as a user runs it (`mpirun -np N`, its default
  transports: shared memory between ranks of one host), bench/peers/
  mpi_collectives.c;
- mpi-tcp: the same forced onto TCP over loopback (--mca btl tcp,self);
- gloo: torch.distributed's gloo backend (Debian's python3-torch),
  bench/peers/gloo_collectives.py; torch 1.13's gloo has no reduce_scatter.

Every program runs as the others do: all sizes of a collective in one
process, in ascending order, 64 MiB / size timed iterations (3 to 20000)
after 2 warm-up calls, blocking (each call waits before the next is
issued), the time being the slowest rank's mean per call (all_reduce_perf
-z 1 -a 3). The small sizes get up to 20000 calls so that each is timed
over tens of milliseconds: 200 calls of 1 KiB last a third of a
millisecond, which times a process's first moments and single scheduler
hiccups more than the call. libcomm's time is its out-of-place column, except for
broadcast and reduce, whose libcomm calls work in place (as
torch.distributed's do): their out-of-place *_perf copies the input into
the output on every rank before each call, which no peer does (MPI_Bcast
has one buffer; MPI_Reduce reads its send buffer and leaves it as it
was), so their in-place column is the like for like. Sizes count as nccl-tests counts
them: one rank's buffer for all_reduce, broadcast and reduce, the whole
buffer of n blocks for the others. Ranks are bound as all_reduce_perf binds them by
default (rank r on CPU r mod n) and as mpirun --bind-to
core:overload-allowed does.

By default every program reuses the same inputs from one call to the
next, as nccl-tests does, so that a rank may find what it read of a peer's
input in its own cache at the next call. With --fresh-inputs, libcomm and
the MPI peers store to every cache line of each rank's inputs before each
call and then meet in a barrier, both outside the call's time, as a
training step writes the gradients it then reduces and its ranks come to
the collective together (the Gloo peer cannot: add --skip-gloo).

Rounds rotate the order of the programs, so that none always runs first or
after the same neighbour: this machine's speed drifts from minute to
minute, which only alternation and several rounds average out.

For all_reduce it also runs `iperf3` on loopback each round (the TCP
ceiling) and prints, for the largest size, the loopback traffic libcomm's
ring would move per second as a share of it (with --ours-tcp, the TCP
path's).

With --two-hosts the ranks stand on two hosts: the first half of them in
one network namespace and the second half in another, joined by a veth
pair, both made for the run and removed after it (root and iproute2 are
needed; --np must be even). libcomm then uses shared memory inside each
namespace and TCP between them (its hierarchical algorithms), and
libcomm-tcp TCP throughout. Open MPI runs as a job of two nodes: mpirun
in the first namespace, and its daemon for the second started there
through a launch agent in place of ssh (in a UTS namespace of its own,
so that the two nodes have different host names). mpi-default is then
shared memory inside each node and TCP between, and mpi-tcp TCP
throughout, both over the veth addresses. Both hosts share this
machine's CPUs: rank r runs on CPU r mod their number, in both libraries
(Open MPI's through a rankfile). iperf3 runs between the two namespaces,
and its figure is printed alone: not every byte of a collective crosses
that link. The Gloo peer does not run (add --skip-gloo).

Installs what the peers need when it is missing (tools/install_packages):
openmpi-bin and libopenmpi-dev (the MPI peer is compiled into the build
directory on first use), python3-torch for Gloo, iperf3, and iproute2
for --two-hosts.
"""
import argparse
import contextlib
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
COLLECTIVES = ["all_reduce", "all_gather", "broadcast", "reduce", "reduce_scatter",
               "alltoall", "gather", "scatter"]
SIZES = [1024 << (2 * i) for i in range(9)]  # 1 KiB to 64 MiB
# The store ports of --two-hosts runs, a new one for each run, in namespaces
# made for this process.
STORE_PORTS = itertools.count(29400)


def run(command, env=None):
    """Runs a program and returns its output, or exits naming the failure."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800,
                            env=env)
    if result.returncode != 0:
        sys.exit("%s failed (exit %d):\n%s%s" % (" ".join(command), result.returncode,
                                                 result.stdout, result.stderr))
    return result.stdout


def peer_rows(output):
    """{(collective, bytes): time_us} from a peer's "collective bytes time_us"
    lines."""
    times = {}
    for line in output.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[0] in COLLECTIVES and fields[1].isdigit():
            times[(fields[0], int(fields[1]))] = float(fields[2])
    return times


# Collectives whose peers all run in place: libcomm's in-place time is
# compared with theirs.
IN_PLACE = {"broadcast", "reduce"}


class TwoHosts:
    """Two network namespaces joined by a veth pair, standing for two hosts:
    address(0) in the first, address(1) in the second, each with its
    loopback up. Made on entering, removed on leaving, whatever happened in
    between."""

    def __init__(self, ranks):
        self.ranks = ranks
        self.cpus = sorted(os.sched_getaffinity(0))
        tag = "%d" % (os.getpid() % 100000)
        self.names = ["lcbench-%s-a" % tag, "lcbench-%s-b" % tag]
        self.links = ["lcb%sa" % tag, "lcb%sb" % tag]  # at most 15 characters
        self.made = []
        self.agent_dir = None

    @staticmethod
    def address(host):
        return "10.214.0.%d" % (host + 1)

    def host_of(self, rank):
        """The first half of the ranks on host 0, the rest on host 1."""
        return rank // (self.ranks // 2)

    def cpu_of(self, rank):
        """Rank r on CPU r mod the CPUs, as -np binds libcomm's ranks."""
        return self.cpus[rank % len(self.cpus)]

    def exec_prefix(self, host):
        return ["ip", "netns", "exec", self.names[host]]

    def __enter__(self):
        if os.geteuid() != 0:
            sys.exit("bench/compare.py: --two-hosts makes network namespaces, "
                     "which needs root")
        steps = [["ip", "netns", "add", self.names[0]],
                 ["ip", "netns", "add", self.names[1]],
                 ["ip", "link", "add", self.links[0], "netns", self.names[0], "type",
                  "veth", "peer", "name", self.links[1], "netns", self.names[1]]]
        for host in range(2):
            steps += [["ip", "-n", self.names[host], "addr", "add",
                       self.address(host) + "/24", "dev", self.links[host]],
                      ["ip", "-n", self.names[host], "link", "set", self.links[host], "up"],
                      ["ip", "-n", self.names[host], "link", "set", "lo", "up"]]
        try:
            for step in steps:
                result = subprocess.run(step, capture_output=True, text=True, timeout=30)
                if result.returncode != 0:
                    sys.exit("bench/compare.py: '%s' failed (iproute2 and root are "
                             "needed): %s" % (" ".join(step), result.stderr.strip()))
                if step[:3] == ["ip", "netns", "add"]:
                    self.made.append(step[3])
            # Open MPI starts the daemon of the second node through this
            # agent instead of ssh: `agent HOST COMMAND...`, COMMAND being a
            # shell command line.
            self.agent_dir = tempfile.mkdtemp(prefix="lcbench-")
            self.agent = os.path.join(self.agent_dir, "netns-agent")
            with open(self.agent, "w") as f:
                f.write("#!/bin/sh\nshift\nexec ip netns exec %s unshare --uts "
                        "sh -c 'hostname %s && exec sh -c \"$0\"' \"$*\"\n"
                        % (self.names[1], self.names[1]))
            os.chmod(self.agent, 0o755)
            # Open MPI's ranks bound as libcomm's: rank r on CPU r mod the
            # CPUs (the operating system's numbers: rmaps_rank_file_physical),
            # each host's ranks on it. Binding by each node's own count would
            # put rank 0 of both hosts on the first CPU.
            self.rankfile = os.path.join(self.agent_dir, "rankfile")
            with open(self.rankfile, "w") as f:
                for rank in range(self.ranks):
                    f.write("rank %d=%s slot=%d\n"
                            % (rank, self.address(self.host_of(rank)), self.cpu_of(rank)))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        # A second SIGTERM must not cut the clean-up short.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        # Removing a namespace removes its end of the veth pair, and so both.
        for name in self.made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        self.made = []
        if self.agent_dir:
            for entry in os.listdir(self.agent_dir):
                os.unlink(os.path.join(self.agent_dir, entry))
            os.rmdir(self.agent_dir)
            self.agent_dir = None
        return False


def perf_arguments(fresh_inputs, shared=False):
    """What every *_perf run gets, after -np or without it."""
    return (["-b", str(SIZES[0]), "-e", str(SIZES[-1]), "-f", "4", "-n", "20000",
             "--iteration-bytes", str(64 << 20), "-w", "2", "-c", "0", "-z", "1",
             "-a", "3"] + (["--fresh-inputs"] if fresh_inputs else [])
            + (["-R", "1"] if shared else []))


def run_across(hosts, command, env, port):
    """Starts the ranks of `command`, the first half in the first
    namespace of `hosts` and the rest in the second, rank r on CPU r mod the
    CPUs (as -np binds them, and the MPI job's rankfile), meeting at a store
    on the first host's address; returns rank 0's output, or exits naming
    the rank that failed. Each rank writes to files of its own, so that none
    waits on a pipe that nobody reads."""
    processes = []
    with contextlib.ExitStack() as files:
        try:
            for rank in range(hosts.ranks):
                rank_env = dict(env, RANK=str(rank), WORLD_SIZE=str(hosts.ranks),
                                MASTER_ADDR=hosts.address(0), MASTER_PORT=str(port))
                out = files.enter_context(tempfile.TemporaryFile("w+"))
                err = files.enter_context(tempfile.TemporaryFile("w+"))
                processes.append((subprocess.Popen(
                    hosts.exec_prefix(hosts.host_of(rank))
                    + ["taskset", "-c", str(hosts.cpu_of(rank))] + command,
                    env=rank_env, stdout=out, stderr=err), out, err))
            deadline = time.monotonic() + 1800
            for p, _, _ in processes:
                try:
                    p.wait(timeout=max(1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    running = [r for r, (q, _, _) in enumerate(processes)
                               if q.poll() is None]
                    sys.exit("%s: ranks %s still ran after 1800 s"
                             % (" ".join(command), running))
        finally:
            for p, _, _ in processes:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        outputs = []
        for rank, (p, out, err) in enumerate(processes):
            out.seek(0)
            err.seek(0)
            outputs.append(out.read())
            if p.returncode != 0:
                sys.exit("rank %d of %s failed (exit %d):\n%s%s"
                         % (rank, " ".join(command), p.returncode, outputs[-1],
                            err.read()))
    return outputs[0]


def run_ours(build, ranks, collectives, transport, fresh_inputs, hosts=None,
             shared=False):
    """Each collective's *_perf over all sizes; the out-of-place time
    (column 5) of the nccl-tests table, or the in-place one (column 9) for
    the collectives in IN_PLACE. With `hosts` (TwoHosts), the ranks are
    split between its namespaces; with `shared`, the buffers are shared
    host memory (-R 1)."""
    env = dict(os.environ)
    if transport:
        env["COMM_TRANSPORT"] = transport
    times = {}
    for name in collectives:
        binary = os.path.join(build, "bench", name + "_perf")
        if hosts:
            output = run_across(hosts, [binary] + perf_arguments(fresh_inputs, shared),
                                env, next(STORE_PORTS))
        else:
            output = run([binary, "-np", str(ranks)]
                         + perf_arguments(fresh_inputs, shared), env=env)
        column = 9 if name in IN_PLACE else 5
        for line in output.splitlines():
            fields = line.split()
            if len(fields) > column and fields[0].isdigit():
                times[(name, int(fields[0]))] = float(fields[column])
    return times


def iperf(streams, hosts=None):
    """Loopback bytes/s of `iperf3 --bidir -P streams` for 3 s: each of its
    two processes sends and receives, as a ring rank does. With `hosts`
    (TwoHosts), between its two namespaces instead."""
    if hosts:
        port, address = 5201, hosts.address(0)
        server_prefix, client_prefix = hosts.exec_prefix(0), hosts.exec_prefix(1)
    else:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        address, server_prefix, client_prefix = "127.0.0.1", [], []
    server = subprocess.Popen(server_prefix + ["iperf3", "-s", "-1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):  # bounded: up to 5 s for the server to listen
            time.sleep(0.1)
            result = subprocess.run(client_prefix
                                    + ["iperf3", "-c", address, "-p", str(port),
                                       "-P", str(streams), "-t", "3", "-J", "--bidir"],
                                    capture_output=True, text=True, timeout=60)
            if result.returncode == 0:
                end = json.loads(result.stdout)["end"]
                return (end["sum_received"]["bits_per_second"]
                        + end["sum_received_bidir_reverse"]["bits_per_second"]) / 8
        sys.exit("iperf3 did not run: " + result.stderr)
    finally:
        server.kill()
        server.wait()


def programs(args, collectives, hosts):
    """name -> a function that runs one round of that program."""
    table = {"libcomm": lambda: run_ours(args.build, args.np, collectives, None,
                                         args.fresh_inputs, hosts)}
    if args.ours_tcp:
        table["libcomm-tcp"] = lambda: run_ours(args.build, args.np, collectives, "tcp",
                                                args.fresh_inputs, hosts)
    if args.ours_shared:
        table["libcomm-shared"] = lambda: run_ours(args.build, args.np, collectives,
                                                   None, args.fresh_inputs, hosts,
                                                   shared=True)
    mpi = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(args.np)]
    interfaces = "lo"
    if not hosts:
        mpi += ["--bind-to", "core:overload-allowed"]
    else:
        # Two nodes of np/2 slots, the second one's daemon started in the
        # second namespace by the agent; TCP between them over the veth pair.
        interfaces = "10.214.0.0/24"
        mpi = (hosts.exec_prefix(0) + mpi
               + ["--host", "%s:%d,%s:%d" % (hosts.address(0), args.np // 2,
                                             hosts.address(1), args.np // 2),
                  "--rankfile", hosts.rankfile, "--mca", "rmaps_rank_file_physical", "1",
                  "--mca", "plm_rsh_agent", hosts.agent,
                  "--mca", "oob_tcp_if_include", interfaces])
        if args.np > len(hosts.cpus):
            # Open MPI yields in its waits where it sees more ranks than
            # slots on a node; each node here sees only its own half, while
            # both halves share this machine's CPUs. Without it, ranks that
            # share a CPU each spin through a whole time slice.
            mpi += ["--mca", "mpi_yield_when_idle", "1"]
    peer = [os.path.join(args.build, "bench", "mpi_collectives_peer")]
    if args.fresh_inputs:
        peer.append("--fresh-inputs")
    if not args.skip_mpi_default:
        default = ["--mca", "btl_tcp_if_include", interfaces] if hosts else []
        table["mpi-default"] = lambda: peer_rows(run(mpi + default + peer + collectives))
    if not args.skip_mpi_tcp:
        tcp = ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", interfaces]
        table["mpi-tcp"] = lambda: peer_rows(run(mpi + tcp + peer + collectives))
    if not args.skip_gloo:
        gloo = ["/usr/bin/python3", os.path.join(HERE, "peers", "gloo_collectives.py"),
                str(args.np)] + collectives
        table["gloo"] = lambda: peer_rows(run(gloo))
    return table


def install_peers(args):
    needed = []
    if not (args.skip_mpi_default and args.skip_mpi_tcp):
        needed += ["openmpi-bin", "libopenmpi-dev"]
    if not args.skip_gloo:
        needed += ["python3-torch"]
    if not args.skip_iperf:
        needed += ["iperf3"]
    if args.two_hosts:
        needed += ["iproute2"]  # ip netns, ip link
    if needed:
        installer = os.path.join(HERE, "..", "tools", "install_packages")
        if subprocess.run([installer] + needed).returncode != 0:
            sys.exit("bench/compare.py: the peers need " + " ".join(needed))
    if "openmpi-bin" in needed:
        peer = os.path.join(args.build, "bench", "mpi_collectives_peer")
        source = os.path.join(HERE, "peers", "mpi_collectives.c")
        if (not os.path.exists(peer)
                or os.path.getmtime(peer) < os.path.getmtime(source)):
            subprocess.run(["mpicc", "-O2", source, "-o", peer], check=True)


def ratio_text(ours, theirs):
    """"median (min-max)" of the per-round ratios ours/theirs."""
    ratios = [a / b for a, b in zip(ours, theirs) if b > 0]
    if not ratios:
        return "-"
    return "%.2f (%.2f-%.2f)" % (statistics.median(ratios), min(ratios), max(ratios))


def main():
    # A SIGTERM (timeout(1), say) unwinds like an exit, so that --two-hosts
    # removes its namespaces.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--collectives", default=",".join(COLLECTIVES),
                        help="comma-separated, from: " + " ".join(COLLECTIVES))
    parser.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    parser.add_argument("--ours-tcp", action="store_true",
                        help="also run libcomm with COMM_TRANSPORT=tcp")
    parser.add_argument("--ours-shared", action="store_true",
                        help="also run libcomm with its buffers in shared host "
                        "memory (-R 1)")
    parser.add_argument("--skip-gloo", action="store_true")
    parser.add_argument("--skip-mpi-default", action="store_true")
    parser.add_argument("--skip-mpi-tcp", action="store_true")
    parser.add_argument("--skip-iperf", action="store_true")
    parser.add_argument("--fresh-inputs", action="store_true",
                        help="rewrite every rank's inputs before each call, untimed "
                        "(libcomm and Open MPI; needs --skip-gloo)")
    parser.add_argument("--two-hosts", action="store_true",
                        help="split the ranks between two network namespaces made "
                        "for the run (root; an even --np; needs --skip-gloo)")
    args = parser.parse_args()
    if args.runs < 1 or args.np < 1:
        sys.exit("bench/compare.py: --runs and --np must be at least 1")
    if args.fresh_inputs and not args.skip_gloo:
        sys.exit("bench/compare.py: the Gloo peer cannot rewrite its inputs between "
                 "calls; add --skip-gloo to --fresh-inputs")
    if args.two_hosts and (args.np < 2 or args.np % 2 != 0):
        sys.exit("bench/compare.py: --two-hosts puts half the ranks on each host; "
                 "give an even --np of 2 or more")
    if args.two_hosts and not args.skip_gloo:
        sys.exit("bench/compare.py: the Gloo peer starts its ranks itself on one "
                 "host; add --skip-gloo to --two-hosts")

    collectives = [c for c in args.collectives.split(",") if c]
    unknown = [c for c in collectives if c not in COLLECTIVES]
    if unknown or not collectives:
        sys.exit("bench/compare.py: unknown collective %s; choose from %s"
                 % (", ".join(unknown) or "(none given)", ",".join(COLLECTIVES)))
    for name in collectives:
        binary = os.path.join(args.build, "bench", name + "_perf")
        if not os.path.exists(binary):
            sys.exit("%s is missing; build it first: tools/setup && ninja -C build" % binary)
    install_peers(args)

    with TwoHosts(args.np) if args.two_hosts else contextlib.nullcontext() as hosts:
        table = programs(args, collectives, hosts)
        names = list(table)
        samples = {name: [] for name in names}
        ceilings = []
        with_iperf = not args.skip_iperf and "all_reduce" in collectives
        for r in range(args.runs):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                samples[name].append(table[name]())
            if with_iperf:
                ceilings.append(iperf(max(1, args.np // 2), hosts))
            print("round %d/%d done (order: %s)" % (r + 1, args.runs, ", ".join(order)),
                  file=sys.stderr)

    peers = [n for n in names if n != "libcomm"]
    # libcomm's TCP path against Open MPI's, both forced onto TCP.
    tcp_pair = "libcomm-tcp" in names and "mpi-tcp" in names
    # libcomm with shared host memory against Open MPI as a user runs it.
    shared_pair = "libcomm-shared" in names and "mpi-default" in names
    print("# float32, world=%d, median time_us of %d rounds in rotating order; ratio = "
          "libcomm / peer, median (min-max) over the rounds" % (args.np, args.runs)
          + ("; inputs rewritten before each call" if args.fresh_inputs else "")
          + ("; ranks on two hosts (network namespaces), %d each" % (args.np // 2)
             if args.two_hosts else "")
          + ("; tcp/mpi-tcp = libcomm-tcp / mpi-tcp" if tcp_pair else "")
          + ("; shared/mpi-default = libcomm-shared / mpi-default"
             if shared_pair else ""))
    for collective in collectives:
        print("\n## %s%s" % (collective, " (libcomm's in-place column)"
                               if collective in IN_PLACE else ""))
        print("%10s" % "bytes" + "".join("%16s" % n for n in names)
              + "".join(" %23s" % ("/" + n) for n in peers)
              + (" %23s" % "tcp/mpi-tcp" if tcp_pair else "")
              + (" %23s" % "shared/mpi-default" if shared_pair else ""))
        for size in SIZES:
            key = (collective, size)
            series = {n: [s.get(key) for s in samples[n]] for n in names}
            if any(v is None for v in series["libcomm"]):
                continue
            line = "%10d" % size
            for n in names:
                values = series[n]
                line += ("%16.1f" % statistics.median(values)
                         if all(v is not None for v in values) else "%16s" % "-")
            for n in peers:
                values = series[n]
                line += " %23s" % (ratio_text(series["libcomm"], values)
                                  if all(v is not None for v in values) else "-")
            pairs = ([("libcomm-tcp", "mpi-tcp")] if tcp_pair else []) + (
                [("libcomm-shared", "mpi-default")] if shared_pair else [])
            for ours_name, theirs_name in pairs:
                ours, theirs = series[ours_name], series[theirs_name]
                line += " %23s" % (ratio_text(ours, theirs)
                                  if all(v is not None for v in ours + theirs) else "-")
            print(line)
    if ceilings and args.two_hosts:
        # The collectives' bytes do not all cross the link between the
        # hosts (the hierarchical ones move most inside each), so only the
        # link's own figure is printed.
        print("# iperf3 --bidir -P %d between the namespaces: %.2f GB/s"
              % (max(1, args.np // 2), statistics.median(ceilings) / 1e9))
    elif ceilings and args.np > 1:
        largest = (("all_reduce", SIZES[-1]))
        ceiling = statistics.median(ceilings)
        for n in ["libcomm", "libcomm-tcp"]:
            if n not in samples:
                continue
            moved = 2 * (args.np - 1) * SIZES[-1] / (
                statistics.median(s[largest] for s in samples[n]) / 1e6)
            print("# all_reduce %d bytes: %s moved the equivalent of %.2f GB/s of ring "
                  "traffic; iperf3 --bidir -P %d over loopback: %.2f GB/s; ratio %.2f"
                  % (SIZES[-1], n, moved / 1e9, max(1, args.np // 2), ceiling / 1e9,
                     moved / ceiling))
    return 0


if __name__ == "__main__":
    sys.exit(main())
