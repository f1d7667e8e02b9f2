"""Inputs that libcomm would otherwise misread, or that would overflow a
conversion, are refused with InvalidArgument before anything moves, and the
group stays usable (a group of one rank over a HashStore)."""

import numpy as np
import pytest

import commdist as dist


@pytest.fixture
def world_of_one():
    dist.init_process_group("tcp", store=dist.HashStore(), rank=0,
                            world_size=1, timeout=30)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("dtype", [">f4", ">i8", ">f8", ">f2"])
def test_non_native_byte_order_is_refused_untouched(world_of_one, dtype):
    array = np.arange(4).astype(dtype)
    before = array.copy()
    with pytest.raises(dist.InvalidArgument, match="big-endian"):
        dist.all_reduce(array)
    with pytest.raises(dist.InvalidArgument, match="byte order"):
        dist.broadcast(array, src=0)
    assert np.array_equal(array, before) and array.dtype == before.dtype
    # The same values in native order go through.
    native = array.astype(array.dtype.newbyteorder("="))
    dist.all_reduce(native)
    assert np.array_equal(native, before)


def test_single_byte_arrays_have_no_byte_order(world_of_one):
    array = np.arange(4, dtype=np.uint8)
    dist.all_reduce(array)
    assert np.array_equal(array, np.arange(4))


def test_an_array_without_a_buffer_is_invalid_argument(world_of_one):
    dates = np.array(["2020-01-01"] * 4, dtype="datetime64[D]")
    with pytest.raises(dist.InvalidArgument, match="buffer"):
        dist.all_reduce(dates)
    ones = np.ones(4, dtype=np.float32)
    dist.all_reduce(ones)  # the group is still usable
    assert np.array_equal(ones, np.ones(4))


@pytest.mark.parametrize("timeout", [-1, -0.001, float("nan"), float("inf"),
                                     1e300])
def test_work_wait_refuses_timeouts_it_cannot_honour(world_of_one, timeout):
    work = dist.all_reduce(np.ones(4, dtype=np.float32), async_op=True)
    with pytest.raises(dist.InvalidArgument, match="timeout must be"):
        work.wait(timeout)
    assert work.wait(10)  # the operation itself is fine


def test_work_wait_of_zero_seconds_polls(world_of_one):
    work = dist.barrier(async_op=True)
    work.wait(30)
    assert work.wait(0)


@pytest.mark.parametrize("timeout", [1e300, float("nan"), 0, -5])
def test_group_timeouts_out_of_range_are_refused(timeout):
    with pytest.raises(dist.InvalidArgument, match="timeout must be"):
        dist.init_process_group("tcp", store=dist.HashStore(), rank=0,
                                world_size=1, timeout=timeout)
    dist.init_process_group("tcp", store=dist.HashStore(), rank=0,
                            world_size=1, timeout=30)
    dist.destroy_process_group()
