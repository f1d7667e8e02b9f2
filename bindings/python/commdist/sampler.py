"""DistributedSampler: each rank's share of a dataset, as torch's."""

from . import _C

_SEEDS = 1 << 64


class DistributedSampler:
    """torch.utils.data.distributed.DistributedSampler's contract and
    order: each rank draws len(dataset) / num_replicas indices (rounded up,
    padding by repeating; down with drop_last), shuffled as torch shuffles
    them for seed + epoch."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True,
                 seed=0, drop_last=False):
        from . import get_rank, get_world_size

        size = dataset if isinstance(dataset, int) else len(dataset)
        self.dataset = dataset
        self.num_replicas = (get_world_size() if num_replicas is None
                             else num_replicas)
        self.rank = get_rank() if rank is None else rank
        # torch seeds its generator with seed + epoch as a 64-bit value, a
        # negative one in two's complement; the sampler adds the two modulo
        # 2^64 too.
        self._sampler = _C.DistributedSampler(size, self.rank,
                                              self.num_replicas, shuffle,
                                              seed % _SEEDS, drop_last)
        self.num_samples = len(self._sampler)
        self.total_size = self.num_samples * self.num_replicas
        self.drop_last = drop_last
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch):
        self._sampler.set_epoch(epoch % _SEEDS)
        self.epoch = epoch

    def __iter__(self):
        return iter(self._sampler.indices())

    def __len__(self):
        return self.num_samples
