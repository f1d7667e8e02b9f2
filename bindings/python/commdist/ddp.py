"""DistributedDataParallel for torch modules, and DistributedSampler.

torch's autograd computes the gradients; libcomm's DDP (the C++ reducer)
buckets them and all-reduces each bucket as soon as its last gradient is
ready, overlapping communication with the rest of the backward pass, then
averages them when the backward pass ends.
"""

from . import _C
from ._errors import InvalidArgument


class DistributedDataParallel:
    """Wraps a torch.nn.Module as torch.nn.parallel.DistributedDataParallel
    does: call it like the module, then loss.backward(); when backward
    returns, every parameter's .grad holds the average over the ranks.

    Parameters and buffers are broadcast from rank 0 at construction, and
    buffers again before each forward (broadcast_buffers). The gradients
    live in tensors the reducer owns; keep them by zeroing them in place
    (optimizer.zero_grad(set_to_none=False), torch 1.13's default): a
    .grad replaced by another tensor is copied back into its place.
    """

    def __init__(self, module, process_group=None, bucket_cap_mb=25,
                 find_unused_parameters=False, broadcast_buffers=True,
                 gradient_as_bucket_view=False, comm_hook=None):
        import torch

        from . import _group

        self.module = module
        self.process_group = _group(process_group)
        named = [(n, p) for n, p in module.named_parameters()
                 if p.requires_grad]
        if not named:
            raise InvalidArgument(
                "DistributedDataParallel: the module has no parameter that "
                "requires grad")
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        for p in self._params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self._grads = [p.grad for p in self._params]
        buffers = [(n, b) for n, b in module.named_buffers()]
        hook = {None: _C.CommHook.ALLREDUCE, "fp16": _C.CommHook.FP16_COMPRESS,
                "bf16": _C.CommHook.BF16_COMPRESS}
        if comm_hook not in hook:
            raise InvalidArgument(
                f"comm_hook must be None, 'fp16' or 'bf16', not {comm_hook!r}")
        self.reducer = _C.Reducer(
            self.process_group, self._names, self._params, self._grads,
            [n for n, _ in buffers], [b for _, b in buffers],
            float(bucket_cap_mb), gradient_as_bucket_view,
            find_unused_parameters, broadcast_buffers, hook[comm_hook])
        if gradient_as_bucket_view:
            # The reducer's gradients are now views into its buckets: make
            # them the parameters' .grad, so that backward accumulates
            # straight into the buckets.
            from torch.utils.dlpack import from_dlpack
            for index, p in enumerate(self._params):
                p.grad = from_dlpack(self.reducer.grad(index))
                self._grads[index] = p.grad
        self._find_unused = find_unused_parameters
        self._sync = True
        self._finish_queued = False
        # The AccumulateGrad node of each parameter runs its hooks after
        # the gradient was added into .grad: the moment it is ready.
        self._accumulators = []
        for index, p in enumerate(self._params):
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            accumulator.register_hook(self._make_hook(index))
            self._accumulators.append(accumulator)

    def _make_hook(self, index):
        def hook(*_):
            import torch

            p = self._params[index]
            if p.grad is not self._grads[index]:
                # Someone replaced .grad (set_to_none=True, say): put the
                # values back where the reducer reads them.
                self._grads[index].copy_(p.grad)
                p.grad = self._grads[index]
            if not self._sync:
                return
            self.reducer.mark_grad_ready(index)
            if not self._finish_queued:
                self._finish_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(
                    self._finish)
        return hook

    def _finish(self):
        self._finish_queued = False
        self.reducer.finish()

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        import torch

        if torch.is_grad_enabled() and self._sync:
            self.reducer.before_forward()
        return self.module(*args, **kwargs)

    def no_sync(self):
        """A context in which backward passes only accumulate gradients
        locally; the first synchronised backward after it reduces the sum."""
        ddp = self

        class _NoSync:
            def __enter__(self):
                ddp.reducer.enter_no_sync()
                self.previous = ddp._sync
                ddp._sync = False

            def __exit__(self, *exc):
                ddp._sync = self.previous
                ddp.reducer.exit_no_sync()
                return False

        return _NoSync()

    def parameters(self, recurse=True):
        return self.module.parameters(recurse)

    def named_parameters(self, *args, **kwargs):
        return self.module.named_parameters(*args, **kwargs)

    def state_dict(self, *args, **kwargs):
        """The module's own keys, with no wrapper prefix."""
        return self.module.state_dict(*args, **kwargs)


class DistributedSampler:
    """torch.utils.data.distributed.DistributedSampler's contract: each
    rank draws len(dataset) / num_replicas indices (rounded up, padding by
    repeating; down with drop_last), shuffled by seed + epoch."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True,
                 seed=0, drop_last=False):
        from . import get_rank, get_world_size

        size = dataset if isinstance(dataset, int) else len(dataset)
        self.num_replicas = (get_world_size() if num_replicas is None
                             else num_replicas)
        self.rank = get_rank() if rank is None else rank
        self._sampler = _C.DistributedSampler(size, self.rank,
                                              self.num_replicas, shuffle,
                                              seed, drop_last)
        self.num_samples = len(self._sampler)
        self.total_size = self.num_samples * self.num_replicas
        self.drop_last = drop_last
        self.shuffle = shuffle
        self.seed = seed

    def set_epoch(self, epoch):
        self._sampler.set_epoch(epoch)

    def __iter__(self):
        return iter(self._sampler.indices())

    def __len__(self):
        return self.num_samples

