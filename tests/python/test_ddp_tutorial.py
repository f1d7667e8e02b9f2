"""PyTorch's DDP tutorial ("Getting Started with Distributed Data
Parallel": ToyModel with demo_basic, demo_checkpoint and
demo_model_parallel, on the CPU) ported to commdist by changing only its
import lines: it runs, every rank ends with the same parameters, and they
equal what torch's own DDP over gloo computes from the same script. The
tutorial's torchrun version runs under commrun with torchrun's flags."""

import difflib
import os
import re
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TUTORIAL = os.path.join(HERE, "tutorial")

# The whole port: these lines, and nothing else.
IMPORTS = {
    "import torch.distributed as dist": "import commdist as dist",
    "from torch.nn.parallel import DistributedDataParallel as DDP":
        "from commdist import DistributedDataParallel as DDP",
}


def port_to_commdist(source):
    lines = source.splitlines(keepends=True)
    ported = [IMPORTS.get(line.rstrip("\n"), line.rstrip("\n")) + "\n"
              if line.rstrip("\n") in IMPORTS else line for line in lines]
    changed = [d for d in difflib.ndiff(lines, ported)
               if d.startswith(("+ ", "- "))]
    assert sorted(c[2:].strip() for c in changed if c.startswith("- ")) == \
        sorted(IMPORTS), changed
    return "".join(ported)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def results(output):
    """{(what, rank): [floats]} from the RESULT lines, and the KEYS lines."""
    found = {}
    for what, rank, values in re.findall(r"RESULT (\w+) rank (\d+): (.*)",
                                         output):
        found[(what, int(rank))] = [float(v) for v in values.split()]
    keys = set(re.findall(r"KEYS rank \d+: (.*)", output))
    return found, keys


def run(command, tmp_path, timeout=240, env=None):
    environment = dict(os.environ, MASTER_PORT=str(free_port()),
                       CHECKPOINT_DIR=str(tmp_path), **(env or {}))
    result = subprocess.run(command, capture_output=True, text=True,
                            timeout=timeout, env=environment, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def same(a, b):
    return len(a) == len(b) and all(
        abs(x - y) <= 1e-6 * max(1.0, abs(y)) for x, y in zip(a, b))


def ported_copy(tmp_path, name):
    with open(os.path.join(TUTORIAL, name)) as f:
        source = f.read()
    path = tmp_path / ("commdist_" + name)
    path.write_text(port_to_commdist(source))
    return str(path)


@pytest.fixture(scope="module")
def torch_reference(tmp_path_factory):
    """What torch's DDP over gloo computes from the unchanged tutorial."""
    tmp = tmp_path_factory.mktemp("torch")
    found, keys = {}, set()
    for demo in ("basic", "checkpoint", "model_parallel"):
        out = run([sys.executable, os.path.join(TUTORIAL, "ddp_tutorial.py"),
                   demo, "2"], tmp)
        more, more_keys = results(out)
        found.update(more)
        keys |= more_keys
    return found, keys


@pytest.mark.parametrize("demo", ["basic", "checkpoint", "model_parallel"])
def test_tutorial_demo_ported_by_its_imports(tmp_path, torch_reference, demo):
    script = ported_copy(tmp_path, "ddp_tutorial.py")
    out = run([sys.executable, script, demo, "2"], tmp_path)
    found, keys = results(out)
    reference, reference_keys = torch_reference
    assert set(found) == {(demo, 0), (demo, 1)}, out
    assert found[(demo, 0)] == found[(demo, 1)], "ranks differ"
    assert same(found[(demo, 0)], reference[(demo, 0)]), \
        f"commdist {found[(demo, 0)][:4]} != torch {reference[(demo, 0)][:4]}"
    if demo == "checkpoint":
        # torch's state-dict layout: checkpoints are interchangeable.
        assert keys == reference_keys and len(keys) == 1, (keys,
                                                           reference_keys)
        assert not list(tmp_path.glob("model.checkpoint"))


def test_tutorial_torchrun_version_under_commrun(tmp_path, torch_reference):
    commrun = os.environ.get("COMMRUN_BIN")
    if not commrun:
        pytest.skip("COMMRUN_BIN is not set (meson test sets it)")
    script = ported_copy(tmp_path, "elastic_ddp.py")
    # The tutorial's command line, torchrun replaced by commrun.
    out = run([commrun, "--nnodes=1", "--nproc_per_node=2", "--rdzv_id=100",
               "--rdzv_backend=c10d",
               f"--rdzv_endpoint=127.0.0.1:{free_port()}", script], tmp_path)
    found, _ = results(out)
    reference, _ = torch_reference
    assert set(found) == {("elastic", 0), ("elastic", 1)}, out
    assert found[("elastic", 0)] == found[("elastic", 1)]
    # The same computation as demo_basic.
    assert same(found[("elastic", 0)], reference[("basic", 0)])
