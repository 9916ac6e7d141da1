"""Where servers keep their values (``server_device``), on the machine at hand.

The GPU side (values on the workers' GPUs) is in ``tests/test_gpu.py``; here:
the option's checks, the host default on a machine without a GPU, and a clear
error with nothing left behind when a GPU is asked for and there is none."""

from __future__ import annotations

import numpy as np
import pytest

import labkv
from labkv.cluster import ClusterError, run
from tests._waiting import server_tasks, wait_until


@pytest.mark.parametrize("option", ["bogus", "gpu(-1)", "GPU", 0])
def test_a_bad_server_device_is_refused_before_anything_starts(handle, option):
    before = server_tasks(handle.client)
    with pytest.raises(ValueError, match="server_device"):
        labkv.create("dist_sync", cluster=handle, server_device=option)
    with pytest.raises(ValueError, match="server_device"):
        run(lambda kv: None, num_workers=1, cluster=handle, server_device=option)
    assert set(server_tasks(handle.client)) <= set(before)


@pytest.mark.parametrize("option", ["cpu", "auto"])
def test_host_servers_show_in_placement(handle, option):
    if option == "auto" and labkv.num_gpus() > 0:
        pytest.skip("auto picks the GPU here (tests/test_gpu.py)")
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2, server_device=option)
    try:
        kv.init("w", np.zeros(8, np.float32))
        kv.push("w", np.ones(8, np.float32))
        np.testing.assert_array_equal(kv.pull("w"), np.ones(8))
        (piece,) = kv.placement()["w"]
        assert piece["device"].startswith("cpu(0)@tcp://")
    finally:
        kv.close()


@pytest.mark.skipif(labkv.num_gpus() > 0, reason="this machine has a GPU")
@pytest.mark.parametrize("option", ["gpu", "gpu(0)"])
def test_asking_for_a_missing_gpu_names_the_worker_and_leaves_no_server(handle, option):
    before = server_tasks(handle.client)
    with pytest.raises(ClusterError, match=r"has no CUDA GPU.*|could not start") as info:
        labkv.create("dist_sync", cluster=handle, num_servers=2, server_device=option)
    assert "Dask worker tcp://127.0.0.1:" in str(info.value)
    assert "no CUDA GPU" in str(info.value)
    # the cancellation of the started servers reaches the scheduler asynchronously (and
    # earlier tests' servers may be released meanwhile: no new one may remain)
    assert wait_until(lambda: set(server_tasks(handle.client)) <= set(before), 10), before
