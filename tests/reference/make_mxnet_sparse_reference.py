# ruff: noqa: E501
"""Run with a Python that has mxnet==1.9.1; writes mxnet_sparse_reference.json beside this file.

Random programs on row-sparse keys of MXNet 1.9.1's ``local`` KVStore: ``init`` with a
row-sparse value, ``push`` of row-sparse gradients from 1-4 devices (``mx.cpu(i)``),
``row_sparse_pull`` of random row ids, with no optimizer, SGD (lazy and not, with weight
decay and momentum) or Adam (lazy and not, with weight decay). Each program is stored
whole (its values, gradients and row ids) with what every pull gave, so that
``tests/test_sparse_mxnet.py`` replays it on labkv without MXNet. float32 throughout;
floats are stored as ``float(np.float32(x))``, which round-trips exactly.

Usage::

    /work/mxnet-venv/bin/python tests/reference/make_mxnet_sparse_reference.py
"""

from __future__ import annotations

import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_PATH = os.path.join(HERE, "mxnet_sparse_reference.json")
SEED = 20240528
NUM_PROGRAMS = 48

OPTIMIZERS = [
    None,
    ("sgd", {"learning_rate": 0.1, "lazy_update": True}),
    ("sgd", {"learning_rate": 0.1, "lazy_update": False}),
    ("sgd", {"learning_rate": 0.05, "wd": 0.1, "momentum": 0.9, "lazy_update": True}),
    ("sgd", {"learning_rate": 0.05, "wd": 0.1, "momentum": 0.9, "lazy_update": False}),
    ("adam", {"learning_rate": 0.01, "wd": 0.05, "lazy_update": True}),
    ("adam", {"learning_rate": 0.01, "wd": 0.05, "lazy_update": False}),
    ("adam", {"learning_rate": 0.02, "lazy_update": True}),
]


def f32list(x):
    return np.asarray(x, dtype=np.float32).tolist()


def random_rows(rng, num_rows, low=0):
    count = int(rng.integers(low, max(low, num_rows // 2) + 1))
    return sorted(rng.choice(num_rows, size=count, replace=False).tolist())


def make_program(rng, number):
    rows, cols = int(rng.integers(6, 16)), int(rng.integers(1, 4))
    optimizer = OPTIMIZERS[number % len(OPTIMIZERS)]
    # An optimizer needs a weight with every row (MXNet refuses others); with no
    # optimizer the value may hold some rows only.
    init_rows = list(range(rows)) if optimizer else random_rows(rng, rows, low=1)
    init = (rng.standard_normal((len(init_rows), cols)) * 0.8).astype(np.float32)
    # MXNet 1.9.1 sizes a key's merge buffers by its first push: a later push from
    # another number of devices fails ("operands shape mismatch") or crashes.
    num_devices = int(rng.integers(1, 5))
    ops = []
    for _ in range(int(rng.integers(3, 9))):
        if rng.random() < 0.65:
            grads = []
            for _ in range(num_devices):
                g_rows = random_rows(rng, rows, low=1)  # MXNet 1.9.1 crashes on an empty one
                data = rng.standard_normal((len(g_rows), cols)).astype(np.float32)
                grads.append({"rows": g_rows, "data": f32list(data)})
            ops.append({"op": "push", "grads": grads})
        else:
            row_ids = rng.integers(0, rows, size=int(rng.integers(1, rows + 3))).tolist()
            ops.append({"op": "pull", "row_ids": row_ids})
    ops.append({"op": "pull", "row_ids": list(range(rows))})
    return {
        "shape": [rows, cols],
        "optimizer": optimizer,
        "init": {"rows": init_rows, "data": f32list(init)},
        "ops": ops,
    }


def run_program(program):
    import mxnet as mx

    shape = tuple(program["shape"])
    kv = mx.kv.create("local")
    if program["optimizer"]:
        name, params = program["optimizer"]
        kv.set_optimizer(mx.optimizer.create(name, **params))
    init = program["init"]
    value = mx.nd.sparse.row_sparse_array(
        (np.array(init["data"], np.float32), init["rows"]), shape=shape
    )
    kv.init("e", value)
    for op in program["ops"]:
        if op["op"] == "push":
            grads = [
                mx.nd.sparse.row_sparse_array(
                    (np.array(g["data"], np.float32).reshape(-1, shape[1]), g["rows"]),
                    shape=shape,
                    ctx=mx.cpu(d),
                )
                for d, g in enumerate(op["grads"])
            ]
            kv.push("e", grads)
        else:
            out = mx.nd.sparse.zeros("row_sparse", shape)
            kv.row_sparse_pull("e", out=out, row_ids=mx.nd.array(op["row_ids"], dtype="int64"))
            op["expected"] = {
                "rows": out.indices.asnumpy().tolist(),
                "data": f32list(out.data.asnumpy()),
            }


def main():
    import mxnet as mx

    rng = np.random.default_rng(SEED)
    programs = [make_program(rng, i) for i in range(NUM_PROGRAMS)]
    for program in programs:
        run_program(program)
    with open(OUT_PATH, "w") as f:
        json.dump({"mxnet": mx.__version__, "seed": SEED, "programs": programs}, f)
    print(f"wrote {len(programs)} programs to {OUT_PATH}")


if __name__ == "__main__":
    main()
