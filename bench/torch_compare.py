#!/usr/bin/python3
"""torch.distributed on libcomm ("libcomm", commdist.c10d) against torch's
own gloo: all_reduce time per size and DDP training steps per second, at
each world size, and the cost of the glue (libcomm through torch against
libcomm's own all_reduce_perf at the same size).

    bench/torch_compare.py [--worlds 2 4] [--rounds 3] [--build build]
                           [--min-bytes 1K] [--max-bytes 64M] [--ddp-steps 40]
    bench/torch_compare.py --smoke    # one tiny round: checks it runs

Each round runs every program once per world size, the order alternating
between rounds (gloo, libcomm, all_reduce_perf; then the reverse), and the
median over rounds is printed. A program is `world` processes of this
script (--worker) over a FileStore; sizes run in ascending order in one
process, each with 2 warm-up calls and then as many timed calls as make
64 MiB (between 3 and 200), each call waited before the next (blocking, as
a training loop calls it). all_reduce_perf runs with the same iteration
count (--iteration-bytes) and blocking calls (-z 1), all sizes in one
process, and its in-place time is the one compared, since torch's
all_reduce is in place.

Ratios below 1 mean libcomm is faster than gloo; "glue" is libcomm through
torch over all_reduce_perf (1.0 would mean the glue costs nothing).

Needs /usr/bin/python3 with Debian's python3-torch, and the build directory
holding commdist.c10d (tools/setup installs libtorch-dev) and
bench/all_reduce_perf.
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


def parse_bytes(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text[-1].upper() in units:
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


# ---- One rank (--worker) ----------------------------------------------------


def worker(args):
    import torch
    import torch.distributed as dist
    if args.backend == "libcomm":
        import commdist.c10d  # noqa: F401
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(args.backend, init_method=args.init_method,
                            rank=rank, world_size=world)
    result = {}
    if args.what == "all_reduce":
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
            # The slowest rank's time is the collective's.
            seconds = torch.tensor([elapsed / count], dtype=torch.float64)
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            result[size] = seconds.item() * 1e6
    else:
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
        elapsed = torch.tensor([time.perf_counter() - start],
                               dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        result["steps_per_s"] = args.ddp_steps / elapsed.item()
    if rank == 0:
        print(json.dumps(result))
    dist.destroy_process_group()


# ---- The driver ---------------------------------------------------------------


def run_torch(args, backend, what, world):
    with tempfile.TemporaryDirectory(prefix="torch_compare.") as folder:
        command = [sys.executable, os.path.abspath(__file__), "--worker",
                   "--backend", backend, "--what", what,
                   "--init-method", f"file://{folder}/store",
                   "--min-bytes", str(args.min_bytes),
                   "--max-bytes", str(args.max_bytes),
                   "--ddp-steps", str(args.ddp_steps)]
        env = dict(os.environ, WORLD_SIZE=str(world))
        python_path = os.path.join(args.build, "bindings", "python")
        env["PYTHONPATH"] = python_path + os.pathsep + env.get("PYTHONPATH", "")
        processes = [subprocess.Popen(command, env=dict(env, RANK=str(rank)),
                                      stdout=subprocess.PIPE, text=True)
                     for rank in range(world)]
        outputs = []
        try:
            for process in processes:
                outputs.append(process.communicate(timeout=900)[0])
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.communicate()
        if any(process.returncode for process in processes):
            sys.exit(f"{backend} {what} at world {world} failed")
        return json.loads(outputs[0].strip().splitlines()[-1])


def run_all_reduce_perf(args, world):
    """libcomm's own all_reduce_perf over the same sizes in one process, as
    the torch workers run them, with the same iteration counts
    (--iteration-bytes) and blocking calls; the in-place time (column 9 of
    the nccl-tests table), since torch's all_reduce is in place."""
    binary = os.path.join(args.build, "bench", "all_reduce_perf")
    result = subprocess.run(
        [binary, "-np", str(world), "-b", str(args.min_bytes),
         "-e", str(args.max_bytes), "-f", "4", "-n", "200",
         "--iteration-bytes", str(64 << 20), "-w", "2", "-c", "0", "-z", "1"],
        capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        sys.exit(f"all_reduce_perf failed:\n{result.stdout}{result.stderr}")
    times = {}
    for line in result.stdout.splitlines():
        fields = line.split()
        if len(fields) > 9 and fields[0].isdigit():
            times[fields[0]] = float(fields[9])
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--min-bytes", type=parse_bytes, default=1 << 10)
    parser.add_argument("--max-bytes", type=parse_bytes, default=64 << 20)
    parser.add_argument("--ddp-steps", type=int, default=40)
    parser.add_argument("--smoke", action="store_true",
                        help="one round, world 2, 1-4 KiB, 3 DDP steps")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--what", help=argparse.SUPPRESS)
    parser.add_argument("--init-method", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.smoke:
        args.worlds, args.rounds = [2], 1
        args.min_bytes, args.max_bytes, args.ddp_steps = 1 << 10, 4 << 10, 3

    for world in args.worlds:
        samples = {"gloo": [], "libcomm": [], "perf": [],
                   "ddp gloo": [], "ddp libcomm": []}
        for round_index in range(args.rounds):
            order = ["gloo", "libcomm", "perf"]
            if round_index % 2:
                order.reverse()
            for program in order:
                if program == "perf":
                    samples["perf"].append(run_all_reduce_perf(args, world))
                    continue
                samples[program].append(
                    run_torch(args, program, "all_reduce", world))
                samples["ddp " + program].append(
                    run_torch(args, program, "ddp", world)["steps_per_s"])

        def median(program, size):
            return statistics.median(s[str(size)] for s in samples[program])

        print(f"world {world}: torch.distributed.all_reduce, float32, "
              f"median of {args.rounds} round(s), microseconds")
        print(f"{'bytes':>10} {'gloo':>10} {'libcomm':>10} {'perf':>10} "
              f"{'libcomm/gloo':>13} {'glue':>6}")
        for size in sizes_between(args.min_bytes, args.max_bytes):
            gloo, ours = median("gloo", size), median("libcomm", size)
            perf = median("perf", size)
            print(f"{size:>10} {gloo:>10.1f} {ours:>10.1f} {perf:>10.1f} "
                  f"{ours / gloo:>13.2f} {ours / perf:>6.2f}")
        ddp_gloo = statistics.median(samples["ddp gloo"])
        ddp_ours = statistics.median(samples["ddp libcomm"])
        print(f"world {world}: DDP steps/s (MLP 256-512-512-10, batch 32): "
              f"gloo {ddp_gloo:.1f}, libcomm {ddp_ours:.1f}, "
              f"libcomm/gloo {ddp_ours / ddp_gloo:.2f}\n")


if __name__ == "__main__":
    main()
