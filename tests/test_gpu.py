"""The GPU path with real CuPy arrays; skipped on machines without a CUDA GPU."""

from __future__ import annotations

import numpy as np
import pytest

import labkv
from tests._reference import f32, reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(labkv.num_gpus() == 0, reason="needs CuPy and a CUDA GPU"),
]


def gpus(n):
    return [labkv.gpu(i % labkv.num_gpus()) for i in range(n)]


@pytest.mark.parametrize("kind", ["local", "device"])
def test_cupy_values_are_summed_and_pulled_onto_every_gpu(kind):
    import cupy

    kv = labkv.create(kind)
    kv.init(0, labkv.zeros((3, 4), device=labkv.gpu(0)))
    values = [labkv.full((3, 4), i + 1.0, device=d) for i, d in enumerate(gpus(4))]
    kv.push(0, values)
    home = kv.home_device(0)
    assert home.kind == ("gpu" if kind == "device" else "cpu")
    outs = [labkv.zeros((3, 4), device=d) for d in gpus(4)]
    kv.pull(0, out=outs)
    for out, device in zip(outs, gpus(4)):
        assert isinstance(out, cupy.ndarray) and labkv.device_of(out) == device
        np.testing.assert_array_equal(out.get(), np.full((3, 4), 10.0))
    host = np.zeros((3, 4), np.float32)
    kv.pull(0, out=host)  # a numpy out receives a host copy
    np.testing.assert_array_equal(host, 10.0)


def test_home_gpus_balance_bytes():
    kv = labkv.create("device")
    devices = gpus(2)
    kv.init(
        [0, 1, 2],
        [
            labkv.zeros(1000, device=devices[0]),
            labkv.zeros(10, device=devices[0]),
            labkv.zeros(10, device=devices[0]),
        ],
    )
    for key in (0, 1, 2):
        kv.push(key, [labkv.ones(kv.pull(key).shape, device=d) for d in devices])
    homes = [kv.home_device(k) for k in (0, 1, 2)]
    if labkv.num_gpus() >= 2:
        assert homes == [labkv.gpu(0), labkv.gpu(1), labkv.gpu(1)]
    assert all(h.kind == "gpu" for h in homes)


def test_compression_on_gpu_is_bit_exact_with_mxnet():
    case = reference()["compression"][0]
    kv = labkv.create("device")
    kv.set_gradient_compression(case["compression_params"])
    kv.init(0, labkv.to_device(f32(case["weight0"]), labkv.gpu(0)))
    devices = gpus(case["num_devices"])
    for push, expected in zip(case["pushes"], case["pulled"], strict=True):
        kv.push(0, [labkv.to_device(f32(g), d) for g, d in zip(push, devices)])
        np.testing.assert_array_equal(kv.pull(0).get(), f32(expected))


@pytest.mark.parametrize("name", ["sgd", "nag", "adam", "adagrad", "rmsprop", "adadelta", "signum"])
def test_optimizers_on_gpu_match_the_cpu(name):
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal((4, 5)).astype(np.float32) for _ in range(4)]
    results = []
    for device in (labkv.cpu(0), labkv.gpu(0)):
        kv = labkv.create("device")
        kv.init("w", labkv.to_device(np.ones((4, 5), np.float32), device))
        kv.set_optimizer(name, momentum=0.9) if name in ("sgd", "nag") else kv.set_optimizer(name)
        for g in grads:
            kv.push("w", labkv.to_device(g, device))
        out = kv.pull("w")
        results.append(out.get() if hasattr(out, "get") else out)
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-6)
