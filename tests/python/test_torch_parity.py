"""commdist behaves as torch.distributed where torch users rely on it:
the names and signatures, timedelta timeouts, the backend name asked for,
the store's key count, DistributedDataParallel as an nn.Module with torch's
state-dict layout and arguments. Compared against Debian's torch itself
where it can be."""

import datetime
import inspect
import os
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as torch_dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import commdist as dist
from test_collectives import run_ranks

SECONDS = datetime.timedelta(seconds=30)


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0,
                            world_size=1, timeout=SECONDS)
    yield
    dist.destroy_process_group()


@pytest.fixture
def torch_world_of_one():
    """torch's own gloo group of one rank, beside commdist's."""
    torch_dist.init_process_group("gloo", store=torch_dist.HashStore(),
                                  rank=0, world_size=1)
    yield
    torch_dist.destroy_process_group()


FUNCTIONS = [
    "all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce",
    "all_to_all", "all_to_all_single", "barrier", "batch_isend_irecv",
    "broadcast", "broadcast_object_list", "destroy_process_group", "gather",
    "gather_object", "get_backend", "get_global_rank", "get_group_rank",
    "get_process_group_ranks", "get_rank", "get_world_size",
    "init_process_group", "irecv", "is_available", "is_gloo_available",
    "is_initialized", "is_mpi_available", "is_nccl_available",
    "is_torchelastic_launched", "is_ucc_available", "isend",
    "monitored_barrier", "new_group", "new_subgroups",
    "new_subgroups_by_enumeration", "all_reduce_coalesced",
    "all_gather_coalesced", "recv", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "scatter", "scatter_object_list", "send",
    "_all_gather_base", "_reduce_scatter_base",
]


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_has_torchs_parameters(name):
    ours = inspect.signature(getattr(dist, name)).parameters
    theirs = inspect.signature(getattr(torch_dist, name)).parameters
    assert list(ours) == list(theirs), (list(ours), list(theirs))


def test_classes_and_constants_have_torchs_shape(world_of_one):
    assert list(inspect.signature(dist.P2POp).parameters) == \
        list(inspect.signature(torch_dist.P2POp).parameters)
    assert dist.group.WORLD is dist.GroupMember.WORLD is not None
    assert dist.get_process_group_ranks(dist.group.WORLD) == [0]
    assert dist.get_global_rank(dist.group.WORLD, 0) == 0
    assert dist.is_available() and dist.is_gloo_available()
    assert not dist.is_mpi_available() and not dist.is_ucc_available()
    assert dist.is_nccl_available() in (True, False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert dist.reduce_op.SUM == dist.ReduceOp.SUM
    assert "deprecated" in str(caught[0].message)
    # Backend names as torch checks them: known ones in any case, others a
    # ValueError naming them.
    assert dist.Backend("GLOO") == torch_dist.Backend("GLOO") == "gloo"
    assert dist.Backend("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    with pytest.raises(ValueError, match="Invalid backend: 'foo'"):
        torch_dist.Backend("foo")
    with pytest.raises(ValueError, match="Invalid backend: 'foo'"):
        dist.Backend("foo")


def test_is_torchelastic_launched_follows_the_launcher(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert dist.is_torchelastic_launched() is False
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "7")
    assert dist.is_torchelastic_launched() is True


def test_timeouts_take_timedelta_everywhere():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0,
                            world_size=1,
                            timeout=datetime.timedelta(minutes=1))
    try:
        work = dist.all_reduce(np.ones(3), async_op=True)
        assert work.wait(timeout=datetime.timedelta(seconds=10)) is True
        assert work.wait(datetime.timedelta(0)) is True
        store = dist.HashStore(datetime.timedelta(seconds=5))
        with pytest.raises(dist.TimeoutError, match="absent"):
            store.wait(["absent"], datetime.timedelta(milliseconds=50))
        store.set_timeout(datetime.timedelta(seconds=2))
        assert store.timeout == datetime.timedelta(seconds=2)
        assert type(store.timeout) is type(torch_dist.HashStore().timeout)
        with pytest.raises(dist.InvalidArgument, match="timeout must be"):
            work.wait(datetime.timedelta(seconds=-1))
    finally:
        dist.destroy_process_group()


def test_get_backend_is_the_name_asked_for():
    for asked, expected in [("gloo", "gloo"), ("GLOO", "gloo"),
                            ("tcp", "tcp"), (None, "gloo")]:
        dist.init_process_group(asked, store=dist.HashStore(), rank=0,
                                world_size=1)
        try:
            assert dist.get_backend() == expected
            assert dist.get_backend() == getattr(dist.Backend,
                                                 expected.upper())
        finally:
            dist.destroy_process_group()
    if dist.is_nccl_available():
        # A spec per device, gloo inside it read as libcomm's TCP backend.
        dist.init_process_group("cpu:gloo,cuda:nccl", store=dist.HashStore(),
                                rank=0, world_size=1)
        try:
            assert dist.get_backend() == "cpu:gloo,cuda:nccl"
            x = np.ones(3)
            dist.all_reduce(x)
            assert np.array_equal(x, np.ones(3))
        finally:
            dist.destroy_process_group()


def test_num_keys_counts_as_torchs_tcp_store():
    counts = []
    for module in (dist, torch_dist):
        server = module.TCPStore("127.0.0.1", 0, 1, True, SECONDS)
        counts.append([server.num_keys()])
        server.set("a", b"1")
        server.set("b", b"2")
        counts[-1].append(server.num_keys())
        loose = module.TCPStore("127.0.0.1", 0, is_master=True,
                                timeout=SECONDS)
        loose.set("a", b"1")
        counts[-1].append(loose.num_keys())
    assert counts[0] == counts[1], counts


def test_a_sparse_tensor_is_invalid_argument(world_of_one):
    sparse = torch.eye(3).to_sparse()
    with pytest.raises(dist.InvalidArgument, match="sparse.*to_dense"):
        dist.all_reduce(sparse)
    with pytest.raises(dist.InvalidArgument, match="sparse"):
        dist.broadcast(sparse, src=0)
    dense = torch.ones(3)
    dist.all_reduce(dense)  # the group is still usable
    assert torch.equal(dense, torch.ones(3))


def test_work_result_and_future(world_of_one):
    x = torch.arange(3.0)
    out = [torch.zeros(3)]
    work = dist.all_gather(out, x, async_op=True)
    [value] = work.get_future().wait()
    assert value is out[0] and torch.equal(value, x)
    assert work.result() == out


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.norm = nn.BatchNorm1d(3)
        self.spare = nn.Linear(4, 3)

    def forward(self, x):
        return self.norm(self.fc(x))


def test_ddp_is_a_module_with_torchs_state_dict(world_of_one,
                                                torch_world_of_one):
    torch.manual_seed(0)
    model = Net()
    ours = dist.DistributedDataParallel(model, find_unused_parameters=True)
    theirs = torch.nn.parallel.DistributedDataParallel(
        Net(), find_unused_parameters=True)
    assert isinstance(ours, nn.Module) and ours.module is model
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_parameters()] == \
        [n for n, _ in theirs.named_parameters()]
    # A checkpoint of torch's DDP loads through the wrapper, and back.
    ours.load_state_dict(theirs.state_dict())
    assert torch.equal(model.fc.weight, theirs.module.fc.weight)
    theirs.load_state_dict(ours.state_dict())
    # train/eval/to/zero_grad/parameters reach the module.
    ours.eval()
    assert not model.training and not model.norm.training
    ours.train()
    assert model.training
    assert ours.to(torch.device("cpu")) is ours
    assert [id(p) for p in ours.parameters()] == \
        [id(p) for p in model.parameters()]
    x = torch.randn(5, 4)
    ours(x).sum().backward()
    assert model.fc.weight.grad is not None
    # Unused: grad None, as torch's leaves it.
    assert model.spare.weight.grad is None
    ours.zero_grad(set_to_none=False)
    assert torch.count_nonzero(model.fc.weight.grad) == 0
    ours.zero_grad(set_to_none=True)
    assert model.fc.weight.grad is None
    ours(x).sum().backward()
    assert model.fc.weight.grad is not None


def test_ddp_to_another_dtype_is_registered_again(world_of_one):
    model = nn.Linear(3, 2)
    ddp = dist.DistributedDataParallel(model)
    ddp.to(torch.float64)
    ddp(torch.randn(4, 3, dtype=torch.float64)).sum().backward()
    assert model.weight.grad.dtype == torch.float64


def test_ddp_refuses_a_channels_last_module_saying_what_to_do(world_of_one):
    model = nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
    with pytest.raises(dist.InvalidArgument,
                       match="not contiguous.*contiguous_format"):
        dist.DistributedDataParallel(model)


def test_ddp_constructor_arguments(world_of_one):
    cpu = torch.device("cpu")
    for kwargs in [dict(device_ids=None), dict(device_ids=[cpu]),
                   dict(device_ids=["cpu"], output_device="cpu"),
                   dict(output_device=cpu), dict(static_graph=True),
                   dict(broadcast_buffers=False, bucket_cap_mb=1,
                        gradient_as_bucket_view=True, check_reduction=False)]:
        ddp = dist.DistributedDataParallel(nn.Linear(3, 2), **kwargs)
        ddp(torch.randn(2, 3)).sum().backward()
    # A CUDA device must be the module's: this one is on the CPU.
    with pytest.raises(dist.InvalidArgument, match="cuda:0.*cpu"):
        dist.DistributedDataParallel(nn.Linear(3, 2), device_ids=[0])
    with pytest.raises(dist.InvalidArgument, match="single element"):
        dist.DistributedDataParallel(nn.Linear(3, 2), device_ids=["cpu",
                                                                  "cpu"])


def test_register_comm_hook_takes_torchs_builtin_hooks(world_of_one):
    torch.manual_seed(0)
    x = torch.randn(4, 3)
    grads = {}
    for hook in (default_hooks.allreduce_hook,
                 default_hooks.fp16_compress_hook):
        torch.manual_seed(1)
        model = nn.Linear(3, 2)
        ddp = dist.DistributedDataParallel(model)
        ddp.register_comm_hook(dist.group.WORLD, hook)
        ddp(x).sum().backward()
        grads[hook.__name__] = model.weight.grad.clone()
        with pytest.raises(dist.InvalidArgument, match="once"):
            ddp.register_comm_hook(None, hook)
    # fp16 rounds; at world 1 the values are fp16's rounding of the same.
    assert torch.equal(grads["fp16_compress_hook"],
                       grads["allreduce_hook"].half().float())

    def my_hook(state, bucket):
        return bucket.buffer()

    ddp = dist.DistributedDataParallel(nn.Linear(3, 2))
    with pytest.raises(dist.UnsupportedError, match="my_hook.*built-in"):
        ddp.register_comm_hook(None, my_hook)


def test_torchs_names_across_ranks(tmp_path):
    run_ranks(tmp_path, "torch_names", "torch", 3)
    run_ranks(tmp_path, "torch_names", "numpy", 3)


def test_monitored_barrier_names_a_rank_that_never_comes(tmp_path):
    outputs = run_ranks(tmp_path, "monitored_barrier_names_the_absent",
                        "numpy", 3)
    assert "rank 2 did not reach the barrier" in outputs[0], outputs[0]


def test_monitored_barrier_works_again_after_one_timed_out(tmp_path):
    outputs = run_ranks(tmp_path, "monitored_barrier_after_a_timeout",
                        "numpy", 3)
    assert all("monitored_barrier after a timeout ok" in o for o in outputs)


@pytest.mark.parametrize("size", [0, 1, 2, 10, 97, 1000])
@pytest.mark.parametrize("world", [1, 3, 4])
@pytest.mark.parametrize("shuffle,drop_last", [(True, False), (True, True),
                                               (False, False), (False, True)])
def test_sampler_draws_torchs_indices(size, world, shuffle, drop_last):
    """A trainer moved from torch's DistributedSampler sees the same samples
    in the same order, epoch after epoch."""
    from torch.utils.data.distributed import DistributedSampler as Torchs

    for seed in (0, 7, -3, 2**40 + 5):
        for rank in range(world):
            theirs = Torchs(range(size), num_replicas=world, rank=rank,
                            shuffle=shuffle, seed=seed, drop_last=drop_last)
            ours = dist.DistributedSampler(range(size), num_replicas=world,
                                           rank=rank, shuffle=shuffle,
                                           seed=seed, drop_last=drop_last)
            assert (len(ours), ours.total_size) == (len(theirs),
                                                    theirs.total_size)
            for epoch in (0, 1, 5):
                theirs.set_epoch(epoch)
                ours.set_epoch(epoch)
                assert ours.epoch == theirs.epoch
                assert list(ours) == list(theirs), (seed, rank, epoch)


def test_a_future_callback_running_at_exit_does_not_abort_the_process(
        tmp_path):
    for attempt in range(3):
        directory = tmp_path / str(attempt)
        directory.mkdir()
        outputs = run_ranks(directory, "future_callback_at_exit", "torch", 2)
        assert "terminate" not in outputs[0], outputs[0]


def test_pending_futures_share_a_few_threads(tmp_path):
    outputs = run_ranks(tmp_path, "futures_share_threads", "torch", 2,
                        timeout=120)
    assert "futures share threads ok" in outputs[0], outputs[0]
    assert "completing a future raised" in outputs[0], outputs[0]
