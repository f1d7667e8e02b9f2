"""libcomm as a torch.distributed backend.

Importing this module registers the backend "libcomm" with
torch.distributed::

    import torch.distributed as dist
    import commdist.c10d  # noqa: F401  (registers "libcomm")
    dist.init_process_group("libcomm", init_method="env://")

Every torch.distributed call, and torch's DistributedDataParallel, then runs
on libcomm: CPU tensors over its TCP backend, CUDA tensors (with a torch
built with CUDA) over its NCCL backend; cuda_support() says what this build
does with them. The group joins through the store torch sets up for the
init method (env://, tcp://, file://, or a Store given to
init_process_group), exactly as gloo does.
"""

import atexit as _atexit
import inspect as _inspect

import torch.distributed as _dist

from ._C import ProcessGroupLibcomm, create_process_group, cuda_support
from ._C import close_all as _close_all
from ._C import set_log_rank as _set_log_rank

# Groups still alive as the interpreter exits (torch's destroy_process_group
# drops its references, but DDP or a comm hook's state may hold more) are
# shut down while a Future's Python callback can still run.
_atexit.register(_close_all)

BACKEND = "libcomm"


def _create(store, rank, size, timeout):
    # Log lines carry the process's rank in the default group, as under
    # commdist. torch makes that group first, before it counts as
    # initialized; a later group's rank is its own, and is not logged.
    if not _dist.is_initialized():
        _set_log_rank(rank)
    return create_process_group(store, rank, size, timeout)


# torch 2 asks which device types a backend serves (and warns where it is
# not told); torch 1.13's register_backend has no such parameter.
if BACKEND.upper() not in _dist.Backend._plugins:
    if "devices" in _inspect.signature(
            _dist.Backend.register_backend).parameters:
        _dist.Backend.register_backend(BACKEND, _create,
                                       devices=["cpu", "cuda"])
    else:
        _dist.Backend.register_backend(BACKEND, _create)

__all__ = ["BACKEND", "ProcessGroupLibcomm", "create_process_group",
           "cuda_support"]
