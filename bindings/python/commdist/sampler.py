"""DistributedSampler: each rank's share of a dataset, as torch's."""

from . import _C


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

