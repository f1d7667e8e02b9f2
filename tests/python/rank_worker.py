"""One rank of a multi-process commdist test.

    rank_worker.py SCENARIO STORE_PATH      (RANK and WORLD_SIZE in the env)

Every scenario checks results against references each rank computes on its
own from every rank's deterministic input, and raises AssertionError (exit
status 1) at the first difference.
"""

import os
import sys

import numpy as np

import commdist as dist

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])


def data_of(rank, count, dtype, salt=0):
    """Rank `rank`'s input: small positive values, distinct per rank, so
    that sums and products of a few ranks are exact in every dtype."""
    values = (np.arange(count) * (rank + 1) + rank + salt) % 5 + 1
    if dtype == np.bool_:
        return (values % 2).astype(np.bool_)
    return values.astype(dtype)


class Flavour:
    """numpy arrays or torch tensors, behind the same few calls."""

    def __init__(self, name):
        self.name = name
        if name == "torch":
            import torch
            self.torch = torch

    def make(self, array):
        array = np.ascontiguousarray(array)
        if self.name == "numpy":
            return array.copy()
        return self.torch.from_numpy(array.copy())

    def empty(self, count, dtype):
        return self.make(np.zeros(count, dtype=dtype))

    def numpy(self, x):
        return np.asarray(x) if self.name == "numpy" else x.numpy()


def check(got, expected, what):
    got = np.asarray(got)
    if expected.dtype.kind == "f":
        ok = np.allclose(got, expected, rtol=1e-3, atol=0)
    else:
        ok = np.array_equal(got, expected)
    assert ok, f"rank {RANK}: {what}: got {got}, expected {expected}"


def reduce_reference(op, arrays):
    stacked = np.stack(arrays)
    if op == dist.ReduceOp.SUM:
        return np.logical_or.reduce(stacked) if stacked.dtype == np.bool_ \
            else stacked.sum(axis=0).astype(stacked.dtype)
    if op == dist.ReduceOp.AVG:
        return (stacked.sum(axis=0) / len(arrays)).astype(stacked.dtype)
    if op == dist.ReduceOp.PRODUCT:
        return np.logical_and.reduce(stacked) if stacked.dtype == np.bool_ \
            else stacked.prod(axis=0).astype(stacked.dtype)
    if op == dist.ReduceOp.MIN:
        return stacked.min(axis=0)
    if op == dist.ReduceOp.MAX:
        return stacked.max(axis=0)
    if op == dist.ReduceOp.BAND:
        return np.bitwise_and.reduce(stacked)
    if op == dist.ReduceOp.BOR:
        return np.bitwise_or.reduce(stacked)
    return np.bitwise_xor.reduce(stacked)


def ops_for(dtype):
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN,
           dist.ReduceOp.MAX]
    if np.dtype(dtype).kind == "f":
        ops.append(dist.ReduceOp.AVG)
    if np.dtype(dtype).kind in "iub":
        ops += [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]
    return ops


def collectives(flavour_name):
    f = Flavour(flavour_name)
    dtypes = [np.float32, np.float64, np.int32, np.int64, np.uint8,
              np.int8, np.float16, np.bool_]
    count = 13  # prime, not divisible by the world size
    everyone = range(WORLD)
    for dtype in dtypes:
        name = f"{f.name} {np.dtype(dtype).name}"
        inputs = [data_of(r, count, dtype) for r in everyone]

        for op in ops_for(dtype):
            if dtype == np.bool_ and op in (dist.ReduceOp.BAND,
                                            dist.ReduceOp.BOR,
                                            dist.ReduceOp.BXOR):
                continue
            x = f.make(inputs[RANK])
            dist.all_reduce(x, op=op)
            check(f.numpy(x), reduce_reference(op, inputs),
                  f"all_reduce {op} {name}")

        for root in everyone:
            x = f.make(inputs[RANK])
            dist.broadcast(x, src=root)
            check(f.numpy(x), inputs[root], f"broadcast from {root} {name}")

            x = f.make(inputs[RANK])
            dist.reduce(x, dst=root, op=dist.ReduceOp.MAX)
            if RANK == root:
                check(f.numpy(x), reduce_reference(dist.ReduceOp.MAX, inputs),
                      f"reduce to {root} {name}")

            gathered = [f.empty(count, dtype) for _ in everyone] \
                if RANK == root else None
            dist.gather(f.make(inputs[RANK]), gathered, dst=root)
            if RANK == root:
                for r in everyone:
                    check(f.numpy(gathered[r]), inputs[r],
                          f"gather to {root}, block {r}, {name}")

            out = f.empty(count, dtype)
            pieces = [f.make(data_of(root, count, dtype, salt=r))
                      for r in everyone] if RANK == root else None
            dist.scatter(out, pieces, src=root)
            check(f.numpy(out), data_of(root, count, dtype, salt=RANK),
                  f"scatter from {root} {name}")

        outputs = [f.empty(count, dtype) for _ in everyone]
        dist.all_gather(outputs, f.make(inputs[RANK]))
        for r in everyone:
            check(f.numpy(outputs[r]), inputs[r], f"all_gather {r} {name}")
        flat = f.empty(count * WORLD, dtype)
        dist.all_gather_into_tensor(flat, f.make(inputs[RANK]))
        check(f.numpy(flat), np.concatenate(inputs), f"all_gather flat {name}")

        if dtype != np.bool_:
            blocks = [f.make(data_of(RANK, count, dtype, salt=b))
                      for b in everyone]
            out = f.empty(count, dtype)
            dist.reduce_scatter(out, blocks, op=dist.ReduceOp.SUM)
            check(f.numpy(out),
                  reduce_reference(dist.ReduceOp.SUM,
                                   [data_of(r, count, dtype, salt=RANK)
                                    for r in everyone]),
                  f"reduce_scatter {name}")

        # all_to_all with uneven sizes: rank i sends i + j + 1 elements to j.
        sends = [f.make(data_of(RANK, RANK + j + 1, dtype, salt=j))
                 for j in everyone]
        recvs = [f.empty(i + RANK + 1, dtype) for i in everyone]
        dist.all_to_all(recvs, sends)
        for i in everyone:
            check(f.numpy(recvs[i]), data_of(i, i + RANK + 1, dtype, salt=RANK),
                  f"all_to_all from {i} {name}")
        send_sizes = [RANK + j + 1 for j in everyone]
        recv_sizes = [i + RANK + 1 for i in everyone]
        single_in = f.make(np.concatenate(
            [data_of(RANK, n, dtype, salt=j) for j, n in enumerate(send_sizes)]))
        single_out = f.empty(sum(recv_sizes), dtype)
        dist.all_to_all_single(single_out, single_in, recv_sizes, send_sizes)
        check(f.numpy(single_out), np.concatenate(
            [data_of(i, n, dtype, salt=RANK) for i, n in enumerate(recv_sizes)]),
            f"all_to_all_single {name}")

    dist.barrier()


def point_to_point(flavour_name):
    f = Flavour(flavour_name)
    right, left = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    # Tags keep two messages between the same ranks apart.
    inbox_a, inbox_b = f.empty(5, np.float64), f.empty(5, np.float64)
    work_b = dist.irecv(inbox_b, src=left, tag=2)
    work_a = dist.irecv(inbox_a, src=left, tag=1)
    sends = [dist.isend(f.make(data_of(RANK, 5, np.float64, salt=s)), right,
                        tag=s) for s in (1, 2)]
    for w in [work_a, work_b] + sends:
        w.wait()
    check(f.numpy(inbox_a), data_of(left, 5, np.float64, salt=1), "tag 1")
    check(f.numpy(inbox_b), data_of(left, 5, np.float64, salt=2), "tag 2")
    # Any source: rank 0 hears from everyone else, in whatever order.
    if RANK == 0:
        heard = set()
        for _ in range(WORLD - 1):
            box = f.empty(3, np.int64)
            source = dist.recv(box, tag=9)
            check(f.numpy(box), data_of(source, 3, np.int64), "any source")
            heard.add(source)
        assert heard == set(range(1, WORLD)), heard
    else:
        dist.send(f.make(data_of(RANK, 3, np.int64)), 0, tag=9)
    # Many operations in flight, completed in the order issued.
    arrays = [f.make(data_of(RANK, 100, np.int64, salt=k)) for k in range(16)]
    works = [dist.all_reduce(a, async_op=True) for a in arrays]
    for k in reversed(range(16)):
        assert works[k].wait() is True
        assert works[k].is_completed() and works[k].is_success()
        check(f.numpy(arrays[k]), reduce_reference(
            dist.ReduceOp.SUM,
            [data_of(r, 100, np.int64, salt=k) for r in range(WORLD)]),
            f"async all_reduce {k}")
    dist.barrier()


def subgroups(flavour_name):
    f = Flavour(flavour_name)
    odd = [r for r in range(WORLD) if r % 2 == 1]
    group = dist.new_group(odd)
    if RANK % 2 == 0:
        assert group is dist.GroupMember.NON_GROUP_MEMBER
        try:
            dist.all_reduce(f.make(np.zeros(1)), group=group)
        except dist.InvalidArgument as e:
            assert "not a member" in str(e)
        else:
            raise AssertionError("a collective on a group it is not in")
    else:
        assert dist.get_world_size(group) == len(odd)
        assert dist.get_rank(group) == odd.index(RANK)
        x = f.make(data_of(RANK, 4, np.float32))
        dist.broadcast(x, src=odd[-1], group=group)  # a default-group rank
        check(f.numpy(x), data_of(odd[-1], 4, np.float32), "subgroup bcast")
    dist.barrier()


def dead_peer(_):
    """The last rank exits in the middle; the others get PeerError naming
    it, well within the timeout."""
    x = np.ones(1 << 16, dtype=np.float32)
    dist.all_reduce(x)
    if RANK == WORLD - 1:
        os._exit(0)
    try:
        for _ in range(100):
            dist.all_reduce(x)
    except dist.PeerError as e:
        assert f"rank {WORLD - 1}" in str(e), str(e)
        print(f"rank {RANK}: PeerError: {e}")
    else:
        raise AssertionError("no PeerError after a peer exited")
    os._exit(0)  # the group is broken; skip the final barrier


def ddp_features(_):
    """no_sync accumulation, gradient_as_bucket_view and unused
    parameters, with torch's autograd."""
    import torch
    from torch import nn

    def batch(rank, step):
        g = torch.Generator().manual_seed(100 * rank + step)
        return torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)

    def grads_alone(model, steps):
        """Every rank's gradients summed over `steps`, averaged over ranks,
        computed here on a copy."""
        import copy
        alone = copy.deepcopy(model)
        alone.zero_grad()
        for r in range(WORLD):
            for step in steps:
                x, y = batch(r, step)
                (nn.functional.mse_loss(alone(x), y) / WORLD).backward()
        return [p.grad.clone() for p in alone.parameters()]

    for bucket_view in (False, True):
        torch.manual_seed(RANK)
        model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
        ddp = dist.DistributedDataParallel(
            model, bucket_cap_mb=0.0002, gradient_as_bucket_view=bucket_view)
        with ddp.no_sync():
            x, y = batch(RANK, 0)
            nn.functional.mse_loss(ddp(x), y).backward()
        x, y = batch(RANK, 1)
        nn.functional.mse_loss(ddp(x), y).backward()
        for got, expected in zip((p.grad for p in model.parameters()),
                                 grads_alone(model, [0, 1])):
            assert torch.allclose(got, expected, rtol=1e-5, atol=1e-7), \
                f"bucket_view={bucket_view}: {got} != {expected}"

    class WithUnused(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = nn.Linear(6, 3)
            self.spare = nn.Linear(6, 3)

        def forward(self, x):
            return self.used(x)

    ddp = dist.DistributedDataParallel(WithUnused())
    x, y = batch(RANK, 0)
    try:
        nn.functional.mse_loss(ddp(x), y).backward()
    except Exception as e:  # torch re-raises callback errors as its own
        assert "spare.weight" in str(e) and "spare.bias" in str(e), str(e)
    else:
        raise AssertionError("an unused parameter went unreported")
    tolerant = dist.DistributedDataParallel(WithUnused(),
                                            find_unused_parameters=True)
    nn.functional.mse_loss(tolerant(x), y).backward()
    assert torch.count_nonzero(tolerant.module.spare.weight.grad) == 0
    dist.barrier()


SCENARIOS = {
    "ddp_features": ddp_features,
    "collectives": collectives,
    "point_to_point": point_to_point,
    "subgroups": subgroups,
    "dead_peer": dead_peer,
}


def main():
    scenario, flavour, store_path = sys.argv[1], sys.argv[2], sys.argv[3]
    dist.init_process_group(
        "tcp", init_method=f"file://{store_path}", rank=RANK,
        world_size=WORLD, timeout=60)
    SCENARIOS[scenario](flavour)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {RANK}: {scenario} {flavour} ok")


if __name__ == "__main__":
    main()
