"""commdist: libcomm's collectives with torch.distributed's API.

    import commdist as dist
    dist.init_process_group("tcp")          # env:// as under torchrun/commrun
    dist.all_reduce(array)                  # numpy array or torch tensor

Arrays and tensors are used in place, never copied on the way in: numpy
arrays (anything with the buffer protocol) and torch tensors (through
DLPack; CUDA tensors with the "nccl" backend). They must be contiguous, and
writable where the call writes into them; otherwise the call raises
InvalidArgument before any data moves.

Collectives take `group=None` (the default group) and `async_op=False`; with
async_op=True they return a Work, whose wait() must be called before the
arrays are read or changed.
"""

import datetime as _datetime

from . import _C
from ._errors import (BackendError, Error, InvalidArgument, MismatchError,
                      PeerError, SystemError, TimeoutError, UnsupportedError)

ReduceOp = _C.ReduceOp
Work = _C.Work
ProcessGroup = _C.ProcessGroup
Store = _C.Store

__version__ = _C.__version__

# torch.distributed's default of 30 minutes is long for a job whose peers
# died; libcomm's stores and groups default to 5.
default_pg_timeout = _datetime.timedelta(minutes=5)

__all__ = [
    "BackendError", "DistributedDataParallel", "DistributedSampler", "Error",
    "FileStore", "GroupMember", "HashStore", "InvalidArgument",
    "MismatchError", "PeerError", "PrefixStore", "ProcessGroup", "ReduceOp",
    "Store", "TCPStore", "TimeoutError", "UnsupportedError", "Work",
    "all_gather", "all_gather_into_tensor", "all_reduce", "all_to_all",
    "all_to_all_single", "barrier", "broadcast", "destroy_process_group",
    "gather", "get_backend", "get_rank", "get_world_size",
    "init_process_group", "irecv", "is_initialized", "isend", "new_group",
    "recv", "reduce", "reduce_scatter", "scatter", "send",
]


def _seconds(timeout):
    if isinstance(timeout, _datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


# ---- Stores ------------------------------------------------------------------


def TCPStore(host_name, port, world_size=None, is_master=False,
             timeout=default_pg_timeout, wait_for_workers=True):
    """The TCPStore of c10d: `is_master` hosts the server (port 0 picks a
    free one; the store's `port` says which), the others connect.
    `world_size` and `wait_for_workers` are accepted for torch's signature;
    rendezvous, not the store, waits for the ranks here."""
    del world_size, wait_for_workers
    return _C.TCPStore(host_name, port, is_master, _seconds(timeout))


def FileStore(file_name, world_size=-1, timeout=default_pg_timeout):
    """A store kept in one file, for processes on one host."""
    del world_size
    return _C.FileStore(file_name, _seconds(timeout))


def HashStore(timeout=default_pg_timeout):
    """A store inside this process (ranks as threads)."""
    return _C.HashStore(_seconds(timeout))


def PrefixStore(prefix, store):
    """`store` with "prefix/" before every key."""
    return _C.PrefixStore(prefix, store)


# ---- The default group ---------------------------------------------------------


class GroupMember:
    """What new_group returns on ranks outside the new group. Collectives
    refuse it (torch.distributed would silently do nothing)."""

    WORLD = None
    NON_GROUP_MEMBER = object()


_default_group = None


def init_process_group(backend="tcp", init_method=None,
                       timeout=default_pg_timeout, world_size=-1, rank=-1,
                       store=None, group_name=""):
    """Joins the job and makes the default group, as torch.distributed's
    init_process_group. `backend`: "tcp", "nccl" or "cpu:tcp,cuda:nccl"
    ("gloo" is read as "tcp"). Without `store`, `init_method` says how to
    meet: "env://" (the default: MASTER_ADDR, MASTER_PORT, RANK,
    WORLD_SIZE), "tcp://HOST:PORT" or "file:///PATH"."""
    global _default_group
    if _default_group is not None:
        raise InvalidArgument(
            "init_process_group: the default group exists already; call "
            "destroy_process_group() first")
    if backend == "gloo":
        backend = "tcp"
    seconds = _seconds(timeout)
    if store is not None:
        if init_method is not None:
            raise InvalidArgument(
                "init_process_group: pass either `store` or `init_method`")
        if rank < 0 or world_size < 0:
            raise InvalidArgument(
                "init_process_group: with `store`, pass `rank` and "
                "`world_size` too")
        group = _C.ProcessGroup(store, rank, world_size, backend, seconds,
                                group_name or "default")
    else:
        group = _C.init_process_group(backend, init_method or "env://", rank,
                                      world_size, seconds)
    _default_group = group
    GroupMember.WORLD = group


def is_initialized():
    return _default_group is not None


def _group(group):
    if group is GroupMember.NON_GROUP_MEMBER:
        raise InvalidArgument(
            "this rank is not a member of the group new_group returned; "
            "call collectives on a group only from its ranks")
    if group is not None:
        return group
    if _default_group is None:
        raise InvalidArgument(
            "the default process group is not initialized; call "
            "init_process_group() first")
    return _default_group


def get_rank(group=None):
    return _group(group).rank()


def get_world_size(group=None):
    return _group(group).size()


def get_backend(group=None):
    return _group(group).backend_name()


def new_group(ranks=None, timeout=None, backend=None):
    """A subgroup of `ranks` (ranks of the default group; all when None).
    Every rank of the default group must call it, in the same order.
    Ranks outside it get GroupMember.NON_GROUP_MEMBER. The subgroup uses the
    default group's backend (`backend` must be None or that one) and its
    timeout (`timeout` is accepted for torch's signature and not used)."""
    world = _group(None)
    if backend is not None and backend not in (world.backend_name(), "gloo"):
        raise UnsupportedError(
            f"new_group: a subgroup uses its parent's backend "
            f"({world.backend_name()}), not {backend!r}")
    del timeout
    members = list(range(world.size())) if ranks is None else list(ranks)
    group = world.new_group(members)
    if group is None:
        return GroupMember.NON_GROUP_MEMBER
    group._global_ranks = sorted(members)
    return group


def destroy_process_group(group=None):
    """Shuts `group` down (pending operations fail, saying so); without a
    group, the default one, after which init_process_group may run again."""
    global _default_group
    if group is None or group is _default_group:
        if _default_group is not None:
            _default_group.shutdown()
        _default_group = None
        GroupMember.WORLD = None
    elif group is not GroupMember.NON_GROUP_MEMBER:
        group.shutdown()


# ---- Collectives -----------------------------------------------------------------


def _complete(work, async_op):
    if async_op:
        return work
    work.wait()
    return None


def _rank_in(group, global_rank, what):
    """torch.distributed names roots by their rank in the default group; a
    subgroup numbers its members in the order of their default-group
    ranks."""
    members = getattr(group, "_global_ranks", None)
    if members is None:
        return global_rank
    if global_rank not in members:
        raise InvalidArgument(
            f"{what}={global_rank} is not a member of this group, whose "
            f"ranks are {members}")
    return members.index(global_rank)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    return _complete(_group(group).all_reduce(tensor, op), async_op)


def broadcast(tensor, src, group=None, async_op=False):
    root = _rank_in(group, src, "src")
    return _complete(_group(group).broadcast(tensor, root), async_op)


def reduce(tensor, dst, op=ReduceOp.SUM, group=None, async_op=False):
    root = _rank_in(group, dst, "dst")
    return _complete(_group(group).reduce(tensor, root, op), async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    return _complete(_group(group).all_gather(tensor_list, tensor), async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None,
                           async_op=False):
    return _complete(
        _group(group).all_gather_into(output_tensor, input_tensor), async_op)


def gather(tensor, gather_list=None, dst=0, group=None, async_op=False):
    """gather_list: one tensor per rank on `dst`, None elsewhere."""
    root = _rank_in(group, dst, "dst")
    return _complete(_group(group).gather(tensor, gather_list, root),
                     async_op)


def scatter(tensor, scatter_list=None, src=0, group=None, async_op=False):
    """scatter_list: one tensor per rank on `src`, None elsewhere."""
    root = _rank_in(group, src, "src")
    return _complete(_group(group).scatter(tensor, scatter_list, root),
                     async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None,
                   async_op=False):
    return _complete(_group(group).reduce_scatter(output, input_list, op),
                     async_op)


def all_to_all(output_tensor_list, input_tensor_list, group=None,
               async_op=False):
    return _complete(
        _group(group).all_to_all(output_tensor_list, input_tensor_list),
        async_op)


def all_to_all_single(output, input, output_split_sizes=None,
                      input_split_sizes=None, group=None, async_op=False):
    return _complete(
        _group(group).all_to_all_single(output, input,
                                        list(output_split_sizes or []),
                                        list(input_split_sizes or [])),
        async_op)


def barrier(group=None, async_op=False):
    return _complete(_group(group).barrier(), async_op)


def isend(tensor, dst, group=None, tag=0):
    return _group(group).isend(tensor, _rank_in(group, dst, "dst"), tag)


def irecv(tensor, src=None, group=None, tag=0):
    """src=None receives from whichever rank sends first; the Work's
    source_rank() says which once it completed."""
    peer = _C.ANY_SOURCE if src is None else _rank_in(group, src, "src")
    return _group(group).irecv(tensor, peer, tag)


def send(tensor, dst, group=None, tag=0):
    isend(tensor, dst, group, tag).wait()


def recv(tensor, src=None, group=None, tag=0):
    """Returns the rank the message came from (in the default group, as
    torch.distributed does)."""
    work = irecv(tensor, src, group, tag)
    work.wait()
    members = getattr(group, "_global_ranks", None)
    source = work.source_rank()
    return members[source] if members is not None else source


from .ddp import DistributedDataParallel, DistributedSampler  # noqa: E402
