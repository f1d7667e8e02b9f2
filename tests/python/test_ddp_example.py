"""The ToyModel example (examples/python/ddp_toy.py) under commrun: every
rank ends with identical parameters, equal to single-process training on
the union of the ranks' batches."""

import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


@pytest.mark.parametrize("world", [1, 3])
def test_toy_model_trains_to_identical_parameters(world):
    commrun = os.environ.get("COMMRUN_BIN")
    if not commrun:
        pytest.skip("COMMRUN_BIN is not set (meson test sets it)")
    result = subprocess.run(
        [commrun, "--nproc-per-node", str(world), "--master-port", "0",
         "--", "/usr/bin/python3", os.path.join(ROOT, "examples", "python",
                                                 "ddp_toy.py"),
         "--epochs", "3"],
        capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(world):
        assert (f"[{rank}]: rank {rank}: parameters identical on all {world} "
                f"ranks: True; equal to training on the union of the "
                f"batches: True") in result.stdout, result.stdout
        assert f"[{rank}]: rank {rank}: epoch 2: mean loss" in result.stdout
