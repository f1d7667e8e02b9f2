"""commdist on torch's CUDA tensors over libcomm's NCCL backend: every
collective in place on the tensor's own memory, ordered on torch's current
stream as torch.distributed's NCCL backend orders it. NCCL takes one rank
per GPU, so on a machine with one GPU the group has one rank. Skipped, with
the reason, where torch has no CUDA (Debian's python3-torch) or sees no
GPU, or libcomm was built without NCCL."""

import contextlib
import datetime

import pytest
import torch

import commdist as dist

SECONDS = datetime.timedelta(seconds=60)



def _why_skipped():
    if torch.version.cuda is None:
        return ("torch was built without CUDA (Debian's python3-torch is "
                "CPU-only), so there are no CUDA tensors to test")
    if torch.cuda.device_count() == 0:
        return "torch has CUDA but sees no CUDA device"
    if not dist.is_nccl_available():
        return "libcomm was built without its NCCL backend"
    return None


# Each test is reported skipped with the reason (pytest -rs prints it).
pytestmark = pytest.mark.skipif(_why_skipped() is not None,
                                reason=str(_why_skipped()))


@pytest.fixture(params=["nccl", "cpu:gloo,cuda:nccl"])
def group_of_one(request):
    dist.init_process_group(request.param, store=dist.HashStore(), rank=0,
                            world_size=1, timeout=SECONDS)
    yield request.param
    dist.destroy_process_group()


def fresh(n, value=None, dtype=torch.float32):
    """Random (or constant) CUDA data of n elements: never zeros, which
    would hide an output nothing wrote."""
    if value is None:
        return torch.randn(n, device="cuda", dtype=dtype)
    return torch.full((n,), value, device="cuda", dtype=dtype)


def test_every_collective_works_in_place_on_cuda_tensors(group_of_one):
    n = 1003
    t = fresh(n)
    expected = t.clone()
    pointer = t.data_ptr()
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    dist.reduce(t, dst=0, op=dist.ReduceOp.MAX)
    torch.cuda.synchronize()
    assert t.data_ptr() == pointer
    assert torch.equal(t, expected)

    gathered = [fresh(n, -1.0)]
    dist.all_gather(gathered, t)
    flat = fresh(n, -1.0)
    dist.all_gather_into_tensor(flat, t)
    scattered = fresh(n, -1.0)
    dist.reduce_scatter(scattered, [t])
    scattered_flat = fresh(n, -1.0)
    dist.reduce_scatter_tensor(scattered_flat, t)
    single = fresh(n, -1.0)
    dist.all_to_all_single(single, t)
    lists = [fresh(n, -1.0)]
    dist.all_to_all(lists, [t])
    gather_list = [fresh(n, -1.0)]
    dist.gather(t, gather_list, dst=0)
    out = fresh(n, -1.0)
    dist.scatter(out, [t], src=0)
    dist.barrier()
    torch.cuda.synchronize()
    for result in (gathered[0], flat, scattered, scattered_flat, single,
                   lists[0], gather_list[0], out):
        assert torch.equal(result, expected)


def test_reductions_cover_the_dtypes_nccl_has(group_of_one):
    for dtype in (torch.float16, torch.bfloat16, torch.float64, torch.int32,
                  torch.int64, torch.uint8, torch.int8):
        t = fresh(257, 3, dtype)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
        torch.cuda.synchronize()
        assert torch.equal(t, fresh(257, 3, dtype)), dtype
    flags = torch.ones(5, dtype=torch.bool, device="cuda")
    dist.all_reduce(flags)
    torch.cuda.synchronize()
    assert bool(flags.all())


@contextlib.contextmanager
def behind_a_long_kernel():
    """Runs the block with a new side stream as torch's current stream,
    behind a kernel of a few tenths of a second, once all earlier work is
    done: the work the block queues runs late, so a read of its results
    out of stream order would see the old values."""
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.Stream()):
        torch.cuda._sleep(200_000_000)
        yield


def test_a_collective_runs_after_the_kernels_on_torchs_current_stream(
        group_of_one):
    """The input is written on a side stream only after a long kernel; the
    collective, issued on that stream, must read it, and a kernel queued on
    the same stream after it must see its output, with no host wait."""
    x = fresh(1 << 22, 0.0)
    out = fresh(1 << 22, -1.0)
    with behind_a_long_kernel():
        x.fill_(1.0)
        dist.all_gather_into_tensor(out, x)
        doubled = out * 2
    torch.cuda.synchronize()
    assert torch.equal(out, torch.ones_like(out))
    assert torch.equal(doubled, torch.full_like(out, 2.0))


def test_async_work_orders_the_stream_current_at_wait(group_of_one):
    t = fresh(1 << 20, 0.0)
    with behind_a_long_kernel():
        t.fill_(4.0)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        after = t + 1
    torch.cuda.synchronize()
    assert torch.equal(after, torch.full_like(t, 5.0))


def test_a_future_completes_once_the_gpu_has_finished(group_of_one):
    t = fresh(1 << 20, 0.0)
    with behind_a_long_kernel():
        t.fill_(4.0)
        future = dist.all_reduce(t, async_op=True).get_future()
    result = future.wait()
    # Read on a stream of its own, which nothing orders after the side
    # stream (the legacy default stream would be, by the wait inside the
    # future's thread): only the future's completing after the operation
    # makes the read see its result.
    with torch.cuda.stream(torch.cuda.Stream()):
        host = result[0].cpu()
    assert torch.equal(host, torch.full((1 << 20,), 4.0))


def test_all_to_all_of_lists_on_a_side_stream(group_of_one):
    x = fresh(1 << 20, 0.0)
    out = [fresh(1 << 20, -1.0)]
    with behind_a_long_kernel():
        x.fill_(7.0)
        dist.all_to_all(out, [x])
        after = out[0] + 1
    torch.cuda.synchronize()
    assert torch.equal(after, torch.full_like(x, 8.0))


def test_object_collectives_on_an_nccl_group():
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0,
                            world_size=1, timeout=SECONDS)
    try:
        objects = [None]
        dist.all_gather_object(objects, {"step": 3, "loss": 0.5})
        assert objects == [{"step": 3, "loss": 0.5}]
        shared = ["from rank 0"]
        dist.broadcast_object_list(shared, src=0)
        assert shared == ["from rank 0"]
    finally:
        dist.destroy_process_group()


def test_host_tensors_on_an_nccl_only_group_are_refused_untouched():
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0,
                            world_size=1, timeout=SECONDS)
    try:
        host = torch.ones(4)
        with pytest.raises(dist.InvalidArgument, match="host memory"):
            dist.all_reduce(host)
        assert torch.equal(host, torch.ones(4))
    finally:
        dist.destroy_process_group()
