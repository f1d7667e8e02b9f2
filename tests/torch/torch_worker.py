"""One rank of a torch.distributed test of the "libcomm" backend.

    torch_worker.py SCENARIO BACKEND INIT_METHOD OUT_DIR [VARIANT]

RANK and WORLD_SIZE come from the environment (MASTER_ADDR and MASTER_PORT
too for env://). The same scenario runs on "gloo" and on "libcomm"; each
rank saves what it computed to OUT_DIR/rank<R>.pt with torch.save, and the
test compares the two backends' files bit for bit. A scenario that expects
an error saves the error's message and how long it took to arrive.
"""

import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

import commdist.c10d  # noqa: F401  (registers "libcomm")

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])


def init(backend, init_method):
    if init_method == "env://":
        dist.init_process_group(backend, init_method="env://")
    else:
        dist.init_process_group(backend, init_method=init_method, rank=RANK,
                                world_size=WORLD)
    assert dist.get_rank() == RANK and dist.get_world_size() == WORLD
    assert dist.get_backend() == backend, dist.get_backend()


# ---- DDP: the tutorial's ToyModel ---------------------------------------


class ToyModel(nn.Module):
    """The DDP tutorial's model, with an optional branch that the forward
    pass never uses (for find_unused_parameters)."""

    def __init__(self, unused_branch=False):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)
        if unused_branch:
            self.unused = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def batch(step, device="cpu"):
    generator = torch.Generator().manual_seed(1000 * step + RANK)
    return (torch.randn(20, 10, generator=generator).to(device),
            torch.randn(20, 5, generator=generator).to(device))


def train(model, optimizer, steps, first_step, variant, device="cpu"):
    loss_fn = nn.MSELoss()
    for step in range(first_step, first_step + steps):
        inputs, labels = batch(step, device)
        optimizer.zero_grad()
        if variant == "no_sync" and step % 2 == 0:
            # Accumulate this step's gradients locally; the next step's
            # backward synchronizes both.
            with model.no_sync():
                loss_fn(model(inputs), labels).backward()
            inputs, labels = batch(step + 500, device)
        loss_fn(model(inputs), labels).backward()
        optimizer.step()


def scenario_ddp(out_dir, variant):
    """Variant "cuda": the model and the batches on cuda:RANK (one GPU per
    rank, as NCCL requires)."""
    torch.manual_seed(RANK)  # DDP must broadcast rank 0's parameters
    model = ToyModel(unused_branch=variant == "find_unused")
    device = "cpu"
    options = {}
    if variant == "cuda":
        device = f"cuda:{RANK}"
        torch.cuda.set_device(device)
        model = model.to(device)
        options["device_ids"] = [RANK]
    if variant == "find_unused":
        options["find_unused_parameters"] = True
    if variant == "bucket_view":
        options["gradient_as_bucket_view"] = True
    if variant == "static_graph":
        options["static_graph"] = True
    ddp = DDP(model, bucket_cap_mb=0.0001, **options)  # several buckets
    if variant == "allreduce_hook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    if variant == "fp16_hook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    if variant == "powersgd_hook":
        # Its callbacks wait for the group's other Futures.
        from torch.distributed.algorithms.ddp_comm_hooks import \
            powerSGD_hook as powersgd
        state = powersgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=1,
            start_powerSGD_iter=2, random_seed=0)
        ddp.register_comm_hook(state, powersgd.powerSGD_hook)
    optimizer = optim.SGD(ddp.parameters(), lr=0.01)
    train(ddp, optimizer, 6, 0, variant, device)

    # The tutorial's checkpoint: saved on rank 0, loaded on every rank.
    checkpoint = os.path.join(out_dir, "checkpoint.pt")
    if RANK == 0:
        torch.save(ddp.state_dict(), checkpoint)
    dist.barrier()
    ddp.load_state_dict(torch.load(checkpoint, map_location=device))
    train(ddp, optimizer, 6, 6, variant, device)
    state = {name: p.detach().cpu().clone()
             for name, p in ddp.named_parameters()}
    torch.save(state, os.path.join(out_dir, f"rank{RANK}.pt"))
    if variant == "powersgd_hook" and dist.get_backend() == "gloo":
        # torch 1.13's gloo group aborts ("terminate called without an
        # active exception") as the process ends after PowerSGD; its
        # results are saved, and libcomm's run ends normally.
        sys.stdout.flush()
        os._exit(0)


# ---- Every collective on the same inputs --------------------------------


# Set by the "shared" variant on libcomm: every tensor that zeros() and
# data() make lies in shared host memory (commdist.shared_host_array), so
# that the collectives read each other's through mappings.
SHARED = False
# Set by the "shared" variant on both backends: data() gives small whole
# numbers, whose sums and products are exact in every order, so that
# libcomm's results equal gloo's bit for bit at any world size.
EXACT = False


def zeros(*shape, dtype=torch.float32):
    if not SHARED:
        return torch.zeros(*shape, dtype=dtype)
    import commdist
    count = 1
    for n in shape:
        count *= n
    element = torch.empty((), dtype=dtype).element_size()
    raw = torch.from_numpy(commdist.shared_host_array(count * element,
                                                      "uint8"))
    return raw.view(dtype).view(*shape)


def data(salt, count=7, dtype=torch.float32, rank=RANK):
    values = (torch.arange(count, dtype=torch.float64) * (rank + 1) + rank +
              salt) % 5 + 1
    if dtype == torch.bool:
        values = (values.to(torch.int64) % 2).to(torch.bool)
    elif dtype.is_floating_point and not EXACT:
        values = values / 3  # not exact in binary, so order would show
    return zeros(count, dtype=dtype).copy_(values.to(dtype))


def peer_mappings():
    """How many of its peers' blocks of shared host memory this process
    has mapped: read-only shared mappings of libcomm's memfds (its own
    are writable)."""
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps
                   if "libcomm-shared-host" in line and
                   line.split()[1] == "r--s")


def attempt(results, key, run):
    """Records run()'s result under `key`, or None when the backend does
    not support the call (gloo lacks some), so the test compares what both
    have and checks libcomm's other results against references."""
    try:
        results[key] = run()
    except RuntimeError as error:
        if not any(text in str(error) for text in [
                "does not support", "not supported", "no support for",
                "Invalid scalar type"]):
            raise
        results[key] = None


def scenario_collectives(out_dir, variant):
    global SHARED, EXACT
    EXACT = variant == "shared"
    SHARED = EXACT and dist.get_backend() == "libcomm"
    results = {}
    float_ops = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT,
                 "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
    int_ops = dict(float_ops, band=dist.ReduceOp.BAND,
                   bor=dist.ReduceOp.BOR, bxor=dist.ReduceOp.BXOR)
    dtypes = {"f32": torch.float32, "f64": torch.float64,
              "bf16": torch.bfloat16, "f16": torch.float16,
              "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8,
              "i8": torch.int8}
    for dname, dtype in dtypes.items():
        ops = float_ops if dtype.is_floating_point else int_ops
        for oname, op in ops.items():
            tensor = data(1, 33, dtype)
            attempt(results, f"all_reduce/{dname}/{oname}",
                    lambda: dist.all_reduce(tensor, op=op) or tensor)
            for root in range(WORLD):
                tensor = data(2, 5, dtype)
                attempt(results, f"reduce/{dname}/{oname}/{root}",
                        lambda: dist.reduce(tensor, dst=root, op=op) or
                        (tensor if RANK == root else "not the root"))
    # A non-contiguous tensor: staged through a copy and copied back.
    wide = data(3, 24).view(4, 6)
    column = wide[:, 1]
    dist.all_reduce(column)
    results["all_reduce/non_contiguous"] = wide
    # async_op, Work.wait and the Future's value.
    tensor = data(4, 9)
    work = dist.all_reduce(tensor, async_op=True)
    future_value = work.get_future().wait()
    work.wait()
    assert work.is_completed() and work.is_success()
    results["all_reduce/async"] = tensor
    results["all_reduce/future"] = future_value[0]
    coalesced = [data(5, 4), data(6, 6).view(2, 3)]
    dist.all_reduce_coalesced(coalesced)
    results["all_reduce_coalesced"] = coalesced
    for root in range(WORLD):
        tensor = data(7 + root, 11)
        dist.broadcast(tensor, src=root)
        results[f"broadcast/{root}"] = tensor
    gathered = [zeros(6) for _ in range(WORLD)]
    dist.all_gather(gathered, data(8, 6))
    results["all_gather"] = gathered
    # One tensor as every output: gloo leaves the last rank's input in it.
    one = zeros(6)
    dist.all_gather([one] * WORLD, data(8, 6))
    results["all_gather/one_output"] = one
    if WORLD == 2:  # a strided output and a contiguous one that overlap
        square = zeros(2, 2)
        dist.all_gather([square[:, 0], square[0, :]], data(8, 2))
        results["all_gather/overlapping_views"] = square
    # libcomm's backend stages the root's outputs in ordinary memory, which
    # the peers' inputs in shared host memory (variant "shared") do not
    # agree with.
    if variant != "shared":
        one = zeros(5)
        dist.gather(data(12, 5), gather_list=[one] * WORLD if RANK == 0
                    else None, dst=0)
        results["gather/one_output"] = one
    flat = zeros(WORLD * 6)
    attempt(results, "all_gather_into_tensor",
            lambda: dist.all_gather_into_tensor(flat, data(9, 6)) or flat)
    outputs = [[zeros(3), zeros(2, 2)] for _ in range(WORLD)]
    attempt(results, "all_gather_coalesced", lambda: dist.all_gather_coalesced(
        outputs, [data(10, 3), data(11, 4).view(2, 2)]) or outputs)
    for root in range(WORLD):
        targets = [zeros(5) for _ in range(WORLD)] if RANK == root \
            else None
        dist.gather(data(12, 5), gather_list=targets, dst=root)
        results[f"gather/{root}"] = targets
        target = zeros(5)
        sources = [data(13 + r, 5) for r in range(WORLD)] if RANK == root \
            else None
        dist.scatter(target, scatter_list=sources, src=root)
        results[f"scatter/{root}"] = target
    target = zeros(4)
    attempt(results, "reduce_scatter", lambda: dist.reduce_scatter(
        target, [data(20 + r, 4) for r in range(WORLD)]) or target)
    target = zeros(4)
    attempt(results, "reduce_scatter_tensor",
            lambda: dist.reduce_scatter_tensor(
                target, data(30, 4 * WORLD)) or target)
    target = zeros(2 * WORLD)
    dist.all_to_all_single(target, data(40, 2 * WORLD))
    results["all_to_all_single"] = target
    # Uneven splits: rank r sends r + s + 1 elements to rank s.
    in_splits = [RANK + s + 1 for s in range(WORLD)]
    out_splits = [r + RANK + 1 for r in range(WORLD)]
    target = zeros(sum(out_splits))
    dist.all_to_all_single(target, data(41, sum(in_splits)),
                           output_split_sizes=out_splits,
                           input_split_sizes=in_splits)
    results["all_to_all_single/splits"] = target
    targets = [zeros(RANK + r + 1) for r in range(WORLD)]
    attempt(results, "all_to_all", lambda: dist.all_to_all(
        targets, [data(50 + s, RANK + s + 1) for s in range(WORLD)]) or targets)
    # Point to point in a ring, blocking and not, then from any source.
    right, left = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    target = zeros(8)
    if RANK % 2 == 0:
        dist.send(data(60, 8), dst=right)
        dist.recv(target, src=left)
    else:
        dist.recv(target, src=left)
        dist.send(data(60, 8), dst=right)
    results["send_recv"] = target
    target = zeros(8)
    requests = [dist.isend(data(61, 8), dst=right, tag=7),
                dist.irecv(target, src=left, tag=7)]
    for request in requests:
        request.wait()
    results["isend_irecv"] = target
    if RANK == 0:
        sources = set()
        for _ in range(WORLD - 1):
            target = zeros(3)
            sources.add(dist.recv(target))
            results[f"recv_any/{int(target[0])}"] = target
        results["recv_any/sources"] = sorted(sources)
    else:
        dist.send(torch.full((3,), float(RANK)), dst=0)
    dist.barrier()
    # The object collectives.
    gathered = [None] * WORLD
    dist.all_gather_object(gathered, {"rank": RANK, "list": [RANK] * RANK})
    results["all_gather_object"] = gathered
    objects = [{"from": RANK, "x": 1.5}, "text"] if RANK == 0 else [None, None]
    dist.broadcast_object_list(objects, src=0)
    results["broadcast_object_list"] = objects
    gathered = [None] * WORLD if RANK == 0 else None
    dist.gather_object(("rank", RANK), gathered, dst=0)
    results["gather_object"] = gathered
    received = [None]
    dist.scatter_object_list(received, [f"for {r}" for r in range(WORLD)]
                             if RANK == 0 else None, src=0)
    results["scatter_object_list"] = received
    if SHARED:
        assert peer_mappings() > 0, "no peer's shared host memory was mapped"
    torch.save(results, os.path.join(out_dir, f"rank{RANK}.pt"))


# ---- CUDA tensors (a torch with CUDA, one GPU per rank) -------------------


def scenario_cuda(out_dir, _variant):
    """Collectives on CUDA tensors of cuda:RANK, made on a side stream behind
    a kernel that keeps the GPU busy: a collective that did not wait for
    the stream would read its input before it is written. Each result is
    read on that stream right after the call. Saved on the CPU; the test
    checks them against references."""
    device = torch.device("cuda", RANK)
    torch.cuda.set_device(device)
    results = {}
    stream = torch.cuda.Stream(device)

    def made_late(tensor):
        copied = tensor.to(device)
        torch.cuda._sleep(50_000_000)  # some tens of milliseconds
        return copied * 1

    with torch.cuda.stream(stream):
        tensor = made_late(data(1, 33))
        dist.all_reduce(tensor)
        results["all_reduce"] = tensor.cpu()
        tensor = made_late(data(1, 33, torch.bfloat16))
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        results["all_reduce/bf16/max"] = tensor.cpu()
        tensor = made_late(data(2, 11))
        work = dist.all_reduce(tensor, async_op=True)
        future = work.get_future().then(lambda f: f.value()[0] * 2)
        results["all_reduce/future_then"] = future.wait().cpu()
        work.wait()
        results["all_reduce/async"] = tensor.cpu()
        wide = made_late(data(3, 24).view(4, 6))
        dist.all_reduce(wide[:, 1])  # staged through a contiguous copy
        results["all_reduce/non_contiguous"] = wide.cpu()
        coalesced = [made_late(data(5, 4)), made_late(data(6, 6).view(2, 3))]
        dist.all_reduce_coalesced(coalesced)
        results["all_reduce_coalesced"] = [t.cpu() for t in coalesced]
        tensor = made_late(data(7, 11))
        dist.broadcast(tensor, src=0)
        results["broadcast"] = tensor.cpu()
        gathered = [torch.zeros(6, device=device) for _ in range(WORLD)]
        dist.all_gather(gathered, made_late(data(8, 6)))
        results["all_gather"] = [t.cpu() for t in gathered]
        flat = torch.zeros(WORLD * 6, device=device)
        dist.all_gather_into_tensor(flat, made_late(data(9, 6)))
        results["all_gather_into_tensor"] = flat.cpu()
        target = torch.zeros(4, device=device)
        dist.reduce_scatter_tensor(target, made_late(data(30, 4 * WORLD)))
        results["reduce_scatter_tensor"] = target.cpu()
        target = torch.zeros(2 * WORLD, device=device)
        dist.all_to_all_single(target, made_late(data(40, 2 * WORLD)))
        results["all_to_all_single"] = target.cpu()
        if WORLD > 1:
            right, left = (RANK + 1) % WORLD, (RANK - 1) % WORLD
            target = torch.zeros(8, device=device)
            requests = [dist.isend(made_late(data(61, 8)), dst=right),
                        dist.irecv(target, src=left)]
            for request in requests:
                request.wait()
            results["isend_irecv"] = target.cpu()
    torch.cuda.synchronize(device)
    # A call mixing CPU and CUDA tensors fails at the call, on this rank.
    try:
        dist.all_gather([torch.zeros(3, device=device) for _ in range(WORLD)],
                        torch.ones(3))
        results["mixed"] = None
    except (RuntimeError, ValueError) as error:
        results["mixed"] = str(error)
    tensor = torch.ones(4, device=device)
    dist.all_reduce(tensor)  # the group is still usable
    results["after"] = tensor.cpu()
    torch.save(results, os.path.join(out_dir, f"rank{RANK}.pt"))


# ---- Subgroups, failures, errors -----------------------------------------


def scenario_new_group(out_dir, _variant):
    results = {}
    evens = dist.new_group([r for r in range(WORLD) if r % 2 == 0],
                           backend="libcomm")
    everyone = dist.new_group(list(range(WORLD)), backend="libcomm")
    tensor = data(70, 6)
    dist.all_reduce(tensor, group=everyone)
    results["everyone"] = tensor
    if RANK % 2 == 0:
        assert dist.get_backend(evens) == "libcomm", dist.get_backend(evens)
        tensor = data(71, 6)
        dist.all_reduce(tensor, group=evens)
        results["evens"] = tensor
    dist.barrier()
    torch.save(results, os.path.join(out_dir, f"rank{RANK}.pt"))


def save_error(out_dir, error, started):
    with open(os.path.join(out_dir, f"rank{RANK}.error"), "w") as out:
        # The exception's classes: libcomm's errors are RuntimeErrors, as
        # torch's are, and commdist's classes when commdist is imported.
        kinds = ",".join(kind.__name__ for kind in type(error).__mro__)
        out.write(f"{time.monotonic() - started:.3f}\n{kinds}\n{error}")


def scenario_kill(out_dir, _variant):
    """Rank WORLD-1 exits hard in its 5th step; the others must raise."""
    torch.manual_seed(0)
    ddp = DDP(ToyModel())
    optimizer = optim.SGD(ddp.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    started = None
    try:
        for step in range(1000):
            if step == 5:
                if RANK == WORLD - 1:
                    os._exit(17)
                started = time.monotonic()
            inputs, labels = batch(step)
            optimizer.zero_grad()
            loss_fn(ddp(inputs), labels).backward()
            optimizer.step()
    except RuntimeError as error:
        save_error(out_dir, error, started or time.monotonic())
        os._exit(0)
    raise AssertionError("training went on without the killed rank")


FUTURES_PENDING = 100  # receives whose Futures wait, more than threads


def scenario_futures(out_dir, _variant):
    """A Future waited for inside another Future's callback, as PowerSGD's
    hook waits; and a collective's Future, set while many receives issued
    before it, each with a Future, still wait for their messages."""
    import faulthandler
    faulthandler.dump_traceback_later(60, exit=True)  # a hang fails in 60 s
    results = {}
    first = dist.all_reduce(torch.ones(4), async_op=True).get_future()
    inner = torch.full((4,), 10.0)
    results["nested"] = first.then(
        lambda _: dist.all_reduce(inner, async_op=True).get_future().wait()[0]
    ).wait()
    if RANK == 0:
        got = torch.zeros(FUTURES_PENDING, 2)
        pending = [dist.irecv(got[i], src=1, tag=i).get_future()
                   for i in range(FUTURES_PENDING)]
        collective = dist.all_reduce(torch.ones(2), async_op=True).get_future()
        done = threading.Event()
        collective.then(lambda _: done.set())
        # Well inside the group's timeout, which would end the receives.
        results["set_behind_receives"] = done.wait(10)
        results["behind_receives"] = collective.wait()[0]
        dist.send(torch.full((2,), 7.0), dst=1)
        torch.futures.wait_all(pending)
        results["received"] = got
    else:
        dist.all_reduce(torch.ones(2))
        got = torch.zeros(2)
        dist.recv(got, src=0)
        for i in range(FUTURES_PENDING):
            dist.send(torch.full((2,), 3.0 + i), dst=0, tag=i)
        results["received"] = got
    faulthandler.cancel_dump_traceback_later()
    torch.save(results, os.path.join(out_dir, f"rank{RANK}.pt"))


KEPT = []


def scenario_exit_with_a_pending_callback(out_dir, _variant):
    """The program ends with its group alive (held here past
    destroy_process_group, as a comm hook's state may hold it) and a
    receive pending whose Future has a Python callback."""
    KEPT.append(dist.distributed_c10d._get_default_group())
    if RANK == 0:
        future = dist.irecv(torch.zeros(2), src=1).get_future()
        KEPT.append(future.then(lambda f: KEPT.append("called back")))
    dist.barrier()


def scenario_mismatch(out_dir, _variant):
    """Rank 0 all-reduces 10 elements, the others 11."""
    tensor = torch.ones(10 if RANK == 0 else 11)
    started = time.monotonic()
    try:
        dist.all_reduce(tensor)
    except RuntimeError as error:
        save_error(out_dir, error, started)
        os._exit(0)
    raise AssertionError("the mismatched all_reduce succeeded")


def scenario_unsupported(out_dir, _variant):
    """What libcomm cannot do fails at the call, on this rank only, with
    a message that says what; the group stays usable."""
    messages = {}
    for key, run in {
        # torch.distributed's all_reduce views complex tensors as real
        # ones; a direct call hands the complex tensor to the backend.
        "complex": lambda: dist.distributed_c10d._get_default_group()
        .broadcast([torch.ones(4, dtype=torch.cfloat)]).wait(),
        "int16": lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16)),
        "premul_sum": lambda: dist.all_reduce(
            torch.ones(4), op=dist._make_nccl_premul_sum(2.0)),
        # Refused before anything runs: one element cannot hold four
        # results.
        "expanded": lambda: dist.all_reduce(torch.ones(1).expand(4)),
        "expanded_output": lambda: dist.all_gather(
            [torch.zeros(1).expand(2) for _ in range(WORLD)], torch.ones(2)),
    }.items():
        try:
            run()
            messages[key] = None
        except (RuntimeError, ValueError) as error:
            messages[key] = str(error)
    # Tensors the call only reads may be expanded: the broadcast root's, a
    # reduce's non-root ones.
    shared = torch.full((1,), 5.0).expand(4)
    got = shared if RANK == 0 else torch.zeros(4)
    dist.broadcast(got, src=0)
    messages["broadcast_from_expanded"] = got.tolist()
    mine = torch.ones(4) if RANK == 0 else torch.full((1,), 2.0).expand(4)
    dist.reduce(mine, dst=0)
    messages["reduce_from_expanded"] = mine.tolist()
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    messages["after"] = tensor.tolist()
    torch.save(messages, os.path.join(out_dir, f"rank{RANK}.pt"))


def die_in_setup(out_dir, backend, init_method, published):
    """Rank WORLD-1 exits hard as soon as it has published `published`, a
    key of libcomm's set-up with dots for slashes; the others'
    init_process_group must raise, naming it. A thread of the rank watches
    for the key through a client of its own of the env:// store, under the
    prefixes torch 1.13 gives the default group's keys."""
    assert init_method == "env://", init_method
    if RANK == WORLD - 1:
        watcher = dist.TCPStore(os.environ["MASTER_ADDR"],
                                int(os.environ["MASTER_PORT"]),
                                is_master=False, timeout=timedelta(seconds=60))
        key = "default_pg/0/pg/torch/" + published.replace(".", "/")

        def die():
            watcher.wait([key])
            os._exit(17)
        threading.Thread(target=die, daemon=True).start()
    started = time.monotonic()
    try:
        init(backend, init_method)
    except RuntimeError as error:
        save_error(out_dir, error, started)
        os._exit(0)
    if RANK == WORLD - 1:
        time.sleep(60)  # its watcher ends it
    raise AssertionError("the group was created without rank WORLD-1")


def main():
    scenario, backend, init_method, out_dir = sys.argv[1:5]
    variant = sys.argv[5] if len(sys.argv) > 5 else ""
    if scenario == "die_in_setup":
        die_in_setup(out_dir, backend, init_method, variant)
    init(backend, init_method)
    globals()["scenario_" + scenario](out_dir, variant)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
