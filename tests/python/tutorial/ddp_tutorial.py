# PyTorch's "Getting Started with Distributed Data Parallel" tutorial,
# written as a user writes it for the CPU (gloo, no device_ids), with the
# tutorial's three demos. test_ddp_tutorial.py runs it as it is under torch,
# and with its two import lines changed to commdist's, and compares.
#
#     python3 ddp_tutorial.py DEMO WORLD_SIZE
#
# The tutorial hard-codes MASTER_PORT 12355; the test sets a free port in
# the environment, so the only other change from the tutorial is
# setdefault in setup().
import os
import sys
import tempfile
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
import torch.multiprocessing as mp

from torch.nn.parallel import DistributedDataParallel as DDP


def setup(rank, world_size):
    os.environ.setdefault('MASTER_ADDR', 'localhost')
    os.environ.setdefault('MASTER_PORT', '12355')

    # initialize the process group
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


class ToyModel(nn.Module):
    def __init__(self):
        super(ToyModel, self).__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def emit(line):
    # One write(2) of under PIPE_BUF bytes, so that the ranks' lines never
    # interleave on the shared pipe.
    sys.stdout.flush()
    os.write(1, (line + "\n").encode())


def report(rank, what, model):
    # What the test compares: every parameter after the step, in full.
    values = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    emit(f"RESULT {what} rank {rank}: " + " ".join(
        f"{v:.9e}" for v in values.tolist()))


def demo_basic(rank, world_size):
    print(f"Running basic DDP example on rank {rank}.")
    setup(rank, world_size)

    # create model and move it to GPU with id rank
    torch.manual_seed(rank)
    model = ToyModel()
    ddp_model = DDP(model)

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5)
    loss_fn(outputs, labels).backward()
    optimizer.step()

    report(rank, "basic", ddp_model)
    cleanup()


def run_demo(demo_fn, world_size):
    mp.spawn(demo_fn,
             args=(world_size,),
             nprocs=world_size,
             join=True)


def demo_checkpoint(rank, world_size):
    print(f"Running DDP checkpoint example on rank {rank}.")
    setup(rank, world_size)

    torch.manual_seed(rank)
    model = ToyModel()
    ddp_model = DDP(model)

    CHECKPOINT_PATH = os.environ.get("CHECKPOINT_DIR",
                                     tempfile.gettempdir()) + "/model.checkpoint"
    if rank == 0:
        # All processes should see same parameters as they all start from same
        # random parameters and gradients are synchronized in backward passes.
        # Therefore, saving it in one process is sufficient.
        torch.save(ddp_model.state_dict(), CHECKPOINT_PATH)

    # Use a barrier() to make sure that process 1 loads the model after process
    # 0 saves it.
    dist.barrier()
    # configure map_location properly
    map_location = {'cpu': 'cpu'}
    ddp_model.load_state_dict(
        torch.load(CHECKPOINT_PATH, map_location=map_location))

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5)

    loss_fn(outputs, labels).backward()
    optimizer.step()

    # Not necessary to use a dist.barrier() to guard the file deletion below
    # as the AllReduce ops in the backward pass of DDP already served as
    # a synchronization.

    report(rank, "checkpoint", ddp_model)
    emit(f"KEYS rank {rank}: {sorted(ddp_model.state_dict().keys())}")
    if rank == 0:
        os.remove(CHECKPOINT_PATH)

    cleanup()


class ToyMpModel(nn.Module):
    def __init__(self, dev0, dev1):
        super(ToyMpModel, self).__init__()
        self.dev0 = dev0
        self.dev1 = dev1
        self.net1 = torch.nn.Linear(10, 10).to(dev0)
        self.relu = torch.nn.ReLU()
        self.net2 = torch.nn.Linear(10, 5).to(dev1)

    def forward(self, x):
        x = x.to(self.dev0)
        x = self.relu(self.net1(x))
        x = x.to(self.dev1)
        return self.net2(x)


def demo_model_parallel(rank, world_size):
    print(f"Running DDP with model parallel example on rank {rank}.")
    setup(rank, world_size)

    # setup mp_model and devices for this process (the CPU for both halves)
    dev0 = "cpu"
    dev1 = "cpu"
    torch.manual_seed(rank)
    mp_model = ToyMpModel(dev0, dev1)
    ddp_mp_model = DDP(mp_model)

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_mp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    # outputs will be on dev1
    outputs = ddp_mp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5).to(dev1)
    loss_fn(outputs, labels).backward()
    optimizer.step()

    report(rank, "model_parallel", ddp_mp_model)
    cleanup()


if __name__ == "__main__":
    demos = {"basic": demo_basic, "checkpoint": demo_checkpoint,
             "model_parallel": demo_model_parallel}
    world_size = int(sys.argv[2])
    run_demo(demos[sys.argv[1]], world_size)
