# ruff: noqa: E501
"""Run with a Python that has mxnet==1.9.1 and numpy<1.24; writes mxnet_reference.json beside this file.

Generates reference numbers from the real MXNet 1.9.1 KVStore for labkv's compatibility tests:
optimizer trajectories through ``kv.set_optimizer`` / ``push`` / ``pull``, learning-rate
scheduler values, 2-bit gradient compression round trips, the KVStore tutorial, and a set of
behavioural quirks (each probed in a subprocess with a 20 s timeout).

Everything is deterministic: fixed numpy seeds, float32 everywhere.  Floats are stored as JSON
numbers produced by ``float(np.float32(x))``, which round-trip exactly back to float32.

Usage::

    python make_mxnet_reference.py            # writes mxnet_reference.json
    python make_mxnet_reference.py --probe X  # (internal) run one quirk probe, print JSON
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_PATH = os.path.join(HERE, "mxnet_reference.json")
PROBE_TIMEOUT_S = 20
F32 = np.float32


def f32list(x):
    """Nested list of exact float32 values (as Python floats)."""
    a = np.asarray(x, dtype=F32)
    if a.ndim == 0:
        return float(F32(a))
    return [f32list(v) for v in a]


# --------------------------------------------------------------------------------------------
# data generation
# --------------------------------------------------------------------------------------------


def make_weight(rng, shape):
    return (rng.standard_normal(shape) * 0.8).astype(F32)


def make_grad(rng, shape):
    """Mixed sign and magnitude: some tiny, some around 1, some well above any clip value."""
    base = rng.standard_normal(shape)
    scale = rng.choice([0.01, 0.2, 1.0, 3.0], size=shape)
    g = (base * scale).astype(F32)
    flat = g.reshape(-1)
    # force at least one large positive and one large negative entry every step
    flat[0] = F32(abs(flat[0]) + 1.5)
    flat[-1] = F32(-abs(flat[-1]) - 1.5)
    return g


# --------------------------------------------------------------------------------------------
# optimizers
# --------------------------------------------------------------------------------------------

OPT_CASES = [
    # (case id, optimizer, params, lr_scheduler spec, num_devices, shape, key)
    ("sgd_plain", "sgd", {"learning_rate": 0.1}, None, 1, (2, 3), 0),
    (
        "sgd_mom_wd_rescale_clip",
        "sgd",
        {
            "learning_rate": 0.1,
            "momentum": 0.9,
            "wd": 0.01,
            "rescale_grad": 0.5,
            "clip_gradient": 0.3,
        },
        None,
        1,
        (2, 3),
        0,
    ),
    ("sgd_2dev", "sgd", {"learning_rate": 0.1}, None, 2, (2, 3), 0),
    (
        "sgd_mom_2dev",
        "sgd",
        {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01},
        None,
        2,
        (5,),
        0,
    ),
    (
        "sgd_factor_sched",
        "sgd",
        {"learning_rate": 0.5},
        {"name": "factor", "params": {"step": 2, "factor": 0.5, "base_lr": 0.5}},
        1,
        (2, 3),
        0,
    ),
    (
        "sgd_multifactor_sched",
        "sgd",
        {"momentum": 0.5},
        {"name": "multifactor", "params": {"step": [2, 4], "factor": 0.1, "base_lr": 0.2}},
        1,
        (5,),
        0,
    ),
    (
        "sgd_cosine_sched",
        "sgd",
        {},
        {
            "name": "cosine",
            "params": {"max_update": 4, "base_lr": 0.3, "final_lr": 0.05},
        },
        1,
        (5,),
        0,
    ),
    ("sgd_mom_str_key", "sgd", {"learning_rate": 0.1, "momentum": 0.9}, None, 1, (2, 3), "w"),
    (
        "sgd_mom_int_key_same_data",
        "sgd",
        {"learning_rate": 0.1, "momentum": 0.9},
        None,
        1,
        (2, 3),
        0,
    ),
    ("nag_mom_wd", "nag", {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01}, None, 1, (2, 3), 0),
    (
        "nag_clip_rescale",
        "nag",
        {"learning_rate": 0.1, "momentum": 0.9, "clip_gradient": 0.5, "rescale_grad": 0.5},
        None,
        1,
        (5,),
        0,
    ),
    ("nag_no_mom", "nag", {"learning_rate": 0.1, "wd": 0.01}, None, 1, (5,), 0),
    ("adam_default", "adam", {}, None, 1, (2, 3), 0),
    (
        "adam_wd_clip_rescale",
        "adam",
        {"learning_rate": 0.01, "wd": 0.01, "clip_gradient": 1.0, "rescale_grad": 0.5},
        None,
        1,
        (2, 3),
        0,
    ),
    (
        "adam_2dev_factor_sched",
        "adam",
        {"learning_rate": 0.05},
        {"name": "factor", "params": {"step": 2, "factor": 0.5, "base_lr": 0.05}},
        2,
        (5,),
        0,
    ),
    ("adagrad_default", "adagrad", {}, None, 1, (2, 3), 0),
    ("adagrad_wd", "adagrad", {"learning_rate": 0.1, "wd": 0.01}, None, 1, (2, 3), 0),
    (
        "adagrad_eps_clip_rescale",
        "adagrad",
        {"learning_rate": 0.1, "eps": 1e-3, "clip_gradient": 0.8, "rescale_grad": 0.5},
        None,
        1,
        (5,),
        0,
    ),
    ("rmsprop_default", "rmsprop", {}, None, 1, (2, 3), 0),
    (
        "rmsprop_wd_clip",
        "rmsprop",
        {
            "learning_rate": 0.01,
            "gamma1": 0.95,
            "wd": 0.01,
            "clip_gradient": 1.0,
            "rescale_grad": 0.5,
        },
        None,
        1,
        (2, 3),
        0,
    ),
    (
        "rmsprop_clip_weights",
        "rmsprop",
        {"learning_rate": 0.3, "clip_weights": 0.6},
        None,
        1,
        (5,),
        0,
    ),
    ("rmsprop_centered", "rmsprop", {"learning_rate": 0.01, "centered": True}, None, 1, (2, 3), 0),
    (
        "rmsprop_centered_wd_clip_cw",
        "rmsprop",
        {
            "learning_rate": 0.05,
            "centered": True,
            "gamma1": 0.95,
            "gamma2": 0.8,
            "wd": 0.01,
            "clip_gradient": 1.0,
            "clip_weights": 0.7,
        },
        None,
        1,
        (5,),
        0,
    ),
    ("adadelta_default", "adadelta", {}, None, 1, (2, 3), 0),
    (
        "adadelta_wd_clip_rescale",
        "adadelta",
        {
            "rho": 0.8,
            "epsilon": 1e-4,
            "wd": 0.01,
            "clip_gradient": 1.0,
            "rescale_grad": 0.5,
            "learning_rate": 123.0,
        },
        None,
        1,
        (5,),
        0,
    ),
    (
        "signum_mom_wdlh",
        "signum",
        {"learning_rate": 0.05, "momentum": 0.9, "wd_lh": 0.01},
        None,
        1,
        (2, 3),
        0,
    ),
    ("signum_default", "signum", {}, None, 1, (5,), 0),
    (
        "signum_wd_clip",
        "signum",
        {"learning_rate": 0.05, "momentum": 0.9, "wd": 0.1, "clip_gradient": 0.5},
        None,
        1,
        (5,),
        0,
    ),
    (
        "signum_no_mom_is_signsgd",
        "signum",
        {
            "learning_rate": 0.05,
            "momentum": 0.0,
            "wd": 0.1,
            "rescale_grad": 0.5,
            "clip_gradient": 0.1,
        },
        None,
        1,
        (2, 3),
        0,
    ),
]

NUM_STEPS = 5


def make_scheduler(mx, spec):
    if spec is None:
        return None
    cls = {
        "factor": mx.lr_scheduler.FactorScheduler,
        "multifactor": mx.lr_scheduler.MultiFactorScheduler,
        "cosine": mx.lr_scheduler.CosineScheduler,
    }[spec["name"]]
    return cls(**spec["params"])


def run_optimizer_case(mx, idx, case):
    name, opt_name, params, sched, ndev, shape, key = case
    # the str-key case and its int twin share data (seed) so their equality can be checked
    seed = 1000 + (7 if name in ("sgd_mom_str_key", "sgd_mom_int_key_same_data") else idx)
    rng = np.random.default_rng(seed)
    w0 = make_weight(rng, shape)
    grads = [[make_grad(rng, shape) for _ in range(ndev)] for _ in range(NUM_STEPS)]

    kwargs = dict(params)
    scheduler = make_scheduler(mx, sched)
    if scheduler is not None:
        kwargs["lr_scheduler"] = scheduler
    opt = mx.optimizer.create(opt_name, **kwargs)
    kv = mx.kv.create("local")
    kv.set_optimizer(opt)
    kv.init(key, mx.nd.array(w0, dtype="float32"))
    out = mx.nd.zeros(shape, dtype="float32")
    weights = []
    for step in range(NUM_STEPS):
        vals = [mx.nd.array(g, ctx=mx.cpu(d), dtype="float32") for d, g in enumerate(grads[step])]
        kv.push(key, vals if ndev > 1 else vals[0])
        kv.pull(key, out=out)
        weights.append(out.asnumpy().astype(F32))
    return {
        "case": name,
        "optimizer": opt_name,
        "params": params,
        "lr_scheduler": sched,
        "num_devices": ndev,
        "key": key,
        "weight0": f32list(w0),
        "grads": [[f32list(g) for g in step] for step in grads],
        "weights": [f32list(w) for w in weights],
    }


# --------------------------------------------------------------------------------------------
# lr schedulers
# --------------------------------------------------------------------------------------------

SCHED_CASES = [
    ("factor", {"step": 3, "factor": 0.5, "base_lr": 1.0}),
    ("factor", {"step": 2, "factor": 0.5, "base_lr": 0.5}),
    ("factor", {"step": 2, "factor": 0.1, "stop_factor_lr": 1e-3, "base_lr": 1.0}),
    (
        "factor",
        {
            "step": 4,
            "factor": 0.5,
            "base_lr": 1.0,
            "warmup_steps": 5,
            "warmup_begin_lr": 0.1,
            "warmup_mode": "linear",
        },
    ),
    (
        "factor",
        {
            "step": 4,
            "factor": 0.5,
            "base_lr": 1.0,
            "warmup_steps": 5,
            "warmup_begin_lr": 0.1,
            "warmup_mode": "constant",
        },
    ),
    ("multifactor", {"step": [3, 7], "factor": 0.5, "base_lr": 1.0}),
    (
        "multifactor",
        {
            "step": [3, 7, 12],
            "factor": 0.1,
            "base_lr": 1.0,
            "warmup_steps": 2,
            "warmup_begin_lr": 0.5,
        },
    ),
    ("cosine", {"max_update": 20, "base_lr": 1.0, "final_lr": 0.1}),
    ("cosine", {"max_update": 20, "base_lr": 1.0, "final_lr": 0.1, "warmup_steps": 3}),
    (
        "cosine",
        {
            "max_update": 20,
            "base_lr": 1.0,
            "final_lr": 0.1,
            "warmup_steps": 3,
            "warmup_begin_lr": 0.2,
            "warmup_mode": "constant",
        },
    ),
]


def run_scheduler_cases(mx):
    out = []
    for name, params in SCHED_CASES:
        sched = make_scheduler(mx, {"name": name, "params": params})
        base_lr = sched.base_lr
        nums = list(range(0, 31))
        lrs = [float(sched(n)) for n in nums]  # exact Python doubles, not float32
        out.append(
            {"name": name, "params": params, "base_lr": base_lr, "num_updates": nums, "lrs": lrs}
        )
    return out


# --------------------------------------------------------------------------------------------
# gradient compression
# --------------------------------------------------------------------------------------------

COMP_LEN = 37  # not a multiple of 16 (2-bit block) nor of 32 (1-bit block)


def make_comp_push(rng, threshold):
    v = rng.uniform(-1.6, 1.6, size=COMP_LEN) * rng.choice([0.1, 0.5, 1.0], size=COMP_LEN)
    v = v.astype(F32)
    # exact threshold hits to pin down >= vs >
    v[3] = F32(threshold)
    v[4] = F32(-threshold)
    v[COMP_LEN - 1] = F32(threshold)
    v[COMP_LEN - 2] = F32(-threshold)
    return v


def run_compression_case(mx, comp_type, threshold, ndev, npush, seed, store="device"):
    rng = np.random.default_rng(seed)
    params = {"type": comp_type}
    if threshold is not None:
        params["threshold"] = threshold
    kv = mx.kv.create(store)
    kv.set_gradient_compression(params)
    w0 = np.zeros(COMP_LEN, dtype=F32)
    kv.init(0, mx.nd.array(w0))
    thr = 0.5 if threshold is None else threshold
    pushes = [[make_comp_push(rng, thr) for _ in range(ndev)] for _ in range(npush)]
    out = mx.nd.zeros((COMP_LEN,))
    pulled = []
    for vals in pushes:
        arrs = [mx.nd.array(v, ctx=mx.cpu(d)) for d, v in enumerate(vals)]
        kv.push(0, arrs if ndev > 1 else arrs[0])
        kv.pull(0, out=out)
        pulled.append(out.asnumpy().astype(F32))
    return {
        "type": comp_type,
        "threshold": threshold,
        "threshold_effective": thr,
        "compression_params": params,
        "store": store,
        "num_devices": ndev,
        "weight0": f32list(w0),
        "pushes": [[f32list(v) for v in step] for step in pushes],
        "pulled": [f32list(p) for p in pulled],
    }


def probe_compression_support(mx):
    """Which kvstore types / compression types are accepted."""
    res = {}
    for store in ("local", "device"):
        for params in (
            {"type": "2bit", "threshold": 0.5},
            {"type": "2bit"},
            {"type": "1bit"},
            {"type": "1bit", "threshold": 0.5},
            {"type": "2bit", "threshold": 0.0},
            {"type": "none"},
        ):
            tag = f"{store}:{json.dumps(params, sort_keys=True)}"
            try:
                kv = mx.kv.create(store)
                kv.set_gradient_compression(params)
                res[tag] = "ok"
            except Exception as e:
                res[tag] = "error: " + _last_line(str(e))
    return res


def _last_line(s):
    lines = [ln.strip() for ln in s.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def run_compression(mx):
    support = probe_compression_support(mx)
    cases = [
        run_compression_case(mx, "2bit", 0.5, 2, 5, 11),
        run_compression_case(mx, "2bit", 0.25, 2, 5, 12),
        run_compression_case(mx, "2bit", 0.5, 3, 4, 13),
        run_compression_case(mx, "2bit", None, 2, 4, 14),
        run_compression_case(mx, "2bit", 0.25, 1, 4, 15),
    ]
    one_bit = []
    for thr in (None, 0.3):
        try:
            one_bit.append(run_compression_case(mx, "1bit", thr, 2, 4, 16))
        except Exception as e:
            one_bit.append({"type": "1bit", "threshold": thr, "error": _last_line(str(e))})
    cases.extend(c for c in one_bit if "error" not in c)

    # does a single device get compressed? (compare to an uncompressed sum)
    single = cases[4]
    single_is_raw = all(
        np.array_equal(np.asarray(pulled, F32), np.asarray(pushed[0], F32))
        for pulled, pushed in zip(single["pulled"], single["pushes"], strict=True)
    )
    notes = [
        "MXNet 1.9.1: set_gradient_compression support probe: "
        + "; ".join(f"{k} -> {v}" for k, v in sorted(support.items()))
        + ".",
        "'local' raises (Python-side check: only types containing 'device' or 'dist' accept it); "
        "'device' works with mx.cpu(i) contexts.",
        "1bit attempts: "
        + "; ".join(f"threshold={c.get('threshold')}: " + c.get("error", "ok") for c in one_bit)
        + ".",
        "Default 2bit threshold (no 'threshold' key) is 0.5 (case with threshold null).",
        "With ONE device the 'device' store "
        + (
            "does NOT compress: the pulled value equals the raw pushed value."
            if single_is_raw
            else "DOES compress (pulled value is the dequantised push)."
        )
        + " (case with num_devices 1).",
        "No updater set, so the store assigns the merged value: pulled = sum over devices of "
        "the dequantised per-device values; each device keeps its own residual across pushes.",
    ]
    return cases, " ".join(notes)


# --------------------------------------------------------------------------------------------
# tutorial
# --------------------------------------------------------------------------------------------


def run_tutorial(mx):
    shape = (2, 3)
    rec = {}
    calls = []
    kv = mx.kv.create("local")
    kv.init(3, mx.nd.ones(shape) * 2)
    a = mx.nd.zeros(shape)
    kv.pull(3, out=a)
    rec["init_pull"] = f32list(a.asnumpy())
    kv.push(3, mx.nd.ones(shape) * 8)
    kv.pull(3, out=a)
    rec["push8_pull"] = f32list(a.asnumpy())
    devices = [mx.cpu(i) for i in range(4)]
    b = [mx.nd.ones(shape, d) for d in devices]
    kv.push(3, b)
    kv.pull(3, out=a)
    rec["push4dev_pull"] = f32list(a.asnumpy())

    def update(key, inp, stored):
        calls.append(key if isinstance(key, int) else repr(key))
        stored += inp * 2

    kv._set_updater(update)
    kv.pull(3, out=a)
    rec["set_updater_pull"] = f32list(a.asnumpy())
    kv.push(3, mx.nd.ones(shape))
    kv.pull(3, out=a)
    rec["push1_updater_pull"] = f32list(a.asnumpy())
    b = [mx.nd.ones(shape, d) for d in devices]
    kv.pull(3, out=b)
    rec["pull_4dev_b1"] = f32list(b[1].asnumpy())
    keys = [5, 7, 9]
    kv.init(keys, [mx.nd.ones(shape)] * len(keys))
    kv.push(keys, [mx.nd.ones(shape)] * len(keys))
    b = [mx.nd.zeros(shape)] * len(keys)
    kv.pull(keys, out=b)
    rec["multikey_push_pull_b1"] = f32list(b[1].asnumpy())
    b = [[mx.nd.ones(shape, d) for d in devices]] * len(keys)
    kv.push(keys, b)
    c = [[mx.nd.zeros(shape, d) for d in devices]] * len(keys)
    kv.pull(keys, out=c)
    rec["multikey_4dev_c11"] = f32list(c[1][1].asnumpy())
    mx.nd.waitall()
    rec["updater_calls"] = calls
    rec["scalar_sequence"] = [
        rec[k][0][0]
        for k in (
            "init_pull",
            "push8_pull",
            "push4dev_pull",
            "set_updater_pull",
            "push1_updater_pull",
            "pull_4dev_b1",
            "multikey_push_pull_b1",
            "multikey_4dev_c11",
        )
    ]
    return rec


# --------------------------------------------------------------------------------------------
# quirks (each run in its own subprocess)
# --------------------------------------------------------------------------------------------


def _p_create_nonsense(mx):
    kv = mx.kv.create("nonsense")
    r = f"no error; returned {type(kv).__module__}.{type(kv).__name__} with .type={kv.type!r}"
    kv.init(0, mx.nd.ones((2,)))
    kv.push(0, [mx.nd.ones((2,), ctx=mx.cpu(i)) for i in range(2)])
    o = mx.nd.zeros((2,))
    kv.pull(0, out=o)
    r += f"; behaves like 'local': init 1, push ones on 2 devices, pull -> {o.asnumpy().tolist()}"
    try:
        kv.set_gradient_compression({"type": "2bit"})
        r += "; set_gradient_compression accepted"
    except Exception as e:
        r += f"; set_gradient_compression -> {_last_line(str(e))}"
    return r


def _p_push_diff_shape(mx):
    res = []
    for shp in ((3, 2), (6,), (4,), (2, 4)):
        kv = mx.kv.create("local")
        kv.init(0, mx.nd.ones((2, 3)))
        step = "push"
        try:
            kv.push(0, mx.nd.arange(int(np.prod(shp))).reshape(shp))
            step = "pull (push itself returned normally; the engine error surfaces here)"
            o = mx.nd.zeros((2, 3))
            kv.pull(0, out=o)
            mx.nd.waitall()
            res.append(f"push {shp} -> ok, pull gives {o.asnumpy().tolist()}")
        except Exception as e:
            res.append(f"push {shp} -> error raised at {step}: {_last_line(str(e))}")
    return "; ".join(res)


def _p_push_diff_shape_with_optimizer(mx):
    kv = mx.kv.create("local")
    kv.set_optimizer(mx.optimizer.create("sgd", learning_rate=1.0))
    kv.init(0, mx.nd.ones((2, 3)))
    try:
        kv.push(0, mx.nd.ones((3, 2)))
        o = mx.nd.zeros((2, 3))
        kv.pull(0, out=o)
        return f"(sgd lr=1, init ones(2,3), push ones(3,2)) ok, pull gives {o.asnumpy().tolist()}"
    except Exception as e:
        return f"error: {_last_line(str(e))}"


def _p_updater_raises(mx):
    kv = mx.kv.create("local")
    kv.init(0, mx.nd.ones((2, 3)))

    def bad(key, inp, stored):
        stored += inp  # mutate first, then raise
        raise RuntimeError("boom")

    kv._set_updater(bad)
    msg = []
    try:
        kv.push(0, mx.nd.ones((2, 3)) * 10)
        msg.append("push returned normally")
    except Exception as e:
        msg.append(f"push raised {type(e).__name__}: {_last_line(str(e))}")
    try:
        o = mx.nd.zeros((2, 3))
        kv.pull(0, out=o)
        mx.nd.waitall()
        msg.append(
            f"pull gives {o.asnumpy().tolist()} (init 1, updater did stored+=10 then raised)"
        )
    except Exception as e:
        msg.append(f"pull raised {type(e).__name__}: {_last_line(str(e))}")
    return "; ".join(msg)


def _p_updater_raises_before_mutation(mx):
    kv = mx.kv.create("local")
    kv.init(0, mx.nd.ones((2, 3)))

    def bad(key, inp, stored):
        raise ValueError("boom-before")

    kv._set_updater(bad)
    msg = []
    try:
        kv.push(0, mx.nd.ones((2, 3)) * 10)
        msg.append("push returned normally")
    except Exception as e:
        msg.append(f"push raised {type(e).__name__}: {_last_line(str(e))}")
    try:
        o = mx.nd.zeros((2, 3))
        kv.pull(0, out=o)
        mx.nd.waitall()
        msg.append(f"pull gives {o.asnumpy().tolist()}")
    except Exception as e:
        msg.append(f"pull raised {type(e).__name__}: {_last_line(str(e))}")
    return "; ".join(msg)


def _p_alias_init(mx):
    kv = mx.kv.create("local")
    a = mx.nd.ones((2, 3))
    kv.init(0, a)
    a[:] = 5
    o = mx.nd.zeros((2, 3))
    kv.pull(0, out=o)
    return f"init(k, ones); a[:]=5; pull -> {o.asnumpy()[0, 0]} (1.0 means store copied)"


def _p_alias_init_numpy_source(mx):
    kv = mx.kv.create("local")
    src = np.ones((2, 3), dtype=F32)
    a = mx.nd.array(src)
    kv.init(0, a)
    src[:] = 5
    o = mx.nd.zeros((2, 3))
    kv.pull(0, out=o)
    r = [f"mx.nd.array(np_src); init; np_src[:]=5; pull -> {o.asnumpy()[0, 0]}"]
    try:
        kv.init(1, np.ones((2, 3), dtype=F32))
        r.append("init with a raw numpy array accepted")
    except Exception as e:
        r.append(f"init with a raw numpy array -> {type(e).__name__}: {_last_line(str(e))}")
    return "; ".join(r)


def _p_alias_push(mx):
    res = []
    kv = mx.kv.create("local")
    kv.init(0, mx.nd.zeros((2, 3)))
    a = mx.nd.ones((2, 3)) * 3
    kv.push(0, a)
    a[:] = 5
    o = mx.nd.zeros((2, 3))
    kv.pull(0, out=o)
    res.append(f"no updater: push(a=3); a[:]=5; pull -> {o.asnumpy()[0, 0]}")
    o[:] = 7
    o2 = mx.nd.zeros((2, 3))
    kv.pull(0, out=o2)
    res.append(f"mutating a pulled-into array then pulling again -> {o2.asnumpy()[0, 0]}")
    kv2 = mx.kv.create("local")
    kv2.set_optimizer(mx.optimizer.create("sgd", learning_rate=1.0))
    kv2.init(0, mx.nd.zeros((2, 3)))
    a = mx.nd.ones((2, 3)) * 3
    kv2.push(0, a)
    a[:] = 5
    kv2.pull(0, out=o)
    res.append(f"sgd lr=1: push(g=3); g[:]=5; pull -> {o.asnumpy()[0, 0]} (-3 means copied)")
    return "; ".join(res)


def _p_alias_push_multi_device(mx):
    kv = mx.kv.create("local")
    kv.init(0, mx.nd.zeros((2,)))
    a = [mx.nd.ones((2,), ctx=mx.cpu(i)) * 3 for i in range(2)]
    kv.push(0, a)
    for x in a:
        x[:] = 5
    o = mx.nd.zeros((2,))
    kv.pull(0, out=o)
    r = f"no updater, 2 devices: push [3,3]; mutate both to 5; pull -> {o.asnumpy().tolist()}"
    kv.push(0, [mx.nd.ones((2,), ctx=mx.cpu(i)) for i in range(2)])
    kv.pull(0, out=o)
    r += f"; push [1,1] again -> {o.asnumpy().tolist()}"
    return r


def _p_signum_mom0_with_wd_lh(mx):
    kv = mx.kv.create("local")
    kv.set_optimizer(mx.optimizer.create("signum", learning_rate=0.1, momentum=0.0, wd_lh=0.2))
    kv.init(0, mx.nd.ones((2,)))
    kv.push(0, mx.nd.ones((2,)))
    o = mx.nd.zeros((2,))
    kv.pull(0, out=o)
    return (
        f"signum(momentum=0, wd_lh=0.2, lr=0.1): init 1, push 1, pull -> {o.asnumpy().tolist()}"
        " (signsgd_update rejects wd_lh; the updater error is swallowed)"
    )


def _p_str_key_updater_type(mx):
    seen = []

    def upd(key, inp, stored):
        seen.append(f"{type(key).__name__}:{key!r}")
        stored += inp

    kv = mx.kv.create("local")
    kv._set_updater(upd)
    kv.init("w", mx.nd.ones((2,)))
    kv.push("w", mx.nd.ones((2,)))
    kv2 = mx.kv.create("local")
    kv2._set_updater(upd)
    kv2.init(3, mx.nd.ones((2,)))
    kv2.push(3, mx.nd.ones((2,)))
    mx.nd.waitall()
    # mx.optimizer.Updater converts bytes keys back to str for its state dict
    kv3 = mx.kv.create("local")
    opt = mx.optimizer.create("sgd", learning_rate=0.1, momentum=0.9)
    kv3.set_optimizer(opt)
    kv3.init("w", mx.nd.ones((2,)))
    kv3.push("w", mx.nd.ones((2,)))
    mx.nd.waitall()
    st = list(kv3._updater.states.keys())
    return (
        f"custom updater receives: {seen}; mx.optimizer.Updater state keys after str-key push: "
        f"{st!r}; optimizer._index_update_count: {opt._index_update_count!r}"
    )


def _p_mix_int_str_keys(mx):
    res = []
    kv = mx.kv.create("local")
    kv.init(0, mx.nd.ones((2,)))
    try:
        kv.init("a", mx.nd.ones((2,)))
        res.append("int then str init: ok")
    except Exception as e:
        res.append(f"int then str init: {type(e).__name__}: {_last_line(str(e))}")
    kv = mx.kv.create("local")
    kv.init("a", mx.nd.ones((2,)))
    try:
        kv.init(0, mx.nd.ones((2,)))
        res.append("str then int init: ok")
    except Exception as e:
        res.append(f"str then int init: {type(e).__name__}: {_last_line(str(e))}")
    kv = mx.kv.create("local")
    try:
        kv.init(["a", 1], [mx.nd.ones((2,)), mx.nd.ones((2,))])
        res.append("mixed list in one init call: ok")
    except Exception as e:
        res.append(f"mixed list in one init call: {type(e).__name__}: {_last_line(str(e))}")
    kv = mx.kv.create("local")
    kv.init("3", mx.nd.ones((2,)) * 4)
    try:
        o = mx.nd.zeros((2,))
        kv.pull("3", out=o)
        res.append(f"str '3' then pull '3' -> {o.asnumpy().tolist()}")
    except Exception as e:
        res.append(f"pull '3': {type(e).__name__}: {_last_line(str(e))}")
    return "; ".join(res)


def _p_init_existing_key(mx):
    kv = mx.kv.create("local")
    kv.init(0, mx.nd.ones((2,)))
    try:
        kv.init(0, mx.nd.ones((2,)) * 9)
        o = mx.nd.zeros((2,))
        kv.pull(0, out=o)
        return f"second init accepted; pull -> {o.asnumpy().tolist()}"
    except Exception as e:
        return f"{type(e).__name__}: {_last_line(str(e))}"


def _p_init_existing_str_key(mx):
    kv = mx.kv.create("local")
    kv.init("w", mx.nd.ones((2,)))
    try:
        kv.init("w", mx.nd.ones((2,)) * 9)
        o = mx.nd.zeros((2,))
        kv.pull("w", out=o)
        return f"second init accepted; pull -> {o.asnumpy().tolist()}"
    except Exception as e:
        return f"{type(e).__name__}: {_last_line(str(e))}"


def _p_pull_unknown_key(mx):
    kv = mx.kv.create("local")
    kv.init(0, mx.nd.ones((2,)))
    o = mx.nd.ones((2,)) * 7
    try:
        kv.pull(5, out=o)
        mx.nd.waitall()
        return f"no error; out -> {o.asnumpy().tolist()}"
    except Exception as e:
        return f"{type(e).__name__}: {_last_line(str(e))}"


def _p_pull_unknown_str_key(mx):
    kv = mx.kv.create("local")
    kv.init("a", mx.nd.ones((2,)))
    o = mx.nd.ones((2,)) * 7
    try:
        kv.pull("zz", out=o)
        mx.nd.waitall()
        return f"no error; out -> {o.asnumpy().tolist()}"
    except Exception as e:
        return f"{type(e).__name__}: {_last_line(str(e))}"


def _p_push_unknown_key(mx):
    kv = mx.kv.create("local")
    kv.init(0, mx.nd.ones((2,)))
    try:
        kv.push(5, mx.nd.ones((2,)))
        mx.nd.waitall()
        return "no error"
    except Exception as e:
        return f"{type(e).__name__}: {_last_line(str(e))}"


def _p_create_types(mx):
    res = []
    for name in (
        "local",
        "LOCAL",
        "device",
        "local_allreduce_cpu",
        "local_allreduce_device",
        "local_update_cpu",
        "nccl",
        "dist_sync",
        "horovod",
        "teststore",
    ):
        try:
            kv = mx.kv.create(name)
            res.append(f"{name}: ok type={kv.type!r} cls={type(kv).__name__}")
        except Exception as e:
            res.append(f"{name}: {type(e).__name__}: {_last_line(str(e))}")
    return "; ".join(res)


def _p_updater_after_multi_device_push(mx):
    kv = mx.kv.create("local")
    kv.init(3, mx.nd.zeros((2, 3)))
    kv.push(3, [mx.nd.ones((2, 3), ctx=mx.cpu(i)) for i in range(3)])

    def update(key, merged, stored):
        stored += 2 * merged

    kv._set_updater(update)
    kv.push(3, [mx.nd.ones((2, 3), ctx=mx.cpu(i)) * 10 for i in range(3)])
    o = mx.nd.zeros((2, 3))
    kv.pull(3, out=o)
    return (
        "init 0, push ones from 3 devices (no updater), set stored += 2 * merged, push 10s "
        f"from 3 devices -> {float(o.asnumpy()[0, 0])}"
    )


def _p_empty_calls(mx):
    kv = mx.kv.create("local")
    done = []
    for name, call in (
        ("init", lambda: kv.init([], [])),
        ("push", lambda: kv.push([], [])),
        ("pull", lambda: kv.pull([], out=[])),
        ("pushpull", lambda: kv.pushpull([], [], out=[])),
    ):
        call()
        done.append(name)
    return f"empty lists of keys accepted, nothing happens: {', '.join(done)}"


def _p_float_row_ids(mx):
    kv = mx.kv.create("local")
    kv.init(0, mx.nd.array(np.arange(8.0).reshape(4, 2)).tostype("row_sparse"))
    out = mx.nd.sparse.zeros("row_sparse", (4, 2))
    ids = mx.nd.array([1, 3])
    kv.row_sparse_pull(0, out=out, row_ids=ids)
    return f"row_ids of dtype {np.dtype(ids.dtype).name} -> {out.asnumpy().tolist()}"


def _p_updater_no_optimizer_push_assign(mx):
    kv = mx.kv.create("local")
    kv.init(0, mx.nd.ones((2,)))
    kv.push(0, [mx.nd.ones((2,), ctx=mx.cpu(i)) * (i + 2) for i in range(3)])
    o = mx.nd.zeros((2,))
    kv.pull(0, out=o)
    kv.push(0, mx.nd.ones((2,)) * 0.5)
    o2 = mx.nd.zeros((2,))
    kv.pull(0, out=o2)
    return (
        f"no updater: push [2,3,4] on 3 devices -> {o.asnumpy().tolist()} (sum, replaces); "
        f"then push 0.5 -> {o2.asnumpy().tolist()}"
    )


def _p_set_optimizer_after_init_and_twice(mx):
    res = []
    kv = mx.kv.create("local")
    kv.init(0, mx.nd.ones((2,)))
    kv.set_optimizer(mx.optimizer.create("sgd", learning_rate=0.1, momentum=0.9))
    kv.push(0, mx.nd.ones((2,)))
    kv.push(0, mx.nd.ones((2,)))
    kv.set_optimizer(mx.optimizer.create("sgd", learning_rate=0.1, momentum=0.9))
    kv.push(0, mx.nd.ones((2,)))
    o = mx.nd.zeros((2,))
    kv.pull(0, out=o)
    res.append(
        "init 1, sgd(lr .1, mom .9) set after init, 2 pushes of 1, then set_optimizer again "
        f"(fresh) and 1 push -> {o.asnumpy().tolist()} "
        "(0.61 = momentum state reset by the second set_optimizer; 0.439 would mean kept)"
    )
    return "; ".join(res)


PROBES = {
    "create_nonsense": _p_create_nonsense,
    "create_types": _p_create_types,
    "push_different_shape": _p_push_diff_shape,
    "push_different_shape_with_optimizer": _p_push_diff_shape_with_optimizer,
    "updater_raises_after_mutating": _p_updater_raises,
    "updater_raises_before_mutating": _p_updater_raises_before_mutation,
    "aliasing_init": _p_alias_init,
    "aliasing_init_numpy_source": _p_alias_init_numpy_source,
    "aliasing_push": _p_alias_push,
    "aliasing_push_multi_device": _p_alias_push_multi_device,
    "signum_momentum0_with_wd_lh": _p_signum_mom0_with_wd_lh,
    "str_key_updater_type": _p_str_key_updater_type,
    "mix_int_str_keys": _p_mix_int_str_keys,
    "init_existing_key": _p_init_existing_key,
    "init_existing_str_key": _p_init_existing_str_key,
    "pull_unknown_key": _p_pull_unknown_key,
    "pull_unknown_str_key": _p_pull_unknown_str_key,
    "push_unknown_key": _p_push_unknown_key,
    "push_no_updater_assigns_sum": _p_updater_no_optimizer_push_assign,
    "set_optimizer_after_init_and_twice": _p_set_optimizer_after_init_and_twice,
    "updater_after_multi_device_push": _p_updater_after_multi_device_push,
    "empty_calls": _p_empty_calls,
    "float_row_ids": _p_float_row_ids,
}


def run_probe_child(name):
    import mxnet as mx

    try:
        result = "ok: " + PROBES[name](mx)
    except Exception as e:
        result = f"raised {type(e).__name__}: {_last_line(str(e))}"
    sys.stdout.write("\n@@PROBE@@" + json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (mxnet engine shutdown can be noisy)


def run_probes():
    quirks = {}
    for name in PROBES:
        cmd = [sys.executable, os.path.abspath(__file__), "--probe", name]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            quirks[name] = f"hang (no result within {PROBE_TIMEOUT_S} s)"
            continue
        marker = [ln for ln in p.stdout.splitlines() if ln.startswith("@@PROBE@@")]
        if marker:
            quirks[name] = json.loads(marker[-1][len("@@PROBE@@") :])
            if "Exception ignored on calling ctypes callback" in p.stderr:
                quirks[name] += (
                    " [the Python exception was swallowed: ctypes printed 'Exception "
                    "ignored on calling ctypes callback function' + traceback to "
                    "stderr: " + _last_line(p.stderr) + "]"
                )
        else:
            tail = _last_line(p.stderr) or _last_line(p.stdout)
            quirks[name] = f"crash (exit code {p.returncode}): {tail}"
        print(f"  probe {name}: {quirks[name][:160]}", file=sys.stderr)
    return quirks


# --------------------------------------------------------------------------------------------


def main():
    import mxnet as mx

    np.random.seed(0)
    mx.random.seed(0)
    ref = {"mxnet_version": mx.__version__}
    ref["registry"] = sorted(mx.optimizer.Optimizer.opt_registry.keys())
    ref["optimizers"] = [run_optimizer_case(mx, i, c) for i, c in enumerate(OPT_CASES)]
    ref["lr_schedulers"] = run_scheduler_cases(mx)
    ref["compression"], ref["compression_notes"] = run_compression(mx)
    ref["tutorial"] = run_tutorial(mx)
    print("running quirk probes ...", file=sys.stderr)
    ref["quirks"] = run_probes()
    with open(OUT_PATH, "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    print(f"wrote {OUT_PATH}", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--probe":
        run_probe_child(sys.argv[2])
    else:
        main()
