"""Random row-sparse programs replayed on labkv give MXNet 1.9.1's values.

The programs and what MXNet's ``local`` store gave for every ``row_sparse_pull`` are in
``tests/reference/mxnet_sparse_reference.json`` (made by
``tests/reference/make_mxnet_sparse_reference.py``): init / push from 1-4 devices /
row_sparse_pull on a row-sparse key, with no optimizer, SGD (lazy and not, weight decay,
momentum) or Adam (lazy and not, weight decay). float32; the tolerance is
``rtol=1e-5, atol=1e-6`` (labkv's formulas add in another order than MXNet's kernels;
the rows pulled must be exactly MXNet's)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import labkv
import labkv.sparse as sparse

PATH = Path(__file__).parent / "reference" / "mxnet_sparse_reference.json"
PROGRAMS = json.loads(PATH.read_text())["programs"]


def rows_of(part, shape):
    data = np.array(part["data"], np.float32).reshape(-1, *shape[1:])
    return sparse.row_sparse_array((data, part["rows"]), shape=shape)


@pytest.mark.parametrize("kind", ["local", "device"])
@pytest.mark.parametrize("number", range(len(PROGRAMS)))
def test_a_random_program_gives_mxnets_values(kind, number):
    program = PROGRAMS[number]
    shape = tuple(program["shape"])
    kv = labkv.create(kind)
    if program["optimizer"]:
        name, params = program["optimizer"]
        kv.set_optimizer(name, **params)
    kv.init("e", rows_of(program["init"], shape))
    devices = labkv.devices(4)
    for op in program["ops"]:
        if op["op"] == "push":
            grads = [rows_of(g, shape).to_device(d) for g, d in zip(op["grads"], devices)]
            kv.push("e", grads)
            continue
        out = sparse.zeros("row_sparse", shape)
        kv.row_sparse_pull("e", out=out, row_ids=np.array(op["row_ids"]))
        expected = op["expected"]
        assert out.indices.tolist() == expected["rows"]
        want = np.array(expected["data"], np.float32).reshape(out.data.shape)
        np.testing.assert_allclose(out.data, want, rtol=1e-5, atol=1e-6)


def test_the_programs_cover_what_the_issue_asks_for():
    optimizers = {json.dumps(p["optimizer"], sort_keys=True) for p in PROGRAMS}
    assert len(optimizers) == 8 and len(PROGRAMS) >= 40
    devices = {len(op["grads"]) for p in PROGRAMS for op in p["ops"] if op["op"] == "push"}
    assert devices == {1, 2, 3, 4}
