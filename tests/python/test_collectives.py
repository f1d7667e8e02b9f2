"""Every collective across real processes, with numpy arrays and torch
tensors, against references computed on each rank (see rank_worker.py)."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
FLAVOURS = ["numpy", "torch"]


def run_ranks(tmp_path, scenario, flavour, world, timeout=240):
    """Runs `world` rank_worker processes; returns their outputs, failing
    the test with every rank's output when any rank failed."""
    store = tmp_path / "store"
    ranks = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world))
        ranks.append(subprocess.Popen(
            [sys.executable, os.path.join(HERE, "rank_worker.py"), scenario,
             flavour, str(store)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True))
    outputs, failed = [], False
    for rank, process in enumerate(ranks):
        try:
            out, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in ranks:
                p.kill()
            out, _ = process.communicate()
            out += f"\n(rank {rank} killed after {timeout} s)"
        outputs.append(out)
        failed |= process.returncode != 0
    if failed:
        pytest.fail("\n".join(f"--- rank {r} (exit {p.returncode}):\n{o}"
                              for r, (p, o) in enumerate(zip(ranks, outputs))))
    return outputs


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("world", [1, 3])
def test_every_collective_against_a_reference(tmp_path, flavour, world):
    outputs = run_ranks(tmp_path, "collectives", flavour, world)
    assert all("collectives" in o and " ok" in o for o in outputs)


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("world", [1, 3])
def test_complex_values_travel_as_real_pairs(tmp_path, flavour, world):
    outputs = run_ranks(tmp_path, "complex_values", flavour, world)
    assert all("complex values ok" in o for o in outputs)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_point_to_point_tags_any_source_and_async(tmp_path, flavour):
    run_ranks(tmp_path, "point_to_point", flavour, 3)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_subgroups_take_default_group_ranks(tmp_path, flavour):
    run_ranks(tmp_path, "subgroups", flavour, 4)


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("world", [1, 3])
def test_coalesced_calls_act_on_every_tensor(tmp_path, flavour, world):
    outputs = run_ranks(tmp_path, "coalesced", flavour, world)
    assert all("coalesced ok" in o for o in outputs)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_shared_host_arrays_are_read_through_mappings(tmp_path, flavour):
    outputs = run_ranks(tmp_path, "shared_host", flavour, 3)
    assert all("shared_host" in o and " ok" in o for o in outputs)


def test_a_dead_peer_is_a_peer_error_naming_it(tmp_path):
    outputs = run_ranks(tmp_path, "dead_peer", "numpy", 3)
    assert "PeerError" in outputs[0] and "PeerError" in outputs[1]


def test_ddp_no_sync_bucket_views_and_unused_parameters(tmp_path):
    run_ranks(tmp_path, "ddp_features", "torch", 3)
