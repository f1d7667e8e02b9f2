"""The exceptions of commdist, one per class of libcomm's C++ hierarchy.

Each also derives from the built-in exception a Python user would catch for
the same trouble (ValueError for bad arguments, TimeoutError, OSError), so
code written against torch.distributed keeps working.
"""

import builtins


class Error(RuntimeError):
    """Every failure libcomm reports."""


class InvalidArgument(Error, ValueError):
    """The call cannot work as made: a bad dtype, a non-contiguous or
    read-only array, a rank out of range. Retrying will not help."""


class UnsupportedError(InvalidArgument):
    """Well formed, but not in this build or backend (NCCL not built, a
    bitwise reduction on NCCL)."""


class TimeoutError(Error, builtins.TimeoutError):
    """A blocking call did not finish within its timeout."""


class PeerError(Error):
    """A peer rank died, closed its connection or broke the protocol.
    `peer_rank` is that rank, or -1 when unknown."""

    peer_rank = -1


class MismatchError(Error):
    """Ranks called different collectives, or one with different dtype,
    count, op or root."""


class BackendError(Error):
    """NCCL, CUDA or a backend's own state failed."""


class SystemError(Error, OSError):  # noqa: A001 - mirrors comm::SystemError
    """A system call failed; `errno` says how."""
