"""One rank of a multi-process commdist test.

    rank_worker.py SCENARIO STORE_PATH      (RANK and WORLD_SIZE in the env)

Every scenario checks results against references each rank computes on its
own from every rank's deterministic input, and raises AssertionError (exit
status 1) at the first difference.
"""

import datetime
import os
import sys
import time
import warnings

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
    if expected.dtype.kind in "fc":
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
        # As in torch: outside the group, get_rank is -1 and a collective
        # does nothing.
        assert group is dist.GroupMember.NON_GROUP_MEMBER
        assert dist.get_rank(group) == -1
        assert dist.get_world_size(group) == -1
        untouched = f.make(np.full(3, 7.0))
        assert dist.all_reduce(untouched, group=group) is None
        assert dist.broadcast(untouched, src=odd[0], group=group,
                              async_op=True) is None
        check(f.numpy(untouched), np.full(3, 7.0), "non-member all_reduce")
    else:
        assert dist.get_world_size(group) == len(odd)
        assert dist.get_rank(group) == odd.index(RANK)
        x = f.make(data_of(RANK, 4, np.float32))
        dist.broadcast(x, src=odd[-1], group=group)  # a default-group rank
        check(f.numpy(x), data_of(odd[-1], 4, np.float32), "subgroup bcast")
    dist.barrier()

    # new_subgroups: consecutive ranks, two at a time here (LOCAL_WORLD_SIZE
    # stands in for a host of two); each sums within its own pair.
    os.environ["LOCAL_WORLD_SIZE"] = "2"
    mine, pairs = dist.new_subgroups()
    assert len(pairs) == WORLD // 2
    assert dist.get_process_group_ranks(mine) == [RANK // 2 * 2,
                                                  RANK // 2 * 2 + 1]
    assert sum(p is dist.GroupMember.NON_GROUP_MEMBER for p in pairs) == \
        WORLD // 2 - 1
    x = f.make(data_of(RANK, 5, np.float64))
    dist.all_reduce(x, group=mine)
    check(f.numpy(x), reduce_reference(
        dist.ReduceOp.SUM, [data_of(r, 5, np.float64)
                            for r in dist.get_process_group_ranks(mine)]),
          "all_reduce in new_subgroups' pair")
    for bad, says in ((3, "not divisible"), (WORLD + 2, "exceeds"),
                      (0, "positive")):
        try:
            dist.new_subgroups(bad)
            raise AssertionError(f"new_subgroups({bad}) was accepted")
        except dist.InvalidArgument as e:
            assert says in str(e), e
    # By enumeration: rank 0 alone, and the others together.
    rest = list(range(1, WORLD))
    mine, both = dist.new_subgroups_by_enumeration([[0], rest])
    assert dist.get_process_group_ranks(mine) == ([0] if RANK == 0 else rest)
    x = f.make(data_of(RANK, 3, np.int64))
    dist.all_reduce(x, op=dist.ReduceOp.MAX, group=mine)
    check(f.numpy(x), reduce_reference(
        dist.ReduceOp.MAX, [data_of(r, 3, np.int64)
                            for r in dist.get_process_group_ranks(mine)]),
          "all_reduce in an enumerated subgroup")
    try:
        dist.new_subgroups_by_enumeration([[0, 1], [1, 2]])
        raise AssertionError("a rank in two subgroups was accepted")
    except dist.InvalidArgument as e:
        assert "rank 1 is in subgroup 0 and in subgroup 1" in str(e), e
    dist.barrier()


def coalesced(flavour_name):
    """all_reduce_coalesced and all_gather_coalesced, blocking and async
    (a torch future, as torch returns, where torch is installed)."""
    f = Flavour(flavour_name)
    sizes = (1, 7, 0, 13)
    tensors = [f.make(data_of(RANK, n, np.float32, salt=n)) for n in sizes]
    # torch's warning, in torch's words (a filter for one silences both).
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert dist.all_reduce_coalesced(tensors, op=dist.ReduceOp.MAX) is None
    assert len(said) == 1 and str(said[0].message).startswith(
        "torch.distributed.all_reduce_coalesced will be deprecated."), \
        [str(w.message) for w in said]
    for t, n in zip(tensors, sizes):
        check(f.numpy(t), reduce_reference(
            dist.ReduceOp.MAX, [data_of(r, n, np.float32, salt=n)
                                for r in range(WORLD)]),
              f"all_reduce_coalesced of {n}")
    tensors = [f.make(data_of(RANK, n, np.float32, salt=n)) for n in sizes]
    pending = dist.all_reduce_coalesced(tensors, async_op=True)
    pending.wait()
    for t, n in zip(tensors, sizes):
        check(f.numpy(t), reduce_reference(
            dist.ReduceOp.SUM, [data_of(r, n, np.float32, salt=n)
                                for r in range(WORLD)]),
              f"async all_reduce_coalesced of {n}")
    if f.name == "torch":
        import torch
        assert isinstance(pending, torch.futures.Future), type(pending)
        assert pending.value()[0] is tensors[0]
    try:
        dist.all_reduce_coalesced([f.make(np.zeros(2, np.float32)),
                                   f.make(np.zeros(2, np.float64))])
        raise AssertionError("mixed dtypes were accepted")
    except dist.InvalidArgument as e:
        assert "same dtype" in str(e), e
    try:
        dist.all_reduce_coalesced([])
        raise AssertionError("an empty list was accepted")
    except dist.InvalidArgument as e:
        assert "non-empty" in str(e), e
    # A bad tensor after a good one fails the call before anything starts:
    # the ranks stay in step for the next call.
    try:
        dist.all_reduce_coalesced([f.make(np.ones(2, np.float32)),
                                   f.make(np.zeros(8, np.float32))[::2]])
        raise AssertionError("a strided tensor was accepted")
    except dist.InvalidArgument as e:
        assert "tensors[1]" in str(e), e
    x = f.make(data_of(RANK, 3, np.float32))
    dist.all_reduce(x)
    check(f.numpy(x), reduce_reference(
        dist.ReduceOp.SUM, [data_of(r, 3, np.float32) for r in range(WORLD)]),
          "all_reduce after a refused all_reduce_coalesced")

    inputs = [f.make(data_of(RANK, n, np.int32, salt=n)) for n in sizes]
    outputs = [[f.empty(n, np.int32) for n in sizes] for _ in range(WORLD)]
    dist.all_gather_coalesced(outputs, inputs)
    for r in range(WORLD):
        for got, n in zip(outputs[r], sizes):
            check(f.numpy(got), data_of(r, n, np.int32, salt=n),
                  f"all_gather_coalesced of {n} from rank {r}")
    outputs = [[f.empty(n, np.int32) for n in sizes] for _ in range(WORLD)]
    pending = dist.all_gather_coalesced(outputs, inputs, async_op=True)
    pending.wait()
    for r in range(WORLD):
        for got, n in zip(outputs[r], sizes):
            check(f.numpy(got), data_of(r, n, np.int32, salt=n),
                  f"async all_gather_coalesced of {n} from rank {r}")
    if f.name == "torch":
        # As torch's: the future's value is the nested output lists.
        assert len(pending.value()) == WORLD
        assert all(got is want for got, want in
                   zip(pending.value()[WORLD - 1], outputs[WORLD - 1]))
    try:
        dist.all_gather_coalesced(outputs[:-1], inputs)
        raise AssertionError("a list per rank short was accepted")
    except dist.InvalidArgument as e:
        assert "one list per rank" in str(e), e
    print(f"rank {RANK}: coalesced ok", flush=True)


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
    import copy

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

    # The buckets lie in shared host memory unless asked otherwise, and with
    # gradient_as_bucket_view the gradients are views into them.
    for shared in (True, False):
        model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
        ddp = dist.DistributedDataParallel(
            model, gradient_as_bucket_view=True, shared_host_buckets=shared)
        x, y = batch(RANK, 2)
        nn.functional.mse_loss(ddp(x), y).backward()
        for p in model.parameters():
            assert in_shared_host_memory(p.grad.data_ptr()) == shared, \
                f"shared_host_buckets={shared}"

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
    # No rank used it: its grad stays None, as in torch (so weight decay
    # leaves it alone).
    assert tolerant.module.spare.weight.grad is None
    assert tolerant.module.used.weight.grad is not None

    class UsedOnRankZero(WithUnused):
        def forward(self, x):
            out = self.used(x)
            return out + self.spare(x) if RANK == 0 else out

    for static in (False, True):
        model = UsedOnRankZero()
        ddp = dist.DistributedDataParallel(
            model, find_unused_parameters=not static, static_graph=static)
        reference = copy.deepcopy(model)
        for step in range(2):
            model.zero_grad(set_to_none=True)
            x, y = batch(RANK, step)
            nn.functional.mse_loss(ddp(x), y).backward()
        # Rank 0's gradient, averaged over the ranks, on every rank.
        reference.zero_grad()
        x0, y0 = batch(0, 1)
        out = reference.used(x0) + reference.spare(x0)
        (nn.functional.mse_loss(out, y0) / WORLD).backward()
        assert model.spare.weight.grad is not None, f"static={static}"
        assert torch.allclose(model.spare.weight.grad,
                              reference.spare.weight.grad, rtol=1e-5,
                              atol=1e-7), f"static={static}"

    def same_everywhere(t):
        gathered = [torch.zeros_like(t) for _ in range(WORLD)]
        dist.all_gather(gathered, t)
        return all(torch.equal(g, t) for g in gathered)

    # As in torch, the forward's no_sync decides whether its backward
    # communicates (the ranks' batches differ, so local gradients do too).
    model = nn.Linear(6, 3)
    ddp = dist.DistributedDataParallel(model)
    x, y = batch(RANK, 2)
    out = ddp(x)
    with ddp.no_sync():
        nn.functional.mse_loss(out, y).backward()
    assert same_everywhere(model.weight.grad), "forwarded outside: local"
    model.zero_grad()
    with ddp.no_sync():
        out = ddp(x)
    nn.functional.mse_loss(out, y).backward()
    assert WORLD == 1 or not same_everywhere(model.weight.grad), \
        "forwarded inside no_sync: communicated"

    # A forward without autograd after a training one still broadcasts
    # rank 0's buffers, as in torch: evaluation sees one set of statistics.
    normed = nn.Sequential(nn.Linear(6, 3), nn.BatchNorm1d(3))
    ddp = dist.DistributedDataParallel(normed)
    nn.functional.mse_loss(ddp(x), y).backward()  # statistics drift apart
    ddp.eval()
    with torch.no_grad():
        ddp(x)
    assert same_everywhere(normed[1].running_mean), "evaluated unsynced"
    dist.barrier()


def torch_names(flavour_name):
    """The names torch.distributed has and commdist lacked: object
    collectives, reduce_scatter_tensor, batch_isend_irecv, monitored_barrier,
    group ranks, Work's future."""
    f = Flavour(flavour_name)
    # Objects of every rank's own, of different pickled sizes.
    mine = {"rank": RANK, "payload": "x" * (10 * RANK + 1), "list": [RANK]}
    gathered = [None] * WORLD
    dist.all_gather_object(gathered, mine)
    assert [g["rank"] for g in gathered] == list(range(WORLD)), gathered
    assert gathered[WORLD - 1]["payload"] == "x" * (10 * (WORLD - 1) + 1)
    for src in range(WORLD):
        items = [src, f"from {src}", {"n": [src] * src}] if RANK == src \
            else [None, None, None]
        dist.broadcast_object_list(items, src=src)
        assert items == [src, f"from {src}", {"n": [src] * src}], items
        slots = [None] * WORLD if RANK == src else None
        dist.gather_object(("g", RANK), slots, dst=src)
        if RANK == src:
            assert slots == [("g", r) for r in range(WORLD)], slots
        out = [None]
        dist.scatter_object_list(
            out, [f"to {r} from {src}" * (r + 1) for r in range(WORLD)]
            if RANK == src else None, src=src)
        assert out == [f"to {RANK} from {src}" * (RANK + 1)], out

    # reduce_scatter_tensor: block r of the sum lands on rank r.
    count = 5
    full = f.make(np.concatenate([data_of(RANK, count, np.float32, salt=b)
                                  for b in range(WORLD)]))
    out = f.empty(count, np.float32)
    dist.reduce_scatter_tensor(out, full)
    check(f.numpy(out), reduce_reference(
        dist.ReduceOp.SUM, [data_of(r, count, np.float32, salt=RANK)
                            for r in range(WORLD)]), "reduce_scatter_tensor")

    # batch_isend_irecv: a ring exchange, both directions at once.
    right, left = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    from_left, from_right = f.empty(4, np.int64), f.empty(4, np.int64)
    ops = [dist.P2POp(dist.isend, f.make(data_of(RANK, 4, np.int64)), right),
           dist.P2POp(dist.isend, f.make(data_of(RANK, 4, np.int64, 1)), left,
                      tag=1),
           dist.P2POp(dist.irecv, from_left, left),
           dist.P2POp(dist.irecv, from_right, right, tag=1)]
    works = dist.batch_isend_irecv(ops)
    assert len(works) == 4
    for w in works:
        w.wait()
    check(f.numpy(from_left), data_of(left, 4, np.int64), "batch from left")
    check(f.numpy(from_right), data_of(right, 4, np.int64, 1),
          "batch from right")

    # torch's older private names of the two tensor collectives.
    dist._reduce_scatter_base(out, full)
    check(f.numpy(out), reduce_reference(
        dist.ReduceOp.SUM, [data_of(r, count, np.float32, salt=RANK)
                            for r in range(WORLD)]), "_reduce_scatter_base")
    whole = f.empty(count * WORLD, np.float32)
    dist._all_gather_base(whole, f.make(data_of(RANK, count, np.float32)))
    check(f.numpy(whole), np.concatenate([data_of(r, count, np.float32)
                                          for r in range(WORLD)]),
          "_all_gather_base")

    # torch.distributed's own ReduceOp values, as a script that imports
    # them passes them.
    if f.name == "torch":
        import torch.distributed as torch_dist
        for theirs, ours in ((torch_dist.ReduceOp.MAX, dist.ReduceOp.MAX),
                             (torch_dist.ReduceOp.PRODUCT,
                              dist.ReduceOp.PRODUCT)):
            x = f.make(data_of(RANK, 4, np.float64))
            dist.all_reduce(x, op=theirs)
            check(f.numpy(x), reduce_reference(
                ours, [data_of(r, 4, np.float64) for r in range(WORLD)]),
                f"all_reduce with torch's {theirs.op.name}")
        x = f.make(data_of(RANK, 4, np.float64))
        dist.reduce(x, dst=0, op=torch_dist.ReduceOp.MIN)
        if RANK == 0:
            check(f.numpy(x), reduce_reference(
                dist.ReduceOp.MIN,
                [data_of(r, 4, np.float64) for r in range(WORLD)]),
                "reduce with torch's MIN")
        try:
            dist.all_reduce(f.make(data_of(RANK, 4, np.float64)),
                            op=torch_dist.ReduceOp.PREMUL_SUM)
            raise AssertionError("PREMUL_SUM was accepted")
        except dist.UnsupportedError as e:
            assert "PREMUL_SUM" in str(e), e

    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))

    # Group ranks, and a subgroup of the last two ranks.
    assert dist.get_process_group_ranks(dist.group.WORLD) == list(range(WORLD))
    tail = [WORLD - 2, WORLD - 1]
    sub = dist.new_group(tail)
    if RANK in tail:
        assert dist.get_process_group_ranks(sub) == tail
        assert dist.get_global_rank(sub, 1) == WORLD - 1
        assert dist.get_group_rank(sub, WORLD - 1) == 1
        try:
            dist.get_group_rank(sub, 0)
            raise AssertionError("rank 0 was given a rank in the subgroup")
        except dist.InvalidArgument as e:
            assert "not a member" in str(e), e
        assert dist.get_backend(sub) == dist.get_backend() == "gloo"
        dist.monitored_barrier(group=sub, timeout=30)
    else:
        assert dist.get_rank(sub) == -1
        assert dist.monitored_barrier(group=sub) is None

    # Work.result and get_future: the output tensors, once complete.
    x = f.make(data_of(RANK, 3, np.float64))
    work = dist.all_reduce(x, async_op=True)
    future = work.get_future()
    [value] = future.wait()
    assert value is x
    work.wait(datetime.timedelta(seconds=30))
    assert work.result()[0] is x
    check(f.numpy(x), reduce_reference(
        dist.ReduceOp.SUM, [data_of(r, 3, np.float64) for r in range(WORLD)]),
        "all_reduce with a future")


def monitored_barrier_names_the_absent(_):
    """The last rank never arrives: rank 0 raises TimeoutError naming it
    after the timeout."""
    if RANK == WORLD - 1:
        time.sleep(4)
        os._exit(0)
    start = time.monotonic()
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=1),
                               wait_all_ranks=True)
    except dist.TimeoutError as e:
        if RANK == 0:
            assert f"rank {WORLD - 1} did not reach" in str(e), str(e)
        print(f"rank {RANK}: TimeoutError: {e}", flush=True)
    else:
        raise AssertionError("monitored_barrier passed without a rank")
    assert time.monotonic() - start < 20
    os._exit(0)


def monitored_barrier_after_a_timeout(_):
    """The last rank reaches the first monitored_barrier after rank 0 gave
    up on it: that barrier fails on every rank (on the late one as soon as
    it arrives, from rank 0's answer rather than its own timeout), and what
    follows with every rank there works: a monitored_barrier, a collective,
    and another monitored_barrier."""
    late = WORLD - 1
    if RANK == late:
        time.sleep(3)
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=1))
    except dist.TimeoutError as e:
        print(f"rank {RANK}: TimeoutError: {e}", flush=True)
        if RANK == 0:
            assert f"rank {late} did not reach the barrier" in str(e), str(e)
        if RANK == late:
            assert "this rank arrived after rank 0 gave up on the barrier: " \
                f"rank {late} did not reach the barrier" in str(e), str(e)
    else:
        raise AssertionError(f"rank {RANK}: a monitored_barrier passed "
                             f"without rank {late}")
    start = time.monotonic()
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
    x = np.full(4, RANK + 1, dtype=np.int64)
    dist.all_reduce(x)
    assert (x == WORLD * (WORLD + 1) // 2).all(), x
    dist.monitored_barrier(timeout=30, wait_all_ranks=True)
    assert time.monotonic() - start < 20
    print(f"rank {RANK}: monitored_barrier after a timeout ok", flush=True)


def complex_values(flavour_name):
    """Complex arrays and tensors travel as their real and imaginary parts,
    as torch.distributed hands them to its backends: sums and averages,
    the copying collectives and point-to-point; other reductions are
    refused."""
    f = Flavour(flavour_name)

    def mine(rank, count, salt=0):
        re = data_of(rank, count, np.float32, salt)
        im = data_of(rank, count, np.float32, salt + 7)
        return (re + 1j * im).astype(np.complex64)

    count = 6
    everyone = [mine(r, count) for r in range(WORLD)]
    x = f.make(mine(RANK, count))
    dist.all_reduce(x)
    check(f.numpy(x), sum(everyone), "complex all_reduce")
    x = f.make(mine(RANK, count))
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    check(f.numpy(x), sum(everyone) / WORLD, "complex all_reduce AVG")
    x = f.make(mine(RANK, count))
    dist.reduce(x, dst=WORLD - 1)
    if RANK == WORLD - 1:
        check(f.numpy(x), sum(everyone), "complex reduce")
    x = f.make(mine(RANK, count) if RANK == 0 else np.zeros(count, np.complex64))
    dist.broadcast(x, src=0)
    check(f.numpy(x), everyone[0], "complex broadcast")
    outs = [f.make(np.zeros(count, np.complex64)) for _ in range(WORLD)]
    dist.all_gather(outs, f.make(mine(RANK, count)))
    for r in range(WORLD):
        check(f.numpy(outs[r]), everyone[r], f"complex all_gather from {r}")
    # all_to_all_single with split sizes: rows along dim 0 stay rows.
    splits = [r + 1 for r in range(WORLD)]
    send = f.make(mine(RANK, sum(splits), salt=3))
    recv = f.make(np.zeros((RANK + 1) * WORLD, np.complex64))
    dist.all_to_all_single(recv, send, [RANK + 1] * WORLD, splits)
    expected = np.concatenate(
        [mine(r, sum(splits), salt=3)[sum(splits[:RANK]):
                                      sum(splits[:RANK + 1])]
         for r in range(WORLD)])
    check(f.numpy(recv), expected, "complex all_to_all_single")
    if WORLD > 1:
        right, left = (RANK + 1) % WORLD, (RANK - 1) % WORLD
        got = f.make(np.zeros(count, np.complex64))
        works = [dist.isend(f.make(mine(RANK, count, salt=5)), right),
                 dist.irecv(got, left)]
        for w in works:
            w.wait()
        check(f.numpy(got), mine(left, count, salt=5), "complex isend/irecv")
    try:
        dist.all_reduce(f.make(mine(RANK, count)), op=dist.ReduceOp.MAX)
        raise AssertionError("MAX on complex values was accepted")
    except dist.UnsupportedError as e:
        assert "MAX is not defined on complex values" in str(e), e
    print(f"rank {RANK}: complex values ok", flush=True)


def future_callback_at_exit(_):
    """A callback chained on get_future() is still running when the script
    ends: the process must wait for it and exit cleanly, not abort in the
    thread that completes the future."""
    import torch
    if RANK == 0:
        got = torch.zeros(4)
        work = dist.irecv(got, 1)
        future = work.get_future()

        def slow(_):
            time.sleep(0.5)
            return True

        chained = future.then(slow)
        future.wait()
        assert got.tolist() == [1.0, 2.0, 3.0, 4.0], got
        del chained
    else:
        time.sleep(0.2)
        dist.send(torch.tensor([1.0, 2.0, 3.0, 4.0]), 0)


def futures_share_threads(_):
    """Many pending get_future()s hold no thread each: rank 0 posts
    futures_count receives, whose futures complete with the right tensors
    once rank 1 sends; a callback chained on the first waits for the last
    one's future, which the settling threads must still complete; a
    future the script completed itself does not stop the others; a child
    forked meanwhile starts with no pending future; the threads end once
    nothing is pending; and a coalesced call's future waits for all its
    operations. World 2."""
    import threading
    import torch
    futures_count = 100
    threads_before = threading.active_count()
    if RANK == 0:
        # A future the script completes itself: settling it fails, and
        # the other futures must not care.
        completed_here = dist.irecv(torch.zeros(1), 1,
                                    tag=futures_count + 1).get_future()
        completed_here.set_result(None)
        got = [torch.zeros(2) for _ in range(futures_count)]
        futures = [dist.irecv(t, 1, tag=i).get_future()
                   for i, t in enumerate(got)]
        waits_for_last = futures[0].then(
            lambda f: futures[-1].wait()[0].tolist())
        threads_pending = threading.active_count() - threads_before
        assert threads_pending <= 1, (
            f"{threads_pending} threads for {futures_count} pending futures")
        # A child forked now has none of the threads: it starts afresh.
        child = os.fork()
        if child == 0:
            settler = dist._future_settler
            os._exit(0 if not settler._pending and settler._threads == 0
                     else 3)
        assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0, (
            "a forked child kept the parent's pending futures")
        dist.send(torch.ones(1), 1, tag=futures_count)  # rank 1: go
        for i, future in enumerate(futures):
            [value] = future.wait()
            assert value is got[i], (i, value)
            assert value.tolist() == [i, -i], (i, value)
        assert waits_for_last.wait() == [futures_count - 1,
                                         1 - futures_count]
        deadline = time.monotonic() + 10
        while (threading.active_count() > threads_before
               and time.monotonic() < deadline):
            time.sleep(0.01)
        assert threading.active_count() == threads_before, (
            "the settling threads outlived the last pending future: "
            f"{[t.name for t in threading.enumerate()]}")
    else:
        dist.recv(torch.zeros(1), 0, tag=futures_count)
        dist.send(torch.ones(1), 0, tag=futures_count + 1)
        for i in range(futures_count):
            dist.send(torch.tensor([float(i), float(-i)]), 0, tag=i)
    # A coalesced call's future completes once each of its operations has.
    if RANK == 1:
        time.sleep(0.3)
    tensors = [torch.full((3,), RANK + 1.0), torch.full((5,), RANK + 10.0)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        future = dist.all_reduce_coalesced(tensors, async_op=True)
    values = future.wait()
    assert [v.tolist() for v in values] == [[3.0] * 3, [21.0] * 5], values
    print(f"rank {RANK}: futures share threads ok", flush=True)


def shared_host_mappings():
    """How many mappings of libcomm's shared host memory this process has."""
    with open("/proc/self/maps") as maps:
        return sum("libcomm-shared-host" in line for line in maps)


def in_shared_host_memory(address):
    """Whether `address` lies in a mapping of libcomm's shared host
    memory."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "libcomm-shared-host" not in line:
                continue
            begin, end = (int(x, 16) for x in line.split()[0].split("-"))
            if begin <= address < end:
                return True
    return False


def shared_host(flavour_name):
    """Arrays (or torch tensors over them) in shared host memory: results
    as with ordinary memory, read through mappings of the peers' blocks;
    and a rank that passes ordinary memory beside them is a MismatchError
    on every rank."""
    count = 70001  # 280 KB of float32, above the shared threshold
    mine = dist.shared_host_array(count, np.float32)
    assert mine.shape == (count,) and not mine.any()
    mine[:] = data_of(RANK, count, np.float32)
    gathered = dist.shared_host_array((WORLD, count), "float32")
    own = shared_host_mappings()
    if flavour_name == "torch":
        import torch
        dist.all_gather_into_tensor(torch.from_numpy(gathered),
                                    torch.from_numpy(mine))
    else:
        dist.all_gather([gathered[r] for r in range(WORLD)], mine)
    for r in range(WORLD):
        check(gathered[r], data_of(r, count, np.float32), f"block {r}")
    total = dist.shared_host_array(count, np.float32)
    total[:] = mine
    dist.all_reduce(total)
    check(total, sum(data_of(r, count, np.float32) for r in range(WORLD)),
          "all_reduce")
    if WORLD > 1:
        # This rank mapped each peer's gathered input.
        assert shared_host_mappings() >= own + WORLD - 1, (
            own, shared_host_mappings())
        # In a group of its own, since a mismatch fails the group it
        # happens in for good.
        mixed = dist.new_group(list(range(WORLD)))
        ordinary = np.zeros((WORLD, count), np.float32)
        try:
            if RANK == 0:
                dist.all_gather([ordinary[r] for r in range(WORLD)], mine,
                                group=mixed)
            else:
                dist.all_gather([gathered[r] for r in range(WORLD)], mine,
                                group=mixed)
        except dist.MismatchError as e:
            assert RANK != 0 or "shared host memory" in str(e), str(e)
        else:
            raise AssertionError("mixed shared and ordinary memory passed")
        dist.destroy_process_group(mixed)
    try:
        dist.shared_host_array((2, -1))
    except dist.InvalidArgument as e:
        assert "0 or more" in str(e), str(e)
    else:
        raise AssertionError("a negative size was accepted")


SCENARIOS = {
    "shared_host": shared_host,
    "torch_names": torch_names,
    "monitored_barrier_names_the_absent": monitored_barrier_names_the_absent,
    "monitored_barrier_after_a_timeout": monitored_barrier_after_a_timeout,
    "ddp_features": ddp_features,
    "collectives": collectives,
    "complex_values": complex_values,
    "point_to_point": point_to_point,
    "subgroups": subgroups,
    "coalesced": coalesced,
    "future_callback_at_exit": future_callback_at_exit,
    "futures_share_threads": futures_share_threads,
    "dead_peer": dead_peer,
}


def main():
    scenario, flavour, store_path = sys.argv[1], sys.argv[2], sys.argv[3]
    # As torch scripts name it; get_backend() reports it as given.
    dist.init_process_group(
        "gloo", init_method=f"file://{store_path}", rank=RANK,
        world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    SCENARIOS[scenario](flavour)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {RANK}: {scenario} {flavour} ok")


if __name__ == "__main__":
    main()
