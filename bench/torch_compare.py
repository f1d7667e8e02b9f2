#!/usr/bin/python3
"""torch.distributed on libcomm ("libcomm", commdist.c10d) against torch's
own gloo: all_reduce time per size and DDP training steps per second, at
each world size, and the cost of the glue (libcomm through torch against
libcomm's own all_reduce_perf at the same size and world).

    bench/torch_compare.py [--worlds 2 4] [--runs 5] [--build build]
                           [--min-bytes 1K] [--max-bytes 64M]
                           [--ddp-steps 40] [--bind-to core|none]
    bench/torch_compare.py --runs 1 --worlds 2 --max-bytes 4K --ddp-steps 3
                                      # a smoke run: checks that it runs

Each round runs every program once per world size: gloo's all_reduce,
libcomm's all_reduce through torch, all_reduce_perf, gloo's DDP and
libcomm's DDP, in an order that rotates from round to round, so that no
program always runs first or after the same one. A program is `world`
processes (this script with --worker, over a FileStore, or
all_reduce_perf -np). Sizes run in ascending order in one process, each
with 2 warm-up calls and then as many timed calls as make 64 MiB (between
3 and 200), each call waited before the next (blocking, as a training loop
calls it); a size's time is the slowest rank's mean. all_reduce_perf runs
with the same iteration counts (--iteration-bytes), blocking calls (-z 1)
and the slowest rank's time (-a 3), and its in-place time is the one
compared, since torch's all_reduce is in place. Every rank is pinned to a
CPU as all_reduce_perf pins its ranks (--bind-to core: rank r on usable CPU
r mod n), and runs with OMP_NUM_THREADS=1, as torchrun starts ranks.

Times are medians over the rounds. Ratios are taken within each round and
printed as median (min-max) over the rounds: libcomm/gloo below 1 means
libcomm is faster than gloo (for DDP, steps per second: above 1 means
faster); glue is libcomm through torch over all_reduce_perf (1.0 would mean
the glue costs nothing).

Needs /usr/bin/python3 with Debian's python3-torch (--python), and the build
directory holding commdist.c10d (tools/setup installs libtorch-dev) and
bench/all_reduce_perf (tools/setup && ninja -C build).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TIMEOUT_S = 900


def parse_bytes(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)


def sizes_between(low, high):
    sizes, size = [], low
    while size <= high:
        sizes.append(size)
        size *= 4
    return sizes


def iterations(size):
    return max(3, min(200, (64 << 20) // size))


def bind_to_core(rank):
    """Pins this process to usable CPU `rank` mod their count, as
    all_reduce_perf's --bind-to core pins its ranks; before torch starts
    threads, which inherit it."""
    usable = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {usable[rank % len(usable)]})


# ---- One rank (--worker) ----------------------------------------------------


def time_all_reduce(args, torch, dist):
    """Microseconds per blocking all_reduce, by size: the slowest rank's
    mean."""
    result = {}
    for size in sizes_between(args.min_bytes, args.max_bytes):
        tensor = torch.ones(size // 4, dtype=torch.float32)
        for _ in range(2):
            dist.all_reduce(tensor)
        count = iterations(size)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(count):
            dist.all_reduce(tensor)
        elapsed = time.perf_counter() - start
        seconds = torch.tensor([elapsed / count], dtype=torch.float64)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        result[str(size)] = seconds.item() * 1e6
    return result


def time_ddp(args, torch, dist):
    """DDP training steps per second, the slowest rank's. The model is
    dropped when this returns, while the default group still holds the
    process group: torch 1.13's gloo can deadlock when a DDP reducer
    drops the last reference to its group (the group's destructor joins a
    thread that waits for the GIL the destroying thread holds)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    inputs = torch.randn(32, 256)
    labels = torch.randint(0, 10, (32,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        optimizer.zero_grad()
        loss_fn(ddp(inputs), labels).backward()
        optimizer.step()

    for _ in range(3):
        step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.ddp_steps):
        step()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return {"steps_per_s": args.ddp_steps / elapsed.item()}


def worker(args):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.bind_to == "core":
        bind_to_core(rank)
    import torch
    import torch.distributed as dist
    if args.backend == "libcomm":
        import commdist.c10d  # noqa: F401  (registers "libcomm")
    dist.init_process_group(args.backend, init_method=args.init_method,
                            rank=rank, world_size=world)
    timer = time_all_reduce if args.what == "all_reduce" else time_ddp
    result = timer(args, torch, dist)
    if rank == 0:
        print(json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()


# ---- The driver ---------------------------------------------------------------


def run_torch(args, backend, what, world):
    """`world` ranks of this script on `backend`; rank 0's JSON result."""
    with tempfile.TemporaryDirectory(prefix="torch_compare.") as folder:
        command = [args.python, os.path.abspath(__file__), "--worker",
                   "--backend", backend, "--what", what,
                   "--init-method", f"file://{folder}/store",
                   "--min-bytes", str(args.min_bytes),
                   "--max-bytes", str(args.max_bytes),
                   "--ddp-steps", str(args.ddp_steps),
                   "--bind-to", args.bind_to]
        env = dict(os.environ, WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
        python_path = os.path.join(args.build, "bindings", "python")
        env["PYTHONPATH"] = python_path + os.pathsep + env.get("PYTHONPATH", "")
        # stderr goes to a file per rank, so that a rank that writes much
        # never blocks on a pipe this process is not reading yet.
        logs = [open(os.path.join(folder, f"rank{rank}.stderr"), "w+")
                for rank in range(world)]
        processes = [subprocess.Popen(command, env=dict(env, RANK=str(rank)),
                                      stdout=subprocess.PIPE, stderr=log,
                                      text=True)
                     for rank, log in enumerate(logs)]
        deadline = time.monotonic() + TIMEOUT_S
        outputs, late = [], set()
        try:
            for rank, process in enumerate(processes):
                left = max(1.0, deadline - time.monotonic())
                try:
                    outputs.append(process.communicate(timeout=left)[0])
                except subprocess.TimeoutExpired:
                    process.kill()
                    outputs.append(process.communicate()[0])
                    late.add(rank)
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.communicate()
        failed = []
        for rank, (process, log) in enumerate(zip(processes, logs)):
            log.seek(0)
            stderr = log.read()
            log.close()
            if rank in late:
                stderr += f"(killed: still running after {TIMEOUT_S} s)\n"
            if process.returncode != 0:
                failed.append(f"--- rank {rank} (exit {process.returncode}):"
                              f"\n{stderr}")
        if failed:
            sys.exit(f"bench/torch_compare.py: {backend} {what} at world "
                     f"{world} failed:\n" + "\n".join(failed))
        return json.loads(outputs[0].strip().splitlines()[-1])


def run_all_reduce_perf(args, world):
    """libcomm's own all_reduce_perf over the same sizes in one process, as
    the torch workers run them: the same iteration counts, blocking calls,
    the slowest rank's time, the same pinning; the in-place time (the 10th
    column of the nccl-tests table), since torch's all_reduce is in
    place. Microseconds by size."""
    binary = os.path.join(args.build, "bench", "all_reduce_perf")
    command = [binary, "-np", str(world), "-b", str(args.min_bytes),
               "-e", str(args.max_bytes), "-f", "4", "-n", "200",
               "--iteration-bytes", str(64 << 20), "-w", "2", "-c", "0",
               "-z", "1", "-a", "3", "--bind-to", args.bind_to]
    result = subprocess.run(command, capture_output=True, text=True,
                            timeout=TIMEOUT_S)
    if result.returncode != 0:
        sys.exit(f"bench/torch_compare.py: {' '.join(command)} failed:\n"
                 f"{result.stdout}{result.stderr}")
    times = {}
    for line in result.stdout.splitlines():
        fields = line.split()
        if len(fields) > 9 and fields[0].isdigit():
            times[fields[0]] = float(fields[9])
    missing = [size for size in sizes_between(args.min_bytes, args.max_bytes)
               if str(size) not in times]
    if missing:
        sys.exit(f"bench/torch_compare.py: all_reduce_perf printed no row "
                 f"for {missing}:\n{result.stdout}")
    return times


def ratio_text(ours, theirs):
    """"median (min-max)" of the per-round ratios ours/theirs."""
    ratios = [a / b for a, b in zip(ours, theirs) if b > 0]
    if not ratios:
        return "-"
    return "%.2f (%.2f-%.2f)" % (statistics.median(ratios), min(ratios),
                                 max(ratios))


def compare_world(args, world):
    programs = {
        "gloo": lambda: run_torch(args, "gloo", "all_reduce", world),
        "libcomm": lambda: run_torch(args, "libcomm", "all_reduce", world),
        "perf": lambda: run_all_reduce_perf(args, world),
        "ddp gloo": lambda: run_torch(args, "gloo", "ddp", world),
        "ddp libcomm": lambda: run_torch(args, "libcomm", "ddp", world),
    }
    names = list(programs)
    samples = {name: [] for name in names}
    for round_index in range(args.runs):
        shift = round_index % len(names)
        order = names[shift:] + names[:shift]
        for name in order:
            samples[name].append(programs[name]())
        print(f"world {world}: round {round_index + 1}/{args.runs} done "
              f"(order: {', '.join(order)})", file=sys.stderr, flush=True)

    print(f"# world {world}: torch.distributed.all_reduce, float32, "
          f"blocking; time_us is the median of {args.runs} round(s); "
          f"ratios median (min-max) over the rounds")
    print(f"{'bytes':>10} {'gloo':>10} {'libcomm':>10} {'perf':>10} "
          f"{'libcomm/gloo':>19} {'glue (libcomm/perf)':>19}")
    for size in sizes_between(args.min_bytes, args.max_bytes):
        series = {name: [sample[str(size)] for sample in samples[name]]
                  for name in ["gloo", "libcomm", "perf"]}
        medians = {name: statistics.median(values)
                   for name, values in series.items()}
        print(f"{size:>10} {medians['gloo']:>10.1f} "
              f"{medians['libcomm']:>10.1f} {medians['perf']:>10.1f} "
              f"{ratio_text(series['libcomm'], series['gloo']):>19} "
              f"{ratio_text(series['libcomm'], series['perf']):>19}")
    ddp = {name: [sample["steps_per_s"] for sample in samples["ddp " + name]]
           for name in ["gloo", "libcomm"]}
    print(f"# world {world}: DDP training steps/s (MLP 256-512-512-10, "
          f"batch 32, {args.ddp_steps} steps): gloo "
          f"{statistics.median(ddp['gloo']):.1f}, libcomm "
          f"{statistics.median(ddp['libcomm']):.1f}; libcomm/gloo "
          f"{ratio_text(ddp['libcomm'], ddp['gloo'])} (above 1: libcomm "
          f"trains faster)\n", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--runs", "--rounds", dest="runs", type=int,
                        default=5, help="rounds (default 5)")
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--python", default="/usr/bin/python3",
                        help="the interpreter that imports torch "
                             "(default /usr/bin/python3)")
    parser.add_argument("--min-bytes", type=parse_bytes, default=1 << 10)
    parser.add_argument("--max-bytes", type=parse_bytes, default=64 << 20)
    parser.add_argument("--ddp-steps", type=int, default=40)
    parser.add_argument("--bind-to", choices=["core", "none"], default="core",
                        help="pin rank r to usable CPU r mod n (core, as "
                             "all_reduce_perf does by default) or not")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--what", help=argparse.SUPPRESS)
    parser.add_argument("--init-method", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.runs < 1 or args.ddp_steps < 1 or min(args.worlds) < 1:
        sys.exit("bench/torch_compare.py: --runs, --ddp-steps and --worlds "
                 "must be at least 1")
    if not 4 <= args.min_bytes <= args.max_bytes:
        sys.exit("bench/torch_compare.py: --min-bytes must be at least 4 "
                 "and at most --max-bytes")
    binary = os.path.join(args.build, "bench", "all_reduce_perf")
    package = os.path.join(args.build, "bindings", "python", "commdist", "c10d")
    for needed in [binary, package]:
        if not os.path.exists(needed):
            sys.exit(f"bench/torch_compare.py: {needed} is missing; build it "
                     f"first (tools/setup && ninja -C {args.build})")
    for world in args.worlds:
        compare_world(args, world)
    return 0


if __name__ == "__main__":
    sys.exit(main())
