#!/usr/bin/python3
"""The Gloo side of bench/compare.py: torch.distributed on its gloo backend
(Debian's python3-torch), times each collective the libcomm bench binaries
have, float32 (sum where it reduces), root 0, blocking, 1 KiB to 64 MiB x4
with 64 MiB / size iterations (3 to 20000) after 2 warm-up calls, and prints
"collective bytes time_us" for the slowest rank's mean per call.

    /usr/bin/python3 bench/peers/gloo_collectives.py WORLD [COLLECTIVE...]

Sizes are counted as the *_perf binaries count them (see
bench/peers/mpi_collectives.c). Gloo in torch 1.13 has no reduce_scatter:
that collective prints no rows, and compare.py shows a dash.
"""
import os
import socket
import sys
import time

COLLECTIVES = ["all_reduce", "all_gather", "broadcast", "reduce", "reduce_scatter",
               "alltoall", "gather", "scatter"]
SIZE_IS_TOTAL = {"all_gather", "reduce_scatter", "alltoall", "gather", "scatter"}
SIZES = [1024 << (2 * i) for i in range(9)]
WARMUP = 2


def iterations_for(size):
    return max(3, min(20000, (64 << 20) // size))


def call(dist, torch, name, rank, world, elements):
    """A closure that runs `name` once on buffers of this size, or None when
    gloo lacks it."""
    if name in SIZE_IS_TOTAL:
        block = elements // world
        if block == 0:
            return None
        whole = torch.ones(block * world)
        mine = torch.ones(block)
        blocks = list(torch.ones(block * world).chunk(world))
    else:
        tensor = torch.ones(elements)
    if name == "all_reduce":
        return lambda: dist.all_reduce(tensor)
    if name == "broadcast":
        return lambda: dist.broadcast(tensor, 0)
    if name == "reduce":
        return lambda: dist.reduce(tensor, 0)
    if name == "all_gather":
        return lambda: dist.all_gather(blocks, mine)
    if name == "alltoall":
        out = torch.empty(block * world)
        return lambda: dist.all_to_all_single(out, whole)
    if name == "gather":
        return lambda: dist.gather(mine, blocks if rank == 0 else None, 0)
    if name == "scatter":
        return lambda: dist.scatter(mine, blocks if rank == 0 else None, 0)
    return None  # reduce_scatter: not in ProcessGroupGloo of torch 1.13


def rank_main(rank, world, port, names):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                            rank=rank, world_size=world)
    for name in names:
        for size in SIZES:
            run = call(dist, torch, name, rank, world, size // 4)
            if run is None:
                continue
            for _ in range(WARMUP):
                run()
            iterations = iterations_for(size)
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iterations):
                run()
            mean = torch.tensor([(time.perf_counter() - start) / iterations],
                                dtype=torch.float64)
            dist.all_reduce(mean, op=dist.ReduceOp.MAX)
            if rank == 0:
                print("%s %d %.2f" % (name, size, mean.item() * 1e6), flush=True)
    dist.destroy_process_group()


def main():
    if len(sys.argv) < 2 or not sys.argv[1].isdigit():
        sys.exit(__doc__)
    world = int(sys.argv[1])
    names = sys.argv[2:] or COLLECTIVES
    unknown = [n for n in names if n not in COLLECTIVES]
    if unknown:
        sys.exit("gloo_collectives.py: unknown collective %s; known: %s"
                 % (", ".join(unknown), " ".join(COLLECTIVES)))
    if "GLOO_COLLECTIVES_RANK" in os.environ:
        rank_main(int(os.environ["GLOO_COLLECTIVES_RANK"]), world,
                  int(os.environ["GLOO_COLLECTIVES_PORT"]), names)
        return 0
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    import subprocess
    ranks = [subprocess.Popen([sys.executable, os.path.abspath(__file__)] + sys.argv[1:],
                              env=dict(os.environ, GLOO_COLLECTIVES_RANK=str(r),
                                       GLOO_COLLECTIVES_PORT=str(port)),
                              stdout=None if r == 0 else subprocess.DEVNULL)
             for r in range(world)]
    status = 0
    for process in ranks:
        try:
            status |= process.wait(timeout=1800)
        except subprocess.TimeoutExpired:
            for other in ranks:
                other.kill()
            sys.exit("gloo_collectives.py: the ranks ran past 30 minutes")
    return status


if __name__ == "__main__":
    sys.exit(main())
