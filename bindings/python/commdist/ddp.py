"""DistributedDataParallel for torch modules.

torch's autograd computes the gradients; libcomm's DDP (the C++ reducer)
buckets them and all-reduces each bucket as soon as its last gradient is
ready, overlapping communication with the rest of the backward pass, then
averages them when the backward pass ends.
"""

import contextlib

import torch
from torch import nn

from . import _C
from ._errors import InvalidArgument, UnsupportedError

_HOOKS = {None: _C.CommHook.ALLREDUCE, "fp16": _C.CommHook.FP16_COMPRESS,
          "bf16": _C.CommHook.BF16_COMPRESS}


def _builtin_hooks():
    """torch's built-in DDP communication hooks that libcomm's reducer runs
    itself, by the function object torch exports."""
    try:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    except ImportError:  # a torch without the distributed package
        return {}
    hooks = {default_hooks.allreduce_hook: _C.CommHook.ALLREDUCE,
             default_hooks.fp16_compress_hook: _C.CommHook.FP16_COMPRESS}
    if hasattr(default_hooks, "bf16_compress_hook"):
        hooks[default_hooks.bf16_compress_hook] = _C.CommHook.BF16_COMPRESS
    return hooks


def _as_device(device):
    if isinstance(device, torch.device):
        return device
    if isinstance(device, int):
        return torch.device("cuda", device)
    return torch.device(device)


def _to_device(value, device):
    """`value` with every tensor in it moved to `device` (as torch's DDP
    moves a single-device CUDA module's inputs)."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_to_device(v, device) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(v, device) for v in value)
    if isinstance(value, dict):
        return type(value)((k, _to_device(v, device))
                           for k, v in value.items())
    return value


class DistributedDataParallel(nn.Module):
    """torch.nn.parallel.DistributedDataParallel over libcomm: a module
    wrapping `module` (its `.module`), with torch's constructor arguments
    and state-dict layout ("module." before every key). Call it like the
    module, then loss.backward(); when backward returns, every parameter's
    .grad holds the average over the ranks.

    Parameters and buffers are broadcast from rank 0 at construction, and
    buffers again before each forward (broadcast_buffers). A parameter
    that took no part in the backward on any rank keeps its .grad as it was
    (None before its first gradient), as in torch; that needs
    find_unused_parameters=True or static_graph=True, as in torch.

    device_ids and output_device: None, or the CPU for a CPU module; a
    CUDA device must be the one device of the module's parameters. The
    gradients live in tensors the reducer owns, and .grad is made to alias
    them after each backward; optimizer.zero_grad() in either form works.
    `comm_hook` ("fp16" or "bf16") is libcomm's shortcut for
    register_comm_hook with torch's fp16/bf16 compression hooks.

    `shared_host_buckets` (libcomm's, True by default): a CPU module's
    buckets lie in shared host memory (commdist.shared_host_array), which
    ranks on one host read from each other directly; every rank must agree,
    or all use ordinary memory. A process forked after construction (a
    DataLoader worker) then shares the buckets with its parent instead of
    copying them on write: with gradient_as_bucket_view, a child that
    writes a gradient (zero_grad) writes the parent's. Pass False to keep
    torch's copy-on-write behaviour there.
    """

    def __init__(self, module, device_ids=None, output_device=None, dim=0,
                 broadcast_buffers=True, process_group=None, bucket_cap_mb=25,
                 find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False,
                 comm_hook=None, shared_host_buckets=True):
        super().__init__()
        from . import _group, get_backend

        if not isinstance(module, nn.Module):
            raise InvalidArgument(
                f"DistributedDataParallel wraps a torch.nn.Module, not a "
                f"{type(module).__name__}")
        del check_reduction  # deprecated in torch, and ignored there too
        if dim != 0:
            raise UnsupportedError(
                "DistributedDataParallel: dim must be 0; libcomm's DDP does "
                "not split inputs over devices")
        if comm_hook not in _HOOKS:
            raise InvalidArgument(
                f"comm_hook must be None, 'fp16' or 'bf16', not {comm_hook!r}")
        self.module = module
        self.process_group = _group(process_group)
        self.dim = dim
        self.broadcast_buffers = broadcast_buffers
        self.bucket_bytes_cap = int(bucket_cap_mb * 1024 * 1024)
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = static_graph
        self.require_backward_grad_sync = True
        # Whether the step under way communicates, as its forward decided.
        self._sync_step = True
        self._bucket_cap_mb = float(bucket_cap_mb)
        self._shared_host_buckets = bool(shared_host_buckets)
        self._hook = _HOOKS[comm_hook]
        self._hook_registered = False
        self._check_devices(device_ids, output_device,
                            get_backend(process_group))
        self._build_reducer()
        # From the first step on, which parameters took part anywhere, when
        # static_graph promises that this never changes.
        self._static_used = None

    # ---- Construction ---------------------------------------------------------

    def _check_devices(self, device_ids, output_device, backend):
        devices = {p.device for p in self.module.parameters()}
        devices |= {b.device for b in self.module.buffers()}
        if device_ids is not None and not isinstance(device_ids,
                                                     (list, tuple)):
            raise InvalidArgument(
                f"device_ids must be None or a list of one device, not "
                f"{device_ids!r}")
        wanted = [_as_device(d) for d in (device_ids or [])]
        if len(wanted) > 1:
            raise InvalidArgument(
                f"device_ids can only be None or contain a single element "
                f"(as in torch), got {device_ids!r}")
        out = None if output_device is None else _as_device(output_device)
        self.device_ids = None
        self.output_device = None
        self.device_type = next(iter(devices)).type if devices else "cpu"
        if wanted and wanted[0].type == "cuda":
            if wanted[0].index is None:
                wanted[0] = torch.device("cuda", torch.cuda.current_device())
            if devices != {wanted[0]}:
                raise InvalidArgument(
                    f"DistributedDataParallel: device_ids={device_ids!r} "
                    f"names {wanted[0]}, but the module's parameters and "
                    f"buffers are on {sorted(map(str, devices))}; move the "
                    f"module there first (module.to({wanted[0].index})), or "
                    f"pass device_ids=None for a CPU or multi-device module")
            if out is not None and out != wanted[0]:
                raise InvalidArgument(
                    f"DistributedDataParallel: output_device={output_device!r}"
                    f" must be device_ids[0] ({wanted[0]})")
            self.device_ids = [wanted[0].index]
            self.output_device = wanted[0].index
        elif wanted or out is not None:
            named = wanted[0] if wanted else out
            if named.type != "cpu" or (out is not None and out.type != "cpu"):
                raise InvalidArgument(
                    f"DistributedDataParallel: device_ids and output_device "
                    f"must be None, the CPU or one CUDA device; got "
                    f"device_ids={device_ids!r}, "
                    f"output_device={output_device!r}")
            if devices - {torch.device("cpu")}:
                raise InvalidArgument(
                    f"DistributedDataParallel: device_ids names the CPU but "
                    f"the module is on {sorted(map(str, devices))}")
        if backend == "nccl" and not any(d.type == "cuda" for d in devices):
            raise InvalidArgument(
                f"DistributedDataParallel: the group's backend is 'nccl', "
                f"which reduces CUDA tensors only, and the module is on "
                f"{sorted(map(str, devices)) or ['cpu']}; use 'gloo' (or "
                f"'cpu:gloo,cuda:nccl') for a CPU module")

    def _build_reducer(self):
        """Registers the module's parameters with a new reducer: a
        collective (the ranks' parameters are compared and rank 0's
        broadcast), so every rank does it at the same point."""
        named = [(n, p) for n, p in self.module.named_parameters()
                 if p.requires_grad]
        if not named:
            raise InvalidArgument(
                "DistributedDataParallel: the module has no parameter that "
                "requires grad")
        for name, p in named:
            if p.layout != torch.strided:
                raise InvalidArgument(
                    f"DistributedDataParallel: parameter {name} is {p.layout};"
                    f" libcomm's reducer takes dense parameters only")
            if not p.is_contiguous():
                raise InvalidArgument(
                    f"DistributedDataParallel: parameter {name} "
                    f"({tuple(p.shape)}, strides {p.stride()}) is not "
                    f"contiguous (a channels_last module's, or a transposed "
                    f"view), and libcomm's reducer works on parameters in "
                    f"place; wrap the module after "
                    f"module.to(memory_format=torch.contiguous_format), or "
                    f"make the parameter contiguous")
        for name, b in self.module.named_buffers():
            if not b.is_contiguous():
                raise InvalidArgument(
                    f"DistributedDataParallel: buffer {name} is not "
                    f"contiguous, and libcomm broadcasts buffers in place; "
                    f"wrap the module after "
                    f"module.to(memory_format=torch.contiguous_format)")
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        # The reducer's own gradient tensors; .grad aliases them once a
        # parameter has had a gradient.
        self._grads = [torch.zeros_like(p, memory_format=torch.contiguous_format)
                       for p in self._params]
        self._places = [(p.data_ptr(), p.dtype, p.device)
                        for p in self._params]
        buffers = list(self.module.named_buffers())
        self.reducer = _C.Reducer(
            self.process_group, self._names, self._params, self._grads,
            [n for n, _ in buffers], [b for _, b in buffers],
            self._bucket_cap_mb, self.gradient_as_bucket_view,
            self.find_unused_parameters or self.static_graph,
            self.broadcast_buffers, self._hook,
            shared_host_buckets=self._shared_host_buckets)
        if self.gradient_as_bucket_view:
            from torch.utils.dlpack import from_dlpack
            for index, p in enumerate(self._params):
                self._grads[index] = from_dlpack(self.reducer.grad(index))
                if p.grad is not None:
                    self._grads[index].copy_(p.grad)
                    p.grad = self._grads[index]
        self._marked = set()
        self._finish_queued = False
        # The AccumulateGrad node of each parameter runs its hooks after
        # the gradient was added into .grad: the moment it is ready.
        self._accumulators = []
        self._hook_handles = []
        for index, p in enumerate(self._params):
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            self._hook_handles.append(
                accumulator.register_hook(self._make_hook(index)))
            self._accumulators.append(accumulator)

    def _stale(self):
        """Whether to(), double() and the like replaced the parameters'
        memory since the reducer registered it."""
        return any((p.data_ptr(), p.dtype, p.device) != place
                   for p, place in zip(self._params, self._places))

    def _rebuild(self):
        for handle in self._hook_handles:
            handle.remove()
        self._build_reducer()

    # ---- The backward pass ---------------------------------------------------

    def _make_hook(self, index):
        def hook(*_):
            p = self._params[index]
            mine = self._grads[index]
            if p.grad is not None and p.grad is not mine:
                # A first gradient, or one after zero_grad(set_to_none=True):
                # move it where the reducer reads it.
                mine.copy_(p.grad)
                p.grad = mine
            if not self._sync_step:
                return
            self._marked.add(index)
            self.reducer.mark_grad_ready(index)
            if not self._finish_queued:
                self._finish_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(
                    self._finish)
        return hook

    def _finish(self):
        self._finish_queued = False
        marked, self._marked = self._marked, set()
        tolerant = self.find_unused_parameters or self.static_graph
        unmarked = [i for i in range(len(self._params)) if i not in marked]
        # What an unmarked parameter's .grad was: kept if no rank used it.
        kept = {}
        if tolerant:
            for i in unmarked:
                grad = self._params[i].grad
                kept[i] = grad.clone() if grad is self._grads[i] else grad
        self.reducer.finish()
        if not tolerant:
            return  # finish() refused any unmarked parameter
        # Every rank exchanges its flags, whether or not it used them all:
        # the others may not have.
        used = self._used_anywhere(marked)
        for i in unmarked:
            p = self._params[i]
            if used[i]:
                p.grad = self._grads[i]  # the average of the others'
            elif kept[i] is None:
                p.grad = None
            elif kept[i] is not p.grad:
                self._grads[i].copy_(kept[i])
                p.grad = self._grads[i]

    def _used_anywhere(self, marked):
        """Per parameter, whether some rank produced its gradient in this
        step (one all_reduce of a flag per parameter; once only under
        static_graph)."""
        if self.static_graph and self._static_used is not None:
            return self._static_used
        flags = torch.zeros(len(self._params), dtype=torch.uint8)
        flags[list(marked)] = 1
        from . import ReduceOp, all_reduce
        all_reduce(flags, op=ReduceOp.MAX, group=self.process_group)
        used = [bool(f) for f in flags]
        if self.static_graph:
            self._static_used = used
        return used

    # ---- What users call -----------------------------------------------------

    def forward(self, *inputs, **kwargs):
        if self._stale():
            # .to(), .double() and the like gave the parameters new memory:
            # register it again (every rank does, as every rank moved its
            # module).
            self._rebuild()
        if self.device_ids:
            device = torch.device("cuda", self.device_ids[0])
            inputs = _to_device(inputs, device)
            kwargs = _to_device(kwargs, device)
        # As in torch: whether the backward communicates is decided here,
        # by the no_sync() this forward runs in, and the buffers are
        # broadcast on the first forward and after one whose backward
        # communicated (the reducer keeps both).
        training = torch.is_grad_enabled()
        if training:
            self._sync_step = self.require_backward_grad_sync
        self.reducer.before_forward(training)
        return self.module(*inputs, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """A context in which backward passes only accumulate gradients
        locally; the first synchronised backward after it reduces the sum."""
        previous = self.require_backward_grad_sync
        self.reducer.enter_no_sync()
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous
            self.reducer.exit_no_sync()

    def register_comm_hook(self, state, hook):
        """Accepts torch's built-in hooks, which libcomm's reducer runs
        itself: default_hooks.allreduce_hook, fp16_compress_hook and
        bf16_compress_hook (torch.distributed.algorithms.ddp_comm_hooks),
        with `state` None or this DDP's process group. Like torch, once,
        on every rank, before training. Other hooks are refused: libcomm's
        reducer does not call Python per bucket."""
        from . import GroupMember, UnsupportedError as _Unsupported

        if self._hook_registered:
            raise InvalidArgument(
                "register_comm_hook can only be called once (as in torch)")
        builtin = _builtin_hooks()
        if hook not in builtin:
            name = getattr(hook, "__qualname__", repr(hook))
            raise _Unsupported(
                f"register_comm_hook: {name} is not one of torch's built-in "
                f"hooks that libcomm runs (allreduce_hook, "
                f"fp16_compress_hook, bf16_compress_hook from "
                f"torch.distributed.algorithms.ddp_comm_hooks.default_hooks)"
                f"; libcomm's reducer does not call Python hooks per bucket")
        if state is not None and state is not self.process_group and \
                not (state is GroupMember.WORLD and
                     self.process_group is GroupMember.WORLD):
            raise _Unsupported(
                "register_comm_hook: `state` must be None or this "
                "DistributedDataParallel's process group; libcomm's built-in "
                "hooks reduce over the group DDP was made with")
        self._hook_registered = True
        if builtin[hook] != self._hook:
            self._hook = builtin[hook]
            self._rebuild()

    def _set_static_graph(self):
        self.static_graph = True
        self._rebuild()
