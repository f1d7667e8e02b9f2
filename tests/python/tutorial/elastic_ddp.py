# The tutorial's torchrun version (elastic_ddp.py), for the CPU: started by
# torchrun (or commrun) with its flags, the process group from env://.
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim

from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super(ToyModel, self).__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"Start running basic DDP example on rank {rank}.")

    # create model; on the CPU there is no device to move it to
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
    values = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    print(f"RESULT elastic rank {rank}: " + " ".join(
        f"{v:.9e}" for v in values.tolist()), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    demo_basic()
