"""Who initialises a key in a run on the notebook's store (``run(fn, kvstore=kv)``):
the notebook for the keys it initialised before the run, rank 0 of the run for
the others, so that a function written for a run with its own servers
(``if kv.rank == 0: kv.init(...)``) gives the same values on both; a rank that
uses a key nobody initialised is told which rank it is and what to call."""

from __future__ import annotations

import numpy as np
import pytest

import labkv
from labkv.cluster import run

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

#: Only stops a hang (the notebook's init never comes): far above a normal run.
TIMEOUT_S = 60


def _rank0_inits(kv):
    """The documented pattern: rank 0 initialises, a barrier, then every rank trains."""
    if kv.rank == 0:
        # str keys are numbered in init order: "b" first, as the notebook did
        kv.init(["b", "w"], [np.full(2, 7.0, np.float32), np.full(4, 5.0, np.float32)])
    kv.barrier()
    kv.push("w", np.full(4, kv.rank + 1.0, np.float32))
    kv.barrier()
    return kv.pull("w"), kv.pull("b")


def _rank1_uses_w_uninitialised(kv):
    if kv.rank == 1:
        kv.push("w", np.ones(4, np.float32))
    return None


def test_rank_0s_init_on_the_notebooks_store_gives_the_values_of_a_run_with_its_own_servers(
    handle,
):
    own = run(_rank0_inits, num_workers=2, cluster=handle, num_servers=2, timeout=TIMEOUT_S)
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2, timeout=TIMEOUT_S)
    try:
        kv.init("b", np.full(2, -1.0, np.float32))  # the notebook's: rank 0's init only checks it
        shared = run(_rank0_inits, num_workers=2, kvstore=kv, timeout=TIMEOUT_S)
        after = kv.pull("w"), kv.pull("b")
        with pytest.raises(ValueError, match="already"):
            kv.init("w", np.zeros(4, np.float32))  # rank 0 initialised it: no second init
    finally:
        kv.close()
    for (w_own, b_own), (w, b) in zip(own, shared, strict=True):
        np.testing.assert_array_equal(w, w_own)  # rank 0's init value replaced by the pushes
        np.testing.assert_array_equal(b_own, np.full(2, 7.0, np.float32))
        np.testing.assert_array_equal(b, np.full(2, -1.0, np.float32))  # the notebook's kept
    np.testing.assert_array_equal(after[0], shared[0][0])
    np.testing.assert_array_equal(after[1], np.full(2, -1.0, np.float32))


@pytest.mark.parametrize("shared", [False, True], ids=["own-servers", "notebooks-store"])
def test_a_rank_using_a_key_nobody_initialised_is_told_its_rank_and_the_fix(handle, shared):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=1) if shared else None
    try:
        with pytest.raises(Exception) as failed:
            run(
                _rank1_uses_w_uninitialised,
                num_workers=2,
                kvstore=kv if shared else "dist_sync",
                cluster=None if shared else handle,
                timeout=TIMEOUT_S,
            )
    finally:
        if kv is not None:
            kv.close()
    chain, exc = [], failed.value
    while exc is not None:
        chain.append(str(exc))
        exc = exc.__cause__
    message = " / ".join(chain)
    assert "rank 1 uses key 'w'" in message, message
    assert "kv.init('w', value)" in message and "kv.barrier()" in message, message
