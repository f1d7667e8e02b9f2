"""commdist in one process: errors, stores, the sampler, and the shape of
the API (a group of one rank over a HashStore)."""

import datetime
import os
import time

import numpy as np
import pytest
import torch

import commdist as dist


@pytest.fixture
def world_of_one():
    dist.init_process_group("tcp", store=dist.HashStore(), rank=0,
                            world_size=1, timeout=30)
    yield
    dist.destroy_process_group()


def test_non_contiguous_array_is_refused_untouched(world_of_one):
    base = np.arange(16, dtype=np.float32).reshape(4, 4)
    before = base.copy()
    with pytest.raises(dist.InvalidArgument, match="not contiguous"):
        dist.all_reduce(base[:, ::2])
    with pytest.raises(ValueError, match="contiguous"):  # also a ValueError
        dist.broadcast(torch.arange(16.).reshape(4, 4).t(), src=0)
    assert np.array_equal(base, before)


def test_read_only_array_is_refused_for_an_in_place_op(world_of_one):
    frozen = np.arange(8, dtype=np.int64)
    frozen.flags.writeable = False
    with pytest.raises(dist.InvalidArgument, match="read-only"):
        dist.all_reduce(frozen)
    assert np.array_equal(frozen, np.arange(8))
    # Reading a read-only array is fine.
    out = [np.zeros(8, dtype=np.int64)]
    dist.all_gather(out, frozen)
    assert np.array_equal(out[0], frozen)


@pytest.mark.parametrize("make", [
    # Complex values travel as their parts; long double ones have none
    # libcomm moves.
    lambda: np.zeros(4, dtype=np.clongdouble),
    lambda: np.zeros(4, dtype=np.uint16),
    lambda: torch.zeros(4, dtype=torch.int16),
])
def test_unsupported_dtype_is_refused_untouched(world_of_one, make):
    x = make()
    x[0] = 3
    with pytest.raises(dist.InvalidArgument, match="dtype|format"):
        dist.all_reduce(x)
    assert x[0] == 3 and x[1] == 0


def test_other_bad_arguments(world_of_one):
    with pytest.raises(dist.InvalidArgument, match="numpy array or a torch"):
        dist.all_reduce([1.0, 2.0])
    with pytest.raises(dist.InvalidArgument, match="root 1"):
        dist.broadcast(np.zeros(2), src=1)
    with pytest.raises(dist.InvalidArgument, match="bitwise|float"):
        dist.all_reduce(np.zeros(2), op=dist.ReduceOp.BXOR)
    with pytest.raises(dist.InvalidArgument, match="exists already"):
        dist.init_process_group("tcp", store=dist.HashStore(), rank=0,
                                world_size=1)


def test_a_polled_work_has_its_outputs_in_place(world_of_one):
    # all_to_all of lists stages its outputs; a caller that polls
    # is_completed() and never waits finds them written, as with torch.
    out = [np.zeros(3, dtype=np.float32)]
    work = dist.all_to_all(out, [np.arange(3, dtype=np.float32)],
                           async_op=True)
    for _ in range(1000):  # at most 10 s
        if work.is_completed():
            break
        time.sleep(0.01)
    assert work.is_completed()
    assert np.array_equal(out[0], np.arange(3))
    work.wait()


def test_destroy_process_group_ends_every_group():
    dist.init_process_group("tcp", store=dist.HashStore(), rank=0,
                            world_size=1, timeout=30)
    sub = dist.new_group([0])
    # torch 1.13 fails with a TypeError from deep inside; commdist says why.
    with pytest.raises(dist.InvalidArgument, match="list of ranks is empty"):
        dist.new_group([])
    dist.destroy_process_group()
    with pytest.raises(dist.BackendError, match="shut down"):
        dist.all_reduce(np.ones(2, dtype=np.float32), group=sub)


def test_reduce_scatter_tensor_names_a_non_contiguous_input(world_of_one):
    spaced = np.zeros(8, dtype=np.float32)[::2]
    with pytest.raises(dist.InvalidArgument,
                       match="reduce_scatter_tensor: input is not contiguous"):
        dist.reduce_scatter_tensor(np.zeros(4, dtype=np.float32), spaced)


def test_unknown_backend_is_named():
    with pytest.raises(dist.InvalidArgument,
                       match="carrier-pigeon.*gloo.*tcp"):
        dist.init_process_group("carrier-pigeon", store=dist.HashStore(),
                                rank=0, world_size=1)
    with pytest.raises(dist.InvalidArgument, match="'ucc'"):
        dist.init_process_group("cpu:ucc,cuda:nccl", store=dist.HashStore(),
                                rank=0, world_size=1)
    assert not dist.is_initialized()


def test_not_initialized_says_so():
    assert not dist.is_initialized()
    with pytest.raises(dist.InvalidArgument, match="init_process_group"):
        dist.get_rank()


def test_api_mirrors_torch_distributed(world_of_one):
    assert dist.is_initialized()
    assert (dist.get_rank(), dist.get_world_size(), dist.get_backend()) == \
        (0, 1, "tcp")
    # At world 1 a correct all_reduce leaves its input as it is, so it could
    # not tell a working call from one that does nothing; an all_gather
    # writes an output that a call doing nothing would leave zero. (AVG and
    # the other reductions are checked against references at world 3 in
    # test_collectives.py.)
    x = torch.arange(1.0, 4.0)
    out = [torch.zeros(3)]
    work = dist.all_gather(out, x, async_op=True)
    assert isinstance(work, dist.Work)
    assert work.wait(timeout=10) is True
    assert work.is_completed() and work.is_success()
    assert work.exception() is None
    assert torch.equal(out[0], torch.tensor([1.0, 2.0, 3.0]))
    # Every name torch.distributed users reach for exists.
    for name in ["all_reduce", "broadcast", "reduce", "all_gather", "gather",
                 "scatter", "reduce_scatter", "all_to_all", "barrier", "send",
                 "recv", "isend", "irecv", "new_group",
                 "destroy_process_group", "TCPStore", "FileStore",
                 "HashStore", "PrefixStore", "ReduceOp", "Work"]:
        assert hasattr(dist, name), name
    # The exception hierarchy mirrors the C++ one.
    assert issubclass(dist.UnsupportedError, dist.InvalidArgument)
    assert issubclass(dist.TimeoutError, TimeoutError)
    for cls in [dist.InvalidArgument, dist.TimeoutError, dist.PeerError,
                dist.MismatchError, dist.BackendError]:
        assert issubclass(cls, dist.Error) and issubclass(cls, RuntimeError)


def test_tcp_store_and_prefix_store():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True,
                           timeout=datetime.timedelta(seconds=10))
    client = dist.TCPStore("127.0.0.1", server.port, timeout=10)
    server.set("key", b"value")
    assert client.get("key") == b"value"
    client.set("text", "as torch takes it")  # str is stored as UTF-8
    assert server.get("text") == b"as torch takes it"
    assert server.compare_set("text", "as torch takes it", b"swapped") == \
        b"swapped"
    assert client.add("n", 2) == 2 and server.add("n", 3) == 5
    client.wait(["key", "n"])
    with pytest.raises(dist.TimeoutError, match="absent"):
        client.wait(["absent"], timeout=0.05)
    prefixed = dist.PrefixStore("job", client)
    prefixed.set("x", b"1")
    assert server.get("job/x") == b"1"
    assert server.check(["job/x"]) and not server.check(["x"])
    assert server.delete_key("key") and not server.delete_key("key")


def test_file_store_shared_by_two_handles(tmp_path):
    a = dist.FileStore(str(tmp_path / "s"))
    b = dist.FileStore(str(tmp_path / "s"))
    a.set("k", b"\x00\x01binary")
    assert b.get("k") == b"\x00\x01binary"
    assert b.num_keys() >= 1


def test_distributed_sampler_partitions_the_dataset():
    seen = []
    for rank in range(3):
        sampler = dist.DistributedSampler(12, num_replicas=3, rank=rank,
                                          seed=7)
        sampler.set_epoch(2)
        indices = list(sampler)
        assert len(indices) == len(sampler) == 4
        seen += indices
    assert sorted(seen) == list(range(12))
    # The order depends on seed and epoch alone.
    def order(epoch, seed=7):
        s = dist.DistributedSampler(12, num_replicas=1, rank=0, seed=seed)
        s.set_epoch(epoch)
        return list(s)
    assert order(3) == order(3)
    assert order(3) != order(4) and order(3) != order(3, seed=8)
    padded = dist.DistributedSampler(10, num_replicas=4, rank=3)
    assert len(padded) == 3
    dropped = dist.DistributedSampler(10, num_replicas=4, rank=3,
                                      drop_last=True)
    assert len(dropped) == 2
