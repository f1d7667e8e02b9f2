"""commdist: libcomm's collectives with torch.distributed's API.

    import commdist as dist
    dist.init_process_group("gloo")         # env:// as under torchrun/commrun
    dist.all_reduce(array)                  # numpy array or torch tensor

A script written for torch.distributed runs with `import commdist as dist`
in place of `import torch.distributed as dist` (and
`from commdist import DistributedDataParallel` in place of torch's): the
names, signatures and semantics are torch's, down to what a rank outside a
group gets (a collective on a group the rank is not in does nothing, and
get_rank returns -1). The deliberate differences are listed in the README's
commdist section.

Arrays and tensors are used in place, never copied on the way in: numpy
arrays (anything with the buffer protocol) and dense torch tensors (through
DLPack; CUDA tensors with the "nccl" backend). They must be contiguous, and
writable where the call writes into them; otherwise the call raises
InvalidArgument before any data moves.

Collectives take `group=None` (the default group) and `async_op=False`; with
async_op=True they return a Work, whose wait() must be called before the
arrays are read or changed. Timeouts are seconds or datetime.timedelta.
"""

import datetime as _datetime
import os as _os
import pickle as _pickle
import sys as _sys
import threading as _threading
import time as _time
import traceback as _traceback
import warnings as _warnings
import weakref as _weakref

from . import _C
from ._errors import (BackendError, Error, InvalidArgument, MismatchError,
                      PeerError, SystemError, TimeoutError, UnsupportedError)
from .sampler import DistributedSampler

ReduceOp = _C.ReduceOp
ProcessGroup = _C.ProcessGroup
Store = _C.Store

__version__ = _C.__version__

# torch.distributed's default of 30 minutes is long for a job whose peers
# died; libcomm's stores and groups default to 5.
default_pg_timeout = _datetime.timedelta(minutes=5)

__all__ = [
    "Backend", "BackendError", "DistributedDataParallel",
    "DistributedSampler", "Error", "FileStore", "GroupMember", "HashStore",
    "InvalidArgument", "MismatchError", "P2POp", "PeerError", "PrefixStore",
    "ProcessGroup", "ReduceOp", "Store", "TCPStore", "TimeoutError",
    "UnsupportedError", "Work", "all_gather", "all_gather_into_tensor",
    "all_gather_object", "all_reduce", "all_to_all", "all_to_all_single",
    "all_gather_coalesced", "all_reduce_coalesced",
    "barrier", "batch_isend_irecv", "broadcast", "broadcast_object_list",
    "destroy_process_group", "gather", "gather_object", "get_backend",
    "get_global_rank", "get_group_rank", "get_process_group_ranks",
    "get_rank", "get_world_size", "group", "init_process_group", "irecv",
    "is_available", "is_gloo_available", "is_initialized",
    "is_mpi_available", "is_nccl_available", "is_torchelastic_launched",
    "is_ucc_available", "isend", "monitored_barrier", "new_group",
    "new_subgroups", "new_subgroups_by_enumeration", "recv",
    "reduce", "reduce_op", "reduce_scatter", "reduce_scatter_tensor",
    "scatter", "scatter_object_list", "send", "shared_host_array",
]


def __getattr__(name):
    # DistributedDataParallel is a torch.nn.Module, so it needs torch; the
    # rest of commdist does not, and numpy-only users never import torch.
    if name == "DistributedDataParallel":
        from .ddp import DistributedDataParallel
        return DistributedDataParallel
    raise AttributeError(f"module 'commdist' has no attribute {name!r}")


# ---- Shared host memory ---------------------------------------------------

def shared_host_array(shape, dtype="float32"):
    """A numpy array of zeros in shared host memory: a collective whose
    ranks are all on one host, and whose every rank passes such arrays (or
    torch tensors made from them with torch.from_numpy), reads them
    directly through mappings, from 32 KiB on, instead of through the
    shared-memory rings (libcomm's Tensor::shared_host_zeros; README,
    "Shared host memory"). Every rank must pass such memory or none: a rank
    that passes ordinary memory beside peers that pass shared memory fails
    the call with MismatchError. The memory is freed with the last view."""
    import numpy as np
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(not isinstance(n, int) or n < 0 for n in shape):
        raise InvalidArgument(
            f"shared_host_array: shape {shape} must be whole numbers of 0 "
            "or more")
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    buffer = _C.shared_host_buffer(count * dtype.itemsize)
    return np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)


# ---- Availability ---------------------------------------------------------


def is_available():
    """True: this build has the distributed package (as torch's)."""
    return True


def is_gloo_available():
    """True: "gloo" is served by libcomm's TCP backend."""
    return "tcp" in _C.registered_backends()


def is_nccl_available():
    """Whether this build of libcomm has the NCCL backend."""
    return "nccl" in _C.registered_backends()


def is_mpi_available():
    return False


def is_ucc_available():
    return False


def is_torchelastic_launched():
    """True under torchrun or commrun, which set TORCHELASTIC_RUN_ID."""
    return _os.environ.get("TORCHELASTIC_RUN_ID") is not None


class Backend(str):
    """Backend names as torch.distributed spells them; "gloo" is libcomm's
    TCP backend and "nccl" its NCCL backend."""

    UNDEFINED = "undefined"
    GLOO = "gloo"
    NCCL = "nccl"
    MPI = "mpi"
    TCP = "tcp"

    def __new__(cls, name):
        if not isinstance(name, str):
            raise InvalidArgument(f"Backend name must be a string, not "
                                  f"{type(name).__name__}")
        # As torch's, a name it does not know is a ValueError; a spec per
        # device ("cpu:gloo,cuda:nccl") is checked name by name.
        known = {cls.GLOO, cls.NCCL, cls.MPI, cls.TCP}
        known.update(_C.registered_backends())
        for part in name.lower().split(","):
            if part.rpartition(":")[2] not in known:
                raise InvalidArgument(f"Invalid backend: {name!r}")
        return str.__new__(cls, name.lower())


# ---- Work -------------------------------------------------------------------


class Work:
    """An operation started with async_op=True (or by isend/irecv), as
    torch.distributed's Work: wait(), is_completed(), is_success(),
    exception(), result() (the operation's output tensors, once complete)
    and get_future() (a torch.futures.Future of them)."""

    __slots__ = ("_work", "_outputs", "__weakref__")

    def __init__(self, work, outputs=()):
        self._work = work
        self._outputs = list(outputs)

    def wait(self, timeout=None):
        """Blocks until the operation completes, at most `timeout` (seconds
        or a timedelta; None: the group's timeout), and raises its error if
        it failed. Returns True."""
        return self._work.wait(timeout)

    def is_completed(self):
        return self._work.is_completed()

    def is_success(self):
        return self._work.is_success()

    def exception(self):
        return self._work.exception()

    def source_rank(self):
        """The rank a receive from any source heard from."""
        return self._work.source_rank()

    def result(self):
        """The operation's output tensors (for an in-place collective, the
        tensor it was given). As torch's, only once it completed."""
        if not self._work.is_completed():
            raise InvalidArgument(
                "Work.result(): the operation has not completed; call "
                "wait() first")
        self._work.wait()  # raises the operation's error, if any
        return list(self._outputs)

    def get_future(self):
        """A torch.futures.Future that completes with result() when the
        operation does (or with its error). One of commdist's settling
        threads completes it, without holding the GIL while it waits, and
        runs the callbacks chained on it (see _FutureSettler). The
        interpreter waits for those threads before it exits: the
        operation's timeout, or destroy_process_group(), ends the wait of
        an operation that never completes."""
        import torch

        future = torch.futures.Future()
        operations = self._operations()
        if all(operation.operation_completed() for operation in operations):
            self._settle(future)
        else:
            _future_settler.settle_when_complete(self, operations, future)
        return future

    def _failed(self):
        """Whether one of the operations has completed with an error."""
        return any(operation.operation_completed()
                   and not operation.is_success()
                   for operation in self._operations())

    def _operations(self):
        """The _C.Works of libcomm's operations this Work completes with."""
        work = self._work
        return list(work.works) if isinstance(work, _AllOf) else [work]

    def _settle(self, future):
        """Completes `future` with result(), or with the operation's error;
        the operation has completed, or will within its timeout."""
        try:
            # A wait with a timeout blocks the host until the operation is
            # done, on CUDA too, where an unbounded one would only order a
            # stream of this thread. The operation is complete, or ends by
            # its own timeout first; this bound is a backstop.
            self._work.wait(_datetime.timedelta(days=1))
        except BaseException as error:  # noqa: BLE001 - delivered
            future.set_exception(error)
        else:
            future.set_result(list(self._outputs))

    def __repr__(self):
        return repr(self._work)


class _FutureSettler:
    """Completes get_future()'s futures as their operations complete.

    libcomm tells of a completion on its own threads, which must not run
    Python; _C.CompletionQueue hands the completion to the threads here,
    which take it without the GIL. Completing a future runs the callbacks
    chained on it, and a callback may wait for another future that only
    these threads complete: so while one runs, another thread stands by to
    take the next completion. The threads number one plus the callbacks
    running at once (at most _MAX_THREADS, beyond which a completion waits
    for a free thread), not one per pending future; the last one ends when
    no future is pending.

    Not daemons: completing a future runs its callbacks, and torch releases
    the GIL meanwhile; a daemon thread that then takes the GIL back while
    the interpreter finalizes is ended inside torch's C++, which aborts the
    process."""

    _MAX_THREADS = 64
    # How long a thread waits for a completion before it looks again
    # whether any future is still pending.
    _POLL_SECONDS = 1.0

    def __init__(self):
        self._forget()

    def _forget(self):
        """Starts afresh, as in a child after fork(), which has none of the
        threads and whose copies of the parent's operations never
        complete."""
        self._lock = _threading.Lock()
        self._queue = None  # made with the first future
        # token -> [Work, future, operations not yet complete], under _lock
        self._pending = {}
        self._next_token = 0
        self._threads = 0  # under _lock
        self._standing_by = 0  # threads not running a callback, under _lock
        # A settling thread that forks (from a future's callback) goes on
        # in the child, which counts none: it ends there without counting.
        self._pid = _os.getpid()

    def settle_when_complete(self, work, operations, future):
        """Settles `future` through `work` once every one of `operations`
        (work's _C.Works) has completed, or one has failed."""
        with self._lock:
            if self._queue is None:
                self._queue = _C.CompletionQueue()
            token = self._next_token
            self._next_token += 1
            self._pending[token] = [work, future, len(operations)]
            refused = None
            try:
                if self._standing_by == 0:
                    refused = self._start_thread()
                # After the future is pending: an operation already
                # complete queues its token at once.
                for operation in operations:
                    self._queue.watch(operation, token)
            except BaseException:
                # Tokens already queued for it find no entry, and are
                # dropped.
                del self._pending[token]
                raise
        if refused is not None:
            self._warn_no_spare(refused)

    def _start_thread(self):
        """Under _lock. Raises RuntimeError where the system refuses a
        thread and none is running; returns its error where it refuses a
        spare one, for the caller to warn of once the lock is released."""
        if self._threads >= self._MAX_THREADS:
            return None
        self._threads += 1
        self._standing_by += 1
        try:
            _threading.Thread(target=self._run, daemon=False,
                              name="commdist-future").start()
        except RuntimeError as error:  # only a refusal: the thread is none
            self._threads -= 1
            self._standing_by -= 1
            if self._threads == 0:
                raise
            return error
        return None

    @staticmethod
    def _warn_no_spare(error):
        """Never raises: a settling thread has no caller to raise to."""
        try:
            _warnings.warn(
                "commdist: no thread could be started to stand by while a "
                f"future's callbacks run ({error}); a callback that waits "
                "for another pending future waits until they end",
                RuntimeWarning)
        except Exception:  # noqa: BLE001 - a warning filter set to error
            pass

    def _run(self):
        pid = self._pid
        while True:
            if _os.getpid() != pid:
                return
            with self._lock:
                # One thread stands by while any future is pending; the
                # others end.
                if not self._pending or self._standing_by > 1:
                    self._threads -= 1
                    self._standing_by -= 1
                    return
            token = self._queue.take(self._POLL_SECONDS)
            if token is None:
                continue
            refused = None
            with self._lock:
                entry = self._pending.get(token)
                if entry is None:  # settled already, or never watched whole
                    continue
                work, future, _ = entry
                entry[2] -= 1
                if entry[2] > 0 and not work._failed():
                    continue
                del self._pending[token]
                self._standing_by -= 1
                if self._pending and self._standing_by == 0:
                    # Never raises: this thread is counted, and takes the
                    # next completion itself once its callbacks have run.
                    refused = self._start_thread()
            if refused is not None:
                self._warn_no_spare(refused)
            try:
                work._settle(future)
            except BaseException:  # noqa: BLE001 - reported, not fatal
                # The future was completed by someone else, or completing
                # it failed: the thread lives on for the other futures.
                try:
                    _sys.stderr.write("commdist: completing a future "
                                      "raised:\n" + _traceback.format_exc())
                except Exception:  # noqa: BLE001 - no stderr to write to
                    pass
            finally:
                if _os.getpid() == pid:
                    with self._lock:
                        self._standing_by += 1


_future_settler = _FutureSettler()
if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(after_in_child=_future_settler._forget)


# ---- Stores ------------------------------------------------------------------


def TCPStore(host_name, port, world_size=None, is_master=False,
             timeout=default_pg_timeout, wait_for_workers=True):
    """The TCPStore of c10d: `is_master` hosts the server (port 0 picks a
    free one; the store's `port` says which), the others connect. With
    `world_size`, as in torch, every store counts itself in under the key
    "init/" and the master (with wait_for_workers) waits, up to `timeout`,
    until world_size stores have."""
    store = _C.TCPStore(host_name, port, is_master, timeout)
    if world_size is not None:
        if world_size < 1:
            raise InvalidArgument(
                f"TCPStore: world_size must be positive, got {world_size}")
        store.add("init/", 1)
        if is_master and wait_for_workers:
            _wait_for_count(store, "init/", world_size,
                            store.timeout.total_seconds())
    return store


def _wait_for_count(store, key, count, seconds):
    """Sleeps (never spins) until the counter `key` reaches `count`."""
    deadline = _time.monotonic() + seconds
    pause = 0.001
    while True:
        joined = store.add(key, 0)
        if joined >= count:
            return
        if _time.monotonic() >= deadline:
            raise TimeoutError(
                f"TCPStore: {joined} of world_size={count} stores joined "
                f"within {seconds:g} s; start the others, or check their "
                f"host and port")
        _time.sleep(pause)
        pause = min(pause * 2, 0.1)


def FileStore(file_name, world_size=-1, timeout=default_pg_timeout):
    """A store kept in one file, for processes on one host."""
    del world_size
    return _C.FileStore(file_name, timeout)


def HashStore(timeout=default_pg_timeout):
    """A store inside this process (ranks as threads)."""
    return _C.HashStore(timeout)


def PrefixStore(prefix, store):
    """`store` with "prefix/" before every key."""
    return _C.PrefixStore(prefix, store)


# ---- Groups --------------------------------------------------------------------


_default_group = None

# The subgroups new_group made and the user still holds, which
# destroy_process_group() shuts down with the default group.
_subgroups = _weakref.WeakSet()


class _WorldMeta(type):
    """group.WORLD and GroupMember.WORLD: the default group once
    init_process_group has made it, else None."""

    @property
    def WORLD(cls):  # noqa: N802 - torch's name
        return _default_group


class GroupMember(metaclass=_WorldMeta):
    """NON_GROUP_MEMBER is what new_group returns on ranks outside the new
    group; as in torch, collectives on it do nothing and get_rank gives -1."""

    NON_GROUP_MEMBER = object()


class group(metaclass=_WorldMeta):  # noqa: N801 - torch's name
    """group.WORLD is the default group."""


class _DeprecatedReduceOp:
    """torch.distributed.reduce_op: ReduceOp under its old name, with
    torch's warning on every use."""

    def __getattribute__(self, name):
        _warnings.warn(
            "torch.distributed.reduce_op is deprecated, please use "
            "torch.distributed.ReduceOp instead")
        return getattr(ReduceOp, name)


reduce_op = _DeprecatedReduceOp()

# The backend names torch scripts ask for, and the libcomm backend of each.
_BACKEND_ALIASES = {"gloo": "tcp"}


def _libcomm_backend(backend):
    """"gloo" -> "tcp", also inside a device spec ("cpu:gloo,cuda:nccl")."""
    parts = []
    for part in str(backend).lower().split(","):
        device, sep, name = part.rpartition(":")
        parts.append(device + sep + _BACKEND_ALIASES.get(name, name))
    return ",".join(parts)


def _check_backend_names(spec):
    """Raises InvalidArgument for a name in `spec` that is neither a
    registered libcomm backend nor one of the names torch scripts use for
    one ("gloo"), listing both. "nccl" is left to libcomm, which says why a
    build lacks it, and so is a spec that names no backend after a colon
    ("cpu:")."""
    registered = list(_C.registered_backends())
    for part in spec.split(","):
        name = part.rpartition(":")[2]
        if name in ("", "nccl") or \
                _BACKEND_ALIASES.get(name, name) in registered:
            continue
        names = sorted(set(registered) | set(_BACKEND_ALIASES))
        aliases = ", ".join(f'"{alias}" is libcomm\'s {target}'
                            for alias, target in _BACKEND_ALIASES.items())
        raise InvalidArgument(
            f"init_process_group: no backend named {name!r}; commdist "
            f"takes {', '.join(names)} ({aliases}), or one per device "
            f'("cpu:gloo,cuda:nccl")')


def init_process_group(backend=None, init_method=None,
                       timeout=default_pg_timeout, world_size=-1, rank=-1,
                       store=None, group_name="", pg_options=None):
    """Joins the job and makes the default group, as torch.distributed's
    init_process_group. `backend`: "gloo" or "tcp" (libcomm's TCP backend),
    "nccl", or a spec per device ("cpu:gloo,cuda:nccl"); None is "gloo".
    get_backend() returns the name given here. Without `store`,
    `init_method` says how to meet: "env://" (the default: MASTER_ADDR,
    MASTER_PORT, RANK, WORLD_SIZE), "tcp://HOST:PORT" or "file:///PATH".
    `timeout`: seconds or a timedelta."""
    global _default_group
    if _default_group is not None:
        raise InvalidArgument(
            "init_process_group: the default group exists already; call "
            "destroy_process_group() first")
    if pg_options is not None:
        raise UnsupportedError(
            "init_process_group: pg_options are NCCL options of torch's; "
            "libcomm's backends take their settings from COMM_* variables")
    asked = "gloo" if backend is None else str(backend).lower()
    _check_backend_names(asked)
    libcomm_name = _libcomm_backend(asked)
    if store is not None:
        if init_method is not None:
            raise InvalidArgument(
                "init_process_group: pass either `store` or `init_method`")
        if rank < 0 or world_size < 0:
            raise InvalidArgument(
                "init_process_group: with `store`, pass `rank` and "
                "`world_size` too")
        made = _C.ProcessGroup(store, rank, world_size, libcomm_name, timeout,
                               group_name or "default")
    else:
        made = _C.init_process_group(libcomm_name, init_method or "env://",
                                     rank, world_size, timeout)
    made._backend_asked = asked
    _default_group = made


def is_initialized():
    return _default_group is not None


def _not_member(g):
    return g is GroupMember.NON_GROUP_MEMBER


def _group(g):
    if _not_member(g):
        raise InvalidArgument(
            "this rank is not a member of the group new_group returned; "
            "only its ranks may use it here")
    if g is not None:
        return g
    if _default_group is None:
        raise InvalidArgument(
            "the default process group is not initialized; call "
            "init_process_group() first")
    return _default_group


def get_rank(group=None):
    """This rank in `group`; -1 on a rank outside it (as torch)."""
    if _not_member(group):
        return -1
    return _group(group).rank()


def get_world_size(group=None):
    """The ranks in `group`; -1 on a rank outside it (as torch)."""
    if _not_member(group):
        return -1
    return _group(group).size()


def get_backend(group=None):
    """The backend name the script asked for ("gloo" stays "gloo")."""
    g = _group(group)
    return Backend(getattr(g, "_backend_asked", g.backend_name()))


def get_process_group_ranks(group):
    """The default-group ranks of `group`'s members, in group-rank order."""
    g = _group(group)
    members = getattr(g, "_global_ranks", None)
    return list(range(g.size())) if members is None else list(members)


def get_global_rank(group, group_rank):
    """The default-group rank of `group`'s member `group_rank`."""
    ranks = get_process_group_ranks(group)
    if not 0 <= group_rank < len(ranks):
        raise InvalidArgument(
            f"get_global_rank: group rank {group_rank} is not part of a "
            f"group of {len(ranks)} ranks")
    return ranks[group_rank]


def get_group_rank(group, global_rank):
    """`global_rank`'s rank in `group` (the inverse of get_global_rank)."""
    ranks = get_process_group_ranks(group)
    if global_rank not in ranks:
        raise InvalidArgument(
            f"get_group_rank: rank {global_rank} is not a member of this "
            f"group, whose ranks are {ranks}")
    return ranks.index(global_rank)


def new_group(ranks=None, timeout=None, backend=None, pg_options=None):
    """A subgroup of `ranks` (ranks of the default group; all when None).
    Every rank of the default group must call it, in the same order.
    Ranks outside it get GroupMember.NON_GROUP_MEMBER. The subgroup uses the
    default group's backend (`backend` must be None or that one) and its
    timeout (`timeout` is accepted for torch's signature and not used)."""
    world = _group(None)
    asked = get_backend()
    if backend is not None and \
            _libcomm_backend(backend) != _libcomm_backend(asked):
        raise UnsupportedError(
            f"new_group: a subgroup uses its parent's backend ({asked}), "
            f"not {backend!r}")
    if pg_options is not None:
        raise UnsupportedError("new_group: pg_options are not supported")
    del timeout
    members = list(range(world.size())) if ranks is None else list(ranks)
    made = world.new_group(members)
    if made is None:
        return GroupMember.NON_GROUP_MEMBER
    made._global_ranks = sorted(members)
    made._backend_asked = asked
    _subgroups.add(made)
    return made


def new_subgroups(group_size=None, group=None, timeout=None, backend=None,
                  pg_options=None):
    """Splits the default group into subgroups of `group_size` consecutive
    ranks, as torch's: every rank calls it, and gets the subgroup it is in
    and the list of all of them (GroupMember.NON_GROUP_MEMBER for those it
    is not in). `group_size` defaults to the ranks of one host
    (LOCAL_WORLD_SIZE, which commrun and torchrun set). `group` is accepted
    for torch's signature and, as in torch, not used."""
    del group
    if group_size is None:
        local = _os.environ.get("LOCAL_WORLD_SIZE", "")
        try:
            group_size = int(local)
        except ValueError:
            raise InvalidArgument(
                f"new_subgroups: pass group_size; without it the subgroups "
                f"are the ranks of one host, which LOCAL_WORLD_SIZE gives "
                f"(commrun and torchrun set it), and it is {local!r}") \
                from None
    world = get_world_size()
    if isinstance(group_size, bool) or not isinstance(group_size, int) or \
            group_size < 1:
        raise InvalidArgument(
            f"new_subgroups: group_size must be a positive integer, not "
            f"{group_size!r}")
    if group_size > world:
        raise InvalidArgument(
            f"new_subgroups: group_size {group_size} exceeds the world size "
            f"{world}")
    if world % group_size != 0:
        raise InvalidArgument(
            f"new_subgroups: the world size {world} is not divisible by "
            f"group_size {group_size}")
    return new_subgroups_by_enumeration(
        [list(range(start, start + group_size))
         for start in range(0, world, group_size)],
        timeout=timeout, backend=backend, pg_options=pg_options)


def new_subgroups_by_enumeration(ranks_per_subgroup_list, timeout=None,
                                 backend=None, pg_options=None):
    """A subgroup for each list of ranks (of the default group; no rank in
    two of them), as torch's: every rank calls it with the same lists, and
    gets the subgroup it is in (None if none) and the list of all of them
    (GroupMember.NON_GROUP_MEMBER for those it is not in)."""
    if not isinstance(ranks_per_subgroup_list, (list, tuple)) or \
            not ranks_per_subgroup_list:
        raise InvalidArgument(
            "new_subgroups_by_enumeration: ranks_per_subgroup_list must be "
            "a non-empty list of lists of ranks")
    placed = {}
    for index, ranks in enumerate(ranks_per_subgroup_list):
        if len(set(ranks)) != len(ranks):
            raise InvalidArgument(
                f"new_subgroups_by_enumeration: subgroup {index} names a "
                f"rank twice: {list(ranks)}")
        for rank in ranks:
            if rank in placed:
                raise InvalidArgument(
                    f"new_subgroups_by_enumeration: rank {rank} is in "
                    f"subgroup {placed[rank]} and in subgroup {index}")
            placed[rank] = index
    me = get_rank()
    subgroups, mine = [], None
    for ranks in ranks_per_subgroup_list:
        subgroup = new_group(list(ranks), timeout=timeout, backend=backend,
                             pg_options=pg_options)
        subgroups.append(subgroup)
        if me in ranks:
            mine = subgroup
    return mine, subgroups


def destroy_process_group(group=None):
    """Shuts `group` down (pending operations fail, saying so); without a
    group (or with group.WORLD), every group, as in torch: the default one
    and the subgroups new_group made, after which init_process_group may run
    again."""
    global _default_group
    if group is None or group is _default_group:
        for subgroup in list(_subgroups):
            subgroup.shutdown()
        _subgroups.clear()
        if _default_group is not None:
            _default_group.shutdown()
        _default_group = None
    elif not _not_member(group):
        _subgroups.discard(group)
        group.shutdown()


# ---- Collectives -----------------------------------------------------------------


def _is_complex(x):
    is_complex = getattr(x, "is_complex", None)
    if callable(is_complex):
        return is_complex()  # torch
    return getattr(getattr(x, "dtype", None), "kind", None) == "c"  # numpy


def _is_contiguous(x):
    is_contiguous = getattr(x, "is_contiguous", None)
    if callable(is_contiguous):
        return is_contiguous()  # torch
    flags = getattr(x, "flags", None)
    return flags is None or flags.c_contiguous  # numpy


def _real(x):
    """A complex array or tensor as a real view of it with a last axis of
    2 (real and imaginary parts), which is how torch.distributed hands
    complex tensors to its backends; anything else as it is. The view
    shares the memory, so the call works in place as on the original."""
    if x is None or not _is_complex(x):
        return x
    if callable(getattr(x, "is_complex", None)):  # torch
        import torch
        return torch.view_as_real(x)
    try:
        return x.view(x.real.dtype).reshape(x.shape + (2,))
    except ValueError:
        raise InvalidArgument(
            f"a complex array of shape {x.shape} whose last axis is not "
            f"contiguous cannot be viewed as real numbers; pass "
            f"np.ascontiguousarray(a)") from None


def _reals(xs):
    return None if xs is None else [_real(x) for x in xs]


def _complex_op(op, tensors, what):
    """`op` as a commdist ReduceOp, refusing the ops that mean nothing on
    complex values, taken part by part, where any of `tensors` is complex
    (torch refuses them too)."""
    op = _reduce_op(op)
    if any(t is not None and _is_complex(t) for t in tensors) and \
            op not in (ReduceOp.SUM, ReduceOp.AVG):
        raise UnsupportedError(
            f"{what}: ReduceOp.{op.name} is not defined on complex values, "
            f"which are reduced as their real and imaginary parts; SUM and "
            f"AVG are")
    return op


def _complete(work, async_op, outputs=()):
    work = Work(work, outputs)
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


def _reduce_op(op):
    """`op` as a commdist ReduceOp: one already, or torch.distributed's
    ReduceOp of the same name (a script that imports torch's keeps working
    with commdist as `dist`). PREMUL_SUM, which libcomm lacks, is refused
    naming it; anything else is left to the call to refuse."""
    if isinstance(op, ReduceOp):
        return op
    # torch's ReduceOp holds its kind (a RedOpType, which has a name) in
    # .op; a RedOpType may also come alone.
    kind = getattr(op, "op", op)
    name = getattr(kind, "name", None)
    if not type(kind).__module__.startswith("torch") or name is None:
        return op
    if not hasattr(ReduceOp, name):
        raise UnsupportedError(
            f"ReduceOp.{name} has no libcomm counterpart; the ops are "
            f"{', '.join(n for n in dir(ReduceOp) if n.isupper())}")
    return getattr(ReduceOp, name)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    if _not_member(group):
        return None
    op = _complex_op(op, [tensor], "all_reduce")
    return _complete(_group(group).all_reduce(_real(tensor), op, async_op),
                     async_op, [tensor])


def broadcast(tensor, src, group=None, async_op=False):
    if _not_member(group):
        return None
    root = _rank_in(group, src, "src")
    return _complete(_group(group).broadcast(_real(tensor), root, async_op),
                     async_op, [tensor])


def reduce(tensor, dst, op=ReduceOp.SUM, group=None, async_op=False):
    if _not_member(group):
        return None
    root = _rank_in(group, dst, "dst")
    op = _complex_op(op, [tensor], "reduce")
    return _complete(_group(group).reduce(_real(tensor), root, op, async_op),
                     async_op, [tensor])


def all_gather(tensor_list, tensor, group=None, async_op=False):
    if _not_member(group):
        return None
    return _complete(_group(group).all_gather(_reals(tensor_list),
                                                 _real(tensor), async_op),
                     async_op, tensor_list)


def all_gather_into_tensor(output_tensor, input_tensor, group=None,
                           async_op=False):
    if _not_member(group):
        return None
    return _complete(
        _group(group).all_gather_into(_real(output_tensor),
                                      _real(input_tensor), async_op),
        async_op,
        [output_tensor])


class _AllOf:
    """The operations of a coalesced call as one, for Work: complete when
    every one is, failed with the first failure."""

    __slots__ = ("works",)

    def __init__(self, works):
        self.works = works

    def wait(self, timeout=None):
        for work in self.works:  # an operation that failed already
            if work.operation_completed() and not work.is_success():
                work.wait(0)
        if timeout is None:
            for work in self.works:
                work.wait(None)
            return True
        seconds = (timeout.total_seconds()
                   if isinstance(timeout, _datetime.timedelta) else timeout)
        if seconds < 0:
            raise InvalidArgument(
                f"wait: the timeout must not be negative, not {timeout!r}")
        deadline = _time.monotonic() + seconds
        for work in self.works:
            work.wait(max(0.0, deadline - _time.monotonic()))
        return True

    def is_completed(self):
        return all(work.is_completed() for work in self.works)

    def is_success(self):
        return all(work.is_success() for work in self.works)

    def exception(self):
        return next((e for e in (work.exception() for work in self.works)
                     if e is not None), None)

    def source_rank(self):
        raise InvalidArgument("a coalesced call has no source rank")

    def __repr__(self):
        return f"<coalesced work of {len(self.works)} operations>"


def _coalesced(works, async_op, outputs):
    """As torch's *_coalesced: waits, or returns a torch.futures.Future of
    the outputs (a Work where torch is not installed)."""
    work = Work(_AllOf(works), outputs)
    if not async_op:
        work.wait()
        return None
    try:
        import torch  # noqa: F401
    except ImportError:
        return work
    return work.get_future()


def _same_dtype(tensors, name):
    if not tensors:
        raise InvalidArgument(f"{name} needs a non-empty list of tensors")
    dtypes = {str(t.dtype) for t in tensors}
    if len(dtypes) > 1:
        raise InvalidArgument(
            f"{name}: every tensor must have the same dtype, not "
            f"{', '.join(sorted(dtypes))}")


def _warn_coalesced_deprecated(name):
    # torch's words, so that a script's warning filter for torch's warning
    # also silences this one.
    _warnings.warn(
        f"torch.distributed.{name} will be deprecated. If you must use it, "
        "please revisit our documentation later at "
        "https://pytorch.org/docs/master/distributed.html#collective-functions")


def all_reduce_coalesced(tensors, op=ReduceOp.SUM, group=None,
                         async_op=False):
    """all_reduce of each tensor of the list (of one dtype), as one call.
    As torch's, async_op returns a torch.futures.Future rather than a Work
    (a Work where torch is not installed). Warns, as torch's does, that it
    will be deprecated."""
    _warn_coalesced_deprecated("all_reduce_coalesced")
    if _not_member(group):
        return None
    tensors = list(tensors)
    _same_dtype(tensors, "all_reduce_coalesced")
    op = _complex_op(op, tensors, "all_reduce_coalesced")
    g = _group(group)
    # Every tensor is checked before the first operation starts, so that a
    # bad one fails the call without leaving this rank a step ahead.
    reals = _reals(tensors)
    _C.check_tensors(reals, True, "tensors")
    works = [g.all_reduce(t, op, True) for t in reals]
    return _coalesced(works, async_op, tensors)


def all_gather_coalesced(output_tensor_lists, input_tensor_list, group=None,
                         async_op=False):
    """all_gather of each input (of one dtype) as one call:
    output_tensor_lists[r][i] receives rank r's input_tensor_list[i]. As
    torch's, async_op returns a torch.futures.Future rather than a Work (a
    Work where torch is not installed). Warns, as torch's does, that it
    will be deprecated."""
    _warn_coalesced_deprecated("all_gather_coalesced")
    if _not_member(group):
        return None
    inputs = list(input_tensor_list)
    _same_dtype(inputs, "all_gather_coalesced")
    g = _group(group)
    if not isinstance(output_tensor_lists, list) or \
            len(output_tensor_lists) != g.size() or \
            any(len(outputs) != len(inputs) for outputs in output_tensor_lists):
        raise InvalidArgument(
            f"all_gather_coalesced: output_tensor_lists must hold one list "
            f"per rank ({g.size()}), each with a tensor per input "
            f"({len(inputs)})")
    # Every tensor is checked before the first operation starts (see
    # all_reduce_coalesced).
    _C.check_tensors(_reals(inputs), False, "input_tensor_list")
    for r, outputs in enumerate(output_tensor_lists):
        _C.check_tensors(_reals(outputs), True,
                         f"output_tensor_lists[{r}]")
    works = [g.all_gather(_reals([outputs[i] for outputs in
                                  output_tensor_lists]),
                          _real(tensor), True)
             for i, tensor in enumerate(inputs)]
    return _coalesced(works, async_op, output_tensor_lists)


def gather(tensor, gather_list=None, dst=0, group=None, async_op=False):
    """gather_list: one tensor per rank on `dst`, None elsewhere."""
    if _not_member(group):
        return None
    root = _rank_in(group, dst, "dst")
    return _complete(_group(group).gather(_real(tensor), _reals(gather_list),
                                          root, async_op),
                     async_op, gather_list or [])


def scatter(tensor, scatter_list=None, src=0, group=None, async_op=False):
    """scatter_list: one tensor per rank on `src`, None elsewhere."""
    if _not_member(group):
        return None
    root = _rank_in(group, src, "src")
    return _complete(_group(group).scatter(_real(tensor),
                                           _reals(scatter_list), root,
                                           async_op),
                     async_op, [tensor])


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None,
                   async_op=False):
    if _not_member(group):
        return None
    op = _complex_op(op, [output] + list(input_list or []), "reduce_scatter")
    return _complete(_group(group).reduce_scatter(_real(output),
                                                   _reals(input_list), op,
                                                   async_op),
                     async_op, [output])


def _numel(x):
    size = getattr(x, "size", None)
    if callable(size):  # torch: size() is the shape
        return x.numel()
    return int(size)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None,
                          async_op=False):
    """Reduces `input` (world_size blocks of output's size, one after the
    other) over the ranks and leaves block r of the result in `output` on
    rank r."""
    if _not_member(group):
        return None
    op = _complex_op(op, [output, input], "reduce_scatter_tensor")
    results = [output]
    output, input = _real(output), _real(input)
    g = _group(group)
    world = g.size()
    count = _numel(output)
    if _numel(input) != count * world:
        raise InvalidArgument(
            f"reduce_scatter_tensor: input has {_numel(input)} elements; it "
            f"must have world_size ({world}) times output's {count}")
    flat = input.reshape(-1)
    if not _is_contiguous(flat):
        raise InvalidArgument(
            "reduce_scatter_tensor: input is not contiguous, and collectives "
            "work on contiguous memory; pass np.ascontiguousarray(input) or "
            "input.contiguous()")
    blocks = [flat[r * count:(r + 1) * count].reshape(output.shape)
              for r in range(world)]
    return _complete(g.reduce_scatter(output, blocks, op, async_op),
                     async_op, results)


# torch.distributed's older, private names of the two, which scripts
# written for torch 1.x still call.
_all_gather_base = all_gather_into_tensor
_reduce_scatter_base = reduce_scatter_tensor


def all_to_all(output_tensor_list, input_tensor_list, group=None,
               async_op=False):
    if _not_member(group):
        return None
    return _complete(
        _group(group).all_to_all(_reals(output_tensor_list),
                                 _reals(input_tensor_list), async_op),
        async_op, output_tensor_list)


def all_to_all_single(output, input, output_split_sizes=None,
                      input_split_sizes=None, group=None, async_op=False):
    if _not_member(group):
        return None
    return _complete(
        _group(group).all_to_all_single(_real(output), _real(input),
                                        list(output_split_sizes or []),
                                        list(input_split_sizes or []),
                                        async_op),
        async_op, [output])


def barrier(group=None, async_op=False, device_ids=None):
    """`device_ids` is accepted for torch's signature (NCCL picks the
    device of the group)."""
    del device_ids
    if _not_member(group):
        return None
    return _complete(_group(group).barrier(async_op), async_op)


# A tag of its own, so that monitored_barrier's messages never meet a
# user's point-to-point traffic (torch's tags are the user's too).
_MONITORED_BARRIER_TAG = -0x6D62  # "mb"

# Rank 0's answer to the ranks of one monitored_barrier call: a release, or
# that it gave up on the call.
_RELEASE, _GAVE_UP = 1, 2


class _MonitoredBarrierState:
    """This rank's monitored_barriers on one group.

    Every rank's n-th monitored_barrier on a group is the same barrier, as
    with collectives, and every message says which call it belongs to: a
    rank's arrival (to rank 0) is [call], rank 0's answer (to every other
    rank) is [call, _RELEASE or _GAVE_UP, then per group rank 1 where that
    rank did not arrive]. A call that timed out leaves its receives posted
    (a posted receive cannot be withdrawn): they are kept here, and the next
    call reads them first, dropping what belongs to an earlier call, so that
    nothing a timed-out call left behind is taken for a later call's."""

    __slots__ = ("calls", "receives")

    def __init__(self):
        self.calls = 0
        self.receives = {}  # peer -> (Work, buffer), posted and not yet read


def _monitored_barrier_state(g):
    state = getattr(g, "_monitored_barrier_state", None)
    if state is None:
        state = _MonitoredBarrierState()
        g._monitored_barrier_state = state
    return state


def _next_barrier_message(g, state, peer, length, timeout):
    """The next monitored_barrier message from `peer` (`length` int64s),
    waiting at most `timeout` seconds (None: the receive's own timeout, the
    group's). A receive still pending when the wait ends stays posted, in
    `state`, for the next call to read."""
    import numpy as np

    if peer not in state.receives:
        buffer = np.zeros(length, dtype=np.int64)
        state.receives[peer] = (
            Work(g.irecv(buffer, peer, _MONITORED_BARRIER_TAG)), buffer)
    work, buffer = state.receives[peer]
    try:
        work.wait(timeout)
    finally:
        if work.is_completed():
            del state.receives[peer]
    return buffer


def _left(deadline):
    return None if deadline is None else max(0.0, deadline - _time.monotonic())


def _within(seconds):
    return "the group's timeout" if seconds is None else f"{seconds:g} s"


def _did_not_reach(g, missing, within):
    members = getattr(g, "_global_ranks", None)
    named = [members[r] if members else r for r in missing]
    return (f"rank{'s' if len(named) > 1 else ''} "
            f"{', '.join(str(r) for r in named)} did not reach the barrier "
            f"within {within}")


def _calls_differ(g, peer, theirs, ours):
    members = getattr(g, "_global_ranks", None)
    return MismatchError(
        f"monitored_barrier: rank {members[peer] if members else peer} is "
        f"at its monitored_barrier #{theirs} on this group and this rank at "
        f"its #{ours}: every rank must call it the same number of times")


def _monitored_barrier_root(g, state, call, seconds, wait_all_ranks):
    """Rank 0's part: waits for every other rank's arrival of call `call`,
    then answers each, with a release or with the ranks that did not
    arrive. Every call is answered, whatever ends it, so that the other
    ranks' calls stay matched with rank 0's."""
    import numpy as np

    deadline = None if seconds is None else _time.monotonic() + seconds
    missing, failure = [], None
    try:
        for r in range(1, g.size()):
            try:
                while True:
                    arrived = int(_next_barrier_message(
                        g, state, r, 1, _left(deadline))[0])
                    if arrived == call:
                        break
                    if arrived > call:
                        raise _calls_differ(g, r, arrived, call)
                    # An arrival for a call this rank gave up on before r
                    # came: r has its answer to that call already.
            except TimeoutError:
                missing.append(r)
                if not wait_all_ranks:
                    break
    except BaseException as error:  # noqa: BLE001 - answered, then raised
        failure = error
    answer = np.zeros(2 + g.size(), dtype=np.int64)
    answer[0] = call
    if not missing and failure is None:
        answer[1] = _RELEASE
        for r in range(1, g.size()):
            Work(g.isend(answer, r, _MONITORED_BARRIER_TAG)).wait(seconds)
        return
    # Every other rank hears that the call failed: one that arrived fails
    # now rather than at its own timeout, one that has not arrived yet as
    # soon as it does. Nothing waits for these sends: a rank that never
    # comes never reads its answer, and one that died fails its send.
    answer[1] = _GAVE_UP
    answer[[2 + r for r in missing]] = 1
    for r in range(1, g.size()):
        try:
            g.isend(answer, r, _MONITORED_BARRIER_TAG)
        except Error:
            pass
    if failure is not None:
        raise failure
    raise TimeoutError(
        f"monitored_barrier: {_did_not_reach(g, missing, _within(seconds))}")


def _monitored_barrier_member(g, state, call, seconds):
    """The part of every rank but 0: arrives, then waits for rank 0's answer
    to call `call`, dropping answers to earlier calls that timed out
    here."""
    import numpy as np

    arrival = np.array([call], dtype=np.int64)
    Work(g.isend(arrival, 0, _MONITORED_BARRIER_TAG)).wait(seconds)
    deadline = None if seconds is None else _time.monotonic() + seconds
    while True:
        try:
            answer = _next_barrier_message(g, state, 0, 2 + g.size(),
                                           _left(deadline))
        except TimeoutError as e:
            raise TimeoutError(
                f"monitored_barrier: rank 0 did not release this rank "
                f"within {_within(seconds)}; rank 0 names the ranks that "
                f"did not arrive") from e
        answered = int(answer[0])
        if answered < call:
            continue
        if answered > call:
            raise _calls_differ(g, 0, answered, call)
        if int(answer[1]) == _RELEASE:
            return
        missing = [r for r in range(g.size()) if answer[2 + r]]
        if not missing:
            raise Error("monitored_barrier: rank 0 gave up on the barrier "
                        "(see its error)")
        late = "this rank arrived after " if g.rank() in missing else ""
        within = "rank 0's timeout"
        raise TimeoutError(
            f"monitored_barrier: {late}rank 0 gave up on the barrier: "
            f"{_did_not_reach(g, missing, within)}")


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """A barrier that names the ranks that did not arrive, as torch's:
    rank 0 waits up to `timeout` (seconds or a timedelta; the group's when
    None) for every other rank, then releases them. A rank that does not
    arrive is a TimeoutError on rank 0 naming it (with wait_all_ranks,
    naming every such rank); the call then fails on every rank: one that
    waits for rank 0 hears of it and fails naming the same ranks, and so
    does a late rank as soon as it arrives. A call that failed leaves the
    group as it was: the next monitored_barrier, with every rank there,
    passes (each rank's n-th call is one barrier, as with collectives)."""
    if _not_member(group):
        return None
    g = _group(group)
    if timeout is None:
        seconds = None
    elif isinstance(timeout, _datetime.timedelta):
        seconds = timeout.total_seconds()
    else:
        seconds = float(timeout)
    state = _monitored_barrier_state(g)
    state.calls += 1
    if g.rank() == 0:
        _monitored_barrier_root(g, state, state.calls, seconds, wait_all_ranks)
    else:
        _monitored_barrier_member(g, state, state.calls, seconds)
    return None


def isend(tensor, dst, group=None, tag=0):
    if _not_member(group):
        return None
    return Work(_group(group).isend(_real(tensor),
                                    _rank_in(group, dst, "dst"), tag))


def irecv(tensor, src=None, group=None, tag=0):
    """src=None receives from whichever rank sends first; the Work's
    source_rank() says which once it completed."""
    if _not_member(group):
        return None
    peer = _C.ANY_SOURCE if src is None else _rank_in(group, src, "src")
    return Work(_group(group).irecv(_real(tensor), peer, tag), [tensor])


def send(tensor, dst, group=None, tag=0):
    if _not_member(group):
        return None
    isend(tensor, dst, group, tag).wait()
    return None


def recv(tensor, src=None, group=None, tag=0):
    """Returns the rank the message came from (in the default group, as
    torch.distributed does); -1 on a rank outside `group`."""
    if _not_member(group):
        return -1
    work = irecv(tensor, src, group, tag)
    work.wait()
    members = getattr(group, "_global_ranks", None)
    source = work.source_rank()
    return members[source] if members is not None else source


class P2POp:
    """One point-to-point operation for batch_isend_irecv: `op` is isend or
    irecv (commdist's or torch.distributed's), `peer` a default-group
    rank."""

    def __init__(self, op, tensor, peer, group=None, tag=0):
        self.op = _p2p_function(op)
        self.tensor = tensor
        self.peer = peer
        self.group = group
        self.tag = tag

    def __repr__(self):
        return (f"P2POp({self.op.__name__}, peer={self.peer}, "
                f"tag={self.tag})")


def _p2p_function(op):
    if op is isend or op is irecv:
        return op
    if getattr(op, "__module__", "").startswith("torch.distributed") and \
            getattr(op, "__name__", "") in ("isend", "irecv"):
        return isend if op.__name__ == "isend" else irecv
    raise InvalidArgument(
        f"P2POp: op must be isend or irecv (commdist's or "
        f"torch.distributed's), not {op!r}")


def batch_isend_irecv(p2p_op_list):
    """Starts every operation of the list and returns their Works, in list
    order. Every operation must use the same group."""
    if not isinstance(p2p_op_list, (list, tuple)) or not p2p_op_list or \
            not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise InvalidArgument(
            "batch_isend_irecv: p2p_op_list must be a non-empty list of "
            "P2POp")
    first = p2p_op_list[0].group
    if any(p.group is not first for p in p2p_op_list):
        raise InvalidArgument(
            "batch_isend_irecv: every operation must use the same group")
    if _not_member(first):
        return []
    return [p.op(p.tensor, p.peer, p.group, p.tag) for p in p2p_op_list]


# ---- Object collectives ----------------------------------------------------------
#
# As torch's: each object is pickled into a byte tensor, the byte counts go
# first, and the bytes follow padded to the longest. Unpickling runs code of
# the sender's choosing: use these only between ranks you trust.


def _byte_device(g):
    """Where the object collectives' byte tensors live: host memory
    (numpy) when the group has a backend for it, else the current CUDA
    device (a "nccl"-only group)."""
    return "cuda" if g.backend_name() == "nccl" else "cpu"


def _bytes_tensor(data, device, count=None):
    import numpy as np

    array = np.zeros(len(data) if count is None else count, dtype=np.uint8)
    array[:len(data)] = np.frombuffer(data, dtype=np.uint8)
    if device == "cpu":
        return array
    import torch

    return torch.from_numpy(array).to(torch.device("cuda",
                                                   torch.cuda.current_device()))


def _counts_tensor(values, device):
    import numpy as np

    array = np.asarray(values, dtype=np.int64)
    if device == "cpu":
        return array
    import torch

    return torch.from_numpy(array).to(torch.device("cuda",
                                                   torch.cuda.current_device()))


def _host(x):
    import numpy as np

    return np.asarray(x) if isinstance(x, np.ndarray) else x.cpu().numpy()


def _unpickle(tensor, size):
    return _pickle.loads(_host(tensor)[:size].tobytes())


def _pickle_and_share_sizes(obj, g, group):
    """Pickles `obj` and all-gathers every rank's pickle length over `group`
    (whose process group is `g`), the prologue of the object gathers.
    Returns (device, data, sizes, longest): the device the bytes travel on,
    this rank's pickle, each rank's pickle length (a list of ints) and the
    largest of them, the slot size every rank pads its pickle to."""
    device = _byte_device(g)
    data = _pickle.dumps(obj)
    sizes = _counts_tensor([0] * g.size(), device)
    all_gather_into_tensor(sizes, _counts_tensor([len(data)], device), group)
    sizes = [int(s) for s in _host(sizes)]
    return device, data, sizes, max(sizes)


def all_gather_object(object_list, obj, group=None):
    """Fills object_list (one slot per rank) with every rank's `obj`."""
    if _not_member(group):
        return None
    g = _group(group)
    world = g.size()
    if len(object_list) != world:
        raise InvalidArgument(
            f"all_gather_object: object_list has {len(object_list)} slots; "
            f"it needs one per rank ({world})")
    device, data, sizes, longest = _pickle_and_share_sizes(obj, g, group)
    everyone = _bytes_tensor(b"", device, longest * world)
    all_gather_into_tensor(everyone, _bytes_tensor(data, device, longest),
                           group)
    for r in range(world):
        object_list[r] = _unpickle(everyone[r * longest:(r + 1) * longest],
                                   sizes[r])
    return None


def broadcast_object_list(object_list, src=0, group=None, device=None):
    """Replaces every item of object_list with `src`'s item (lists of the
    same length on every rank). `device`: where the bytes travel (None: as
    the group needs)."""
    if _not_member(group):
        return None
    g = _group(group)
    where = _byte_device(g) if device is None else \
        ("cpu" if str(device).startswith("cpu") else "cuda")
    me_src = get_rank() == src
    pickles = [_pickle.dumps(o) for o in object_list] if me_src else []
    sizes = _counts_tensor([len(p) for p in pickles] if me_src
                           else [0] * len(object_list), where)
    broadcast(sizes, src, group)
    sizes = [int(s) for s in _host(sizes)]
    everything = _bytes_tensor(b"".join(pickles), where, sum(sizes))
    if sum(sizes) > 0:
        broadcast(everything, src, group)
    if not me_src:
        flat, at = _host(everything), 0
        for i, size in enumerate(sizes):
            object_list[i] = _pickle.loads(flat[at:at + size].tobytes())
            at += size
    return None


def gather_object(obj, object_gather_list=None, dst=0, group=None):
    """On `dst`, fills object_gather_list (one slot per rank) with every
    rank's `obj`; other ranks pass None."""
    if _not_member(group):
        return None
    g = _group(group)
    world = g.size()
    me_dst = get_rank() == dst
    if me_dst and (object_gather_list is None or
                   len(object_gather_list) != world):
        raise InvalidArgument(
            f"gather_object: on dst, object_gather_list needs one slot per "
            f"rank ({world})")
    device, data, sizes, longest = _pickle_and_share_sizes(obj, g, group)
    slots = [_bytes_tensor(b"", device, longest) for _ in range(world)] \
        if me_dst else None
    gather(_bytes_tensor(data, device, longest), slots, dst, group)
    if me_dst:
        for r in range(world):
            object_gather_list[r] = _unpickle(slots[r], sizes[r])
    return None


def scatter_object_list(scatter_object_output_list, scatter_object_input_list,
                        src=0, group=None):
    """Sets scatter_object_output_list[0] on rank r to item r of `src`'s
    scatter_object_input_list (None on the other ranks)."""
    if _not_member(group):
        return None
    g = _group(group)
    world = g.size()
    if not isinstance(scatter_object_output_list, list) or \
            len(scatter_object_output_list) < 1:
        raise InvalidArgument(
            "scatter_object_list: scatter_object_output_list must be a "
            "list with at least one slot")
    me_src = get_rank() == src
    device = _byte_device(g)
    if me_src:
        if scatter_object_input_list is None or \
                len(scatter_object_input_list) != world:
            raise InvalidArgument(
                f"scatter_object_list: on src, scatter_object_input_list "
                f"needs one object per rank ({world})")
        pickles = [_pickle.dumps(o) for o in scatter_object_input_list]
    else:
        pickles = []
    longest = _counts_tensor([max((len(p) for p in pickles), default=0)],
                             device)
    broadcast(longest, src, group)
    longest = int(_host(longest)[0])
    mine = _bytes_tensor(b"", device, longest)
    scatter(mine, [_bytes_tensor(p, device, longest) for p in pickles]
            if me_src else None, src, group)
    size = _counts_tensor([0], device)
    scatter(size, [_counts_tensor([len(p)], device) for p in pickles]
            if me_src else None, src, group)
    scatter_object_output_list[0] = _unpickle(mine, int(_host(size)[0]))
    return None
