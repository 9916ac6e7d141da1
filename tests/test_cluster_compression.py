"""Compressed pushes travel packed (2 or 1 bits a value) and give the local
store's numbers bit for bit; pulls stay uncompressed."""

from __future__ import annotations

import numpy as np
import pytest

import labkv
from tests._inprocess import InProcessCluster

KINDS = ["dist_sync", "dist_async", "dist_device_sync"]


def _steps(kv, params, seed=0, shapes=((5,), (3, 7))):
    """Five pushes from two devices of a small and a sliced key; every pull."""
    rng = np.random.default_rng(seed)
    kv.set_gradient_compression(params)
    kv.init(["small", "sliced"], [np.zeros(shape, np.float32) for shape in shapes])
    pulled = []
    for _ in range(5):
        grads = [
            [rng.normal(0, 0.6, shape).astype(np.float32) for _ in labkv.devices(2)]
            for shape in shapes
        ]
        kv.push(
            ["small", "sliced"],
            [[labkv.array(g, device=d) for g, d in zip(gs, labkv.devices(2))] for gs in grads],
        )
        pulled.append(kv.pull(["small", "sliced"]))
    return pulled


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "params", [{"type": "2bit", "threshold": 0.5}, {"type": "1bit", "threshold": 0.1}]
)
def test_compressed_pushes_give_the_local_stores_numbers_bit_for_bit(handle, kind, params):
    local = _steps(labkv.create("device"), params)
    kv = labkv.create(kind, cluster=handle, num_servers=2, bigarray_bound=10)
    try:
        dist = _steps(kv, params)
        assert len(kv.placement()["sliced"]) == 2
    finally:
        kv.close()
    for step_local, step_dist in zip(local, dist):
        for a, b in zip(step_local, step_dist):
            np.testing.assert_array_equal(a, b)
    assert np.abs(local[-1][1]).max() > 0  # something was sent


@pytest.mark.parametrize("kind", KINDS)
def test_a_compressed_push_carries_a_sixteenth_of_the_bytes(handle, kind):
    n = 1 << 20
    received = {}
    for params in (None, {"type": "2bit", "threshold": 0.5}, {"type": "1bit", "threshold": 0.5}):
        kv = labkv.create(kind, cluster=handle, num_servers=2)
        try:
            if params is not None:
                kv.set_gradient_compression(params)
            kv.init("w", np.zeros(n, np.float32))
            before = sum(load["bytes_in"] for load in kv.server_load())
            kv.push("w", np.ones(n, np.float32))
            kv.pull("w")
            after = sum(load["bytes_in"] for load in kv.server_load())
        finally:
            kv.close()
        received[None if params is None else params["type"]] = after - before
    assert received[None] == 4 * n
    assert received["2bit"] == n // 4  # 16x less than float32
    assert received["1bit"] == n // 8  # 32x less


@pytest.mark.parametrize("kind", ["dist_sync", "dist_async"])
@pytest.mark.parametrize(
    "params", [{"type": "2bit", "threshold": 0.5}, {"type": "1bit", "threshold": 0.1}]
)
def test_pieces_cut_inside_a_byte_of_codes_give_the_local_stores_numbers(kind, params):
    # 3 servers slice 41 values at 13 and 27: inside a byte of 2-bit (4 values)
    # and of 1-bit (8 values) codes, so each piece's codes are shifted out of the
    # rank's codes of the whole value (compression.wire_piece)
    shapes = ((5,), (41,))
    local = _steps(labkv.create("device"), params, shapes=shapes)
    with InProcessCluster(kind, num_servers=3, num_workers=1, bigarray_bound=10) as c:
        kv = c.ranks[0]
        dist = _steps(kv, params, shapes=shapes)
        assert [(p["start"], p["stop"]) for p in kv.placement()["sliced"]] == [
            (0, 13),
            (13, 27),
            (27, 41),
        ]
    for step_local, step_dist in zip(local, dist, strict=True):
        for a, b in zip(step_local, step_dist, strict=True):
            np.testing.assert_array_equal(a, b)
    assert np.abs(local[-1][1]).max() > 0
