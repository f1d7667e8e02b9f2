"""The ToyModel of PyTorch's DDP tutorial, trained with torch's autograd on
the CPU and commdist's DistributedDataParallel reducing the gradients.

    PYTHONPATH=build/bindings/python build/tools/commrun --nproc-per-node 2 \\
        --master-port 0 /usr/bin/python3 examples/python/ddp_toy.py

Each rank trains on its DistributedSampler share of a synthetic dataset and
prints its loss each epoch. At the end every rank checks that
 - its parameters are bitwise identical to every other rank's, and
 - they equal, within 1e-5 relative, a model it trained alone on the
   union of all ranks' batches (what DDP promises: averaged gradients);
and exits 1 when either does not hold.
"""

import argparse
import copy

import torch
from torch import nn

import commdist as dist


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16,
                        help="samples per rank per step")
    parser.add_argument("--bucket-cap-mb", type=float, default=0.0005,
                        help="small, so that the toy model has several "
                             "buckets")
    args = parser.parse_args()

    dist.init_process_group("tcp")  # env://, as commrun and torchrun set it
    rank, world = dist.get_rank(), dist.get_world_size()

    # Different initial weights on every rank: DDP must broadcast rank 0's.
    torch.manual_seed(1000 + rank)
    model = ToyModel()
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    reference = copy.deepcopy(model)  # rank 0's weights, after the broadcast

    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(args.samples, 10, generator=generator)
    targets = torch.randn(args.samples, 5, generator=generator)

    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.001)
    samplers = [dist.DistributedSampler(args.samples, num_replicas=world,
                                        rank=r, seed=1) for r in range(world)]

    for epoch in range(args.epochs):
        for sampler in samplers:
            sampler.set_epoch(epoch)
        shares = [list(s) for s in samplers]
        mine = shares[rank]
        total = 0.0
        for start in range(0, len(mine) - args.batch + 1, args.batch):
            batch = mine[start:start + args.batch]
            optimizer.zero_grad()
            loss = loss_fn(ddp(inputs[batch]), targets[batch])
            loss.backward()  # gradients are averaged when this returns
            optimizer.step()
            total += loss.item()

            # The same step alone on the union of every rank's batch.
            union = sum((s[start:start + args.batch] for s in shares), [])
            reference_optimizer.zero_grad()
            loss_fn(reference(inputs[union]), targets[union]).backward()
            reference_optimizer.step()
        print(f"rank {rank}: epoch {epoch}: mean loss {total / (len(mine) // args.batch):.6f}",
              flush=True)

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(everyone, flat)
    identical = all(torch.equal(flat, other) for other in everyone)
    expected = torch.cat([p.detach().reshape(-1)
                          for p in reference.parameters()])
    close = torch.allclose(flat, expected, rtol=1e-5, atol=1e-7)
    print(f"rank {rank}: parameters identical on all {world} ranks: "
          f"{identical}; equal to training on the union of the batches: "
          f"{close} (largest difference {(flat - expected).abs().max():.2e})",
          flush=True)
    dist.destroy_process_group()
    raise SystemExit(0 if identical and close else 1)


if __name__ == "__main__":
    main()
