"""The GPU path with CuPy arrays: on the strict CPU stand-in of CuPy (2 simulated GPUs,
always), and on real CUDA GPUs (marked ``gpu``; skipped on machines without one)."""

from __future__ import annotations

import numpy as np
import pytest

import labkv
from tests._reference import f32, reference
from tests._standin import standin_cupy

HAS_CUDA = labkv.num_gpus() > 0


@pytest.fixture(
    scope="module",
    autouse=True,
    params=[
        "standin",
        pytest.param(
            "cuda",
            marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")],
        ),
    ],
)
def backend(request):
    """Every test here runs once on the stand-in and once on CUDA (where there is one)."""
    if request.param == "cuda":
        yield "cuda"
        return
    with standin_cupy(physical=2):
        yield "standin"


@pytest.fixture
def gpu_handle(request, backend):
    """A cluster whose workers have GPUs: the stand-in cluster, or the session one."""
    return request.getfixturevalue("standin_handle" if backend == "standin" else "handle")


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


# -- the distributed store with its servers' values on the workers' GPUs ------------------
def _push_cupy_and_pull(kv, shape):
    import cupy

    grad = cupy.full(shape, kv.rank + 1.0, dtype=cupy.float32)
    out = cupy.empty(shape, dtype=cupy.float32)
    for _ in range(3):
        kv.push("w", grad)
        kv.pull("w", out=out)
    return type(out).__module__.split(".")[0], out.get()


@pytest.mark.parametrize("shape", [(4, 5), (1000, 1001)])  # one server; sliced over two
def test_gpu_servers_sum_cupy_pushes_of_two_ranks(gpu_handle, shape):
    from labkv.cluster import run

    kv = labkv.create("dist_sync", cluster=gpu_handle, num_servers=2, server_device="gpu")
    try:
        kv.init("w", np.zeros(shape, np.float32))
        pieces = kv.placement()["w"]
        assert all(p["device"].startswith("gpu(") for p in pieces)
        assert len(pieces) == (2 if shape[0] * shape[1] >= 1_000_000 else 1)
        results = run(_push_cupy_and_pull, num_workers=2, kvstore=kv, args=(shape,))
        for module, value in results:
            assert module == "cupy"
            np.testing.assert_array_equal(value, np.full(shape, 3.0))  # ASSIGN: the last sum
        np.testing.assert_array_equal(kv.peek("w"), np.full(shape, 3.0))  # a host copy
        assert isinstance(kv.pull("w"), np.ndarray)
    finally:
        kv.close()


def _sgd_steps(kv):
    import cupy

    for _ in range(2):
        kv.push("w", cupy.ones((3, 4), dtype=cupy.float32))
    return kv.pull("w")


def test_gpu_servers_run_the_optimizer_and_save_states_like_host_servers(gpu_handle, tmp_path):
    from labkv.cluster import run

    pulled, files = {}, {}
    for device in ("cpu", "gpu"):
        kv = labkv.create("dist_sync", cluster=gpu_handle, num_servers=1, server_device=device)
        try:
            kv.init("w", np.zeros((3, 4), np.float32))
            kv.set_optimizer("sgd", learning_rate=0.5, momentum=0.9)
            pulled[device] = run(_sgd_steps, num_workers=2, kvstore=kv)[0]
            files[device] = tmp_path / f"{device}.states"
            kv.save_optimizer_states(str(files[device]))
        finally:
            kv.close()
    np.testing.assert_allclose(pulled["gpu"], pulled["cpu"], rtol=1e-6)
    # momentum SGD on the sum of 2 ranks' ones: -1, then -1 + (0.9 * -1 - 1)
    assert pulled["cpu"][0, 0] == pytest.approx(-2.9)
    # The GPU servers' states load into a local store and give its next step.
    local = labkv.create("local")
    local.init("w", pulled["gpu"].copy())
    local.set_optimizer("sgd", learning_rate=0.5, momentum=0.9)
    local.load_optimizer_states(str(files["gpu"]))
    reference = labkv.create("local")
    reference.init("w", pulled["cpu"].copy())
    reference.set_optimizer("sgd", learning_rate=0.5, momentum=0.9)
    reference.load_optimizer_states(str(files["cpu"]))
    for kv in (local, reference):
        kv.push("w", np.ones((3, 4), np.float32))
    np.testing.assert_allclose(local.pull("w"), reference.pull("w"), rtol=1e-6)


@pytest.mark.parametrize("how", ["optimizer", "updater"])
def test_a_key_on_the_second_gpu_is_updated_there(how):
    if labkv.num_gpus() < 2:
        pytest.skip("needs two GPUs")
    # CuPy makes new arrays on the *current* GPU (device 0 here): the merge buffer,
    # the optimizer state, the updater's copy and their temporaries must follow the key.
    import cupy

    from labkv.shard import Shard

    with cupy.cuda.Device(1):
        weight = cupy.ones((3, 4), dtype=cupy.float32)
        grads = [cupy.full((3, 4), 2.0, dtype=cupy.float32) for _ in range(2)]
    shard = Shard()
    shard.init("w", weight)
    if how == "optimizer":
        shard.set_optimizer(labkv.optimizers.SGD(learning_rate=0.1, momentum=0.9))
    else:
        shard.set_updater(lambda key, merged, stored: stored.__iadd__(merged * 2))
    for _ in range(2):
        shard.apply([("w", grads)])
    value = shard.read("w")
    assert value.device.id == 1
    assert all(a.device.id == 1 for a in shard.states.get("w", ()))
    expected = 1 - 0.4 - (0.9 * 0.4 + 0.4) if how == "optimizer" else 1 + 2 * 4 * 2
    np.testing.assert_allclose(value.get(), np.full((3, 4), expected), rtol=1e-6)


# -- host -> GPU copies: exact shapes, strided destinations --------------------------------
def test_a_scalar_key_on_a_gpu_takes_host_pushes():
    kv = labkv.create("device")
    kv.init("s", labkv.to_device(np.array(1.0, np.float32), labkv.gpu(0)))
    kv.push("s", np.array(2.5, np.float32))
    assert kv.home_device("s") == labkv.gpu(0)
    assert kv.pull("s").shape == () and float(kv.pull("s")) == 2.5


def test_a_pull_into_a_strided_gpu_out_fills_it():
    import cupy

    kv = labkv.create("local")
    kv.init("w", np.arange(12, dtype=np.float32).reshape(3, 4))
    with cupy.cuda.Device(labkv.num_gpus() - 1):
        base = cupy.zeros((3, 8), dtype=cupy.float32)
    out = base[:, ::2]
    kv.pull("w", out=out)
    expected = np.zeros((3, 8), np.float32)
    expected[:, ::2] = np.arange(12).reshape(3, 4)
    np.testing.assert_array_equal(base.get(), expected)


def _push_scalar(kv):
    kv.push("s", np.array(kv.rank + 1.0, np.float32))
    return kv.pull("s")


def test_gpu_servers_hold_scalar_keys(gpu_handle):
    from labkv.cluster import run

    kv = labkv.create("dist_sync", cluster=gpu_handle, num_servers=1, server_device="gpu")
    try:
        kv.init("s", np.array(0.0, np.float32))
        results = run(_push_scalar, num_workers=2, kvstore=kv)
        assert [float(r) for r in results] == [3.0, 3.0]
        assert kv.pull("s").shape == ()
    finally:
        kv.close()


# -- event summaries run where the values live -------------------------------------------
def test_a_value_on_the_last_gpu_is_summarized_there():
    host = np.array([[3.0, -4.0], [0.5, 2.0]], np.float32)
    value = labkv.to_device(host, labkv.gpu(labkv.num_gpus() - 1))
    assert labkv.events.summarize(value) == labkv.events.summarize(host)


def test_events_of_a_key_pushed_from_two_gpus_are_summarized(backend):
    import threading

    last = labkv.gpu(labkv.num_gpus() - 1)
    kv = labkv.create("device")
    kv.init("w", labkv.to_device(np.zeros(4, np.float32), last))
    kv.set_optimizer("sgd", learning_rate=1.0)
    seen = []
    kv.events.subscribe(seen.append, detail_interval=60)
    values = [labkv.full(4, 1.0, device=d) for d in (last, labkv.gpu(0))]
    for _ in range(3):
        kv.push("w", values)  # the 2nd and 3rd are only tallied
    # a monitor flushes the tallies from its own thread, where gpu(0) is current
    flusher = threading.Thread(target=kv.events.flush)
    flusher.start()
    flusher.join()
    push = next(e for e in seen if e.op == "push")
    assert push.summary["mean"] == 2.0 and push.extra["per_device"][0]["norm"] == 2.0
    step = next(e for e in seen if e.op == "optimizer")
    assert (step.before["mean"], step.after["mean"]) == (0.0, -2.0)
    tally = [e for e in seen if e.tally]
    assert tally and all(e.summary["mean"] == -6.0 for e in tally)


# -- a key moved to its home GPU takes its optimizer states along -------------------------
@pytest.mark.parametrize("states_from", ["a host push", "a state file"])
def test_optimizer_states_follow_a_key_to_its_home_gpu(states_from, tmp_path):
    grad = np.full((3, 4), 0.5, np.float32)
    stores = {kind: labkv.create(kind) for kind in ("device", "local")}
    for kv in stores.values():
        kv.init("w", np.ones((3, 4), np.float32))  # from the host: the key starts there
        kv.set_optimizer("adam", learning_rate=0.1)
    if states_from == "a host push":
        for kv in stores.values():
            kv.push("w", grad)
    else:
        trained = labkv.create("local")
        trained.init("w", np.ones((3, 4), np.float32))
        trained.set_optimizer("adam", learning_rate=0.1)
        trained.push("w", grad)
        trained.save_optimizer_states(str(tmp_path / "adam.states"))
        for kv in stores.values():
            kv.load_optimizer_states(str(tmp_path / "adam.states"))
    for _ in range(2):
        stores["device"].push("w", [labkv.to_device(grad / 2, d) for d in gpus(2)])
        stores["local"].push("w", [grad / 2, grad / 2])
    home = stores["device"].home_device("w")
    assert home.kind == "gpu"
    states = stores["device"]._shard.states["w"]
    assert [labkv.device_of(s) for s in states] == [home, home]
    np.testing.assert_allclose(
        stores["device"].pull("w").get(), stores["local"].pull("w"), rtol=1e-6
    )


# -- the compression's wire helpers on GPU arrays -----------------------------------------
def test_packing_and_unpacking_stay_on_the_values_gpu():
    from labkv.compression import pack_1bit, pack_2bit, unpack_1bit, unpack_2bit

    rng = np.random.default_rng(0)
    last = labkv.gpu(labkv.num_gpus() - 1)
    two = rng.choice(np.float32([-0.5, 0.0, 0.5]), size=37)
    one = rng.choice(np.float32([-1.0, 1.0]), size=37)
    cases = [
        (two, lambda a: pack_2bit(a, 0.5), lambda p: unpack_2bit(p, 0.5, two.size)),
        (one, pack_1bit, lambda p: unpack_1bit(p, one.size)),
    ]
    for host, pack, unpack in cases:
        packed = pack(labkv.to_device(host, last))
        assert labkv.device_of(packed) == last
        np.testing.assert_array_equal(packed.get(), pack(host))
        back = unpack(packed)
        assert labkv.device_of(back) == last and back.dtype == np.float32
        np.testing.assert_array_equal(back.get(), host)


# -- float16 ------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["cpu", "gpu"])
def test_float16_summaries_do_not_overflow(where):
    host = np.full(16, 300.0, np.float16)  # squares add up to 1.44e6 > float16's 65504
    value = host if where == "cpu" else labkv.to_device(host, labkv.gpu(0))
    summary = labkv.events.summarize(value)
    assert summary["norm"] == pytest.approx(1200.0)
    assert (summary["min"], summary["max"], summary["mean"]) == (300.0, 300.0, 300.0)


@pytest.mark.parametrize("where", ["cpu", "gpu"])
@pytest.mark.parametrize("name", ["adam", "rmsprop"])
def test_float16_steps_keep_their_epsilon(where, name):
    device = labkv.cpu(0) if where == "cpu" else labkv.gpu(0)
    grads = [np.array([0.0, 0.5, -0.25, 0.0], dtype) for dtype in (np.float16, np.float32)]
    pulled = []
    for grad in grads:  # a zero gradient makes 0 / (sqrt(0) + epsilon)
        kv = labkv.create("device")
        kv.init("w", labkv.to_device(np.ones(4, grad.dtype), device))
        kv.set_optimizer(name, learning_rate=0.01)
        for _ in range(3):
            kv.push("w", labkv.to_device(grad, device))
        out = kv.pull("w")
        pulled.append(out.get() if hasattr(out, "get") else out)
    assert pulled[0].dtype == np.float16 and np.isfinite(pulled[0]).all()
    np.testing.assert_allclose(pulled[0], pulled[1], rtol=2e-3)


# -- which physical GPU a server uses ------------------------------------------------------
def _gpu_ids():
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    return [cupy.cuda.Device(i).pci_bus_id for i in range(count)]


@pytest.mark.parametrize("option", ["gpu", "auto"])
def test_servers_on_two_workers_use_two_physical_gpus(gpu_handle, option):
    import re

    if labkv.num_gpus() < 2:
        pytest.skip("needs two GPUs")
    ids = gpu_handle.client.run(_gpu_ids)  # per worker: the PCI bus id of each ordinal
    kv = labkv.create("dist_sync", cluster=gpu_handle, num_servers=2, server_device=option)
    try:
        kv.init("w", np.zeros(1_000_000, np.float32))  # sliced: one slice per server
        pieces = kv.placement()["w"]
        assert len({p["device"].split("@")[1] for p in pieces}) == 2  # one server per worker
        names = [p["device"].split("@") for p in pieces]
        ordinals = [int(re.match(r"gpu\((\d+)\)", name).group(1)) for name, _ in names]
        used = [ids[worker][i] for (_, worker), i in zip(names, ordinals)]
        assert len(set(used)) == 2, f"both servers on one GPU: {pieces}"
        # the placement names the physical GPU each server really uses
        assert [n for n, _ in names] == [f"gpu({i}) pci:{u}" for i, u in zip(ordinals, used)]
        # so does the server load that the monitor's server table shows
        loads = {load["server"]: load["device"] for load in kv.server_load()}
        assert [loads[p["server"]] for p in pieces] == [n for n, _ in names]
    finally:
        kv.close()


def _push_from_two_gpus(kv):
    import cupy

    values = [labkv.full((3, 4), kv.rank + 1.0, device=d) for d in gpus(2)]
    outs = [labkv.zeros((3, 4), device=d) for d in gpus(2)]
    kv.push("w", values)
    kv.pull("w", out=outs)
    assert all(isinstance(o, cupy.ndarray) for o in outs)
    return [(labkv.device_of(o).id, o.get()) for o in outs]


def test_dist_device_sync_sums_each_ranks_gpus_and_pulls_onto_each(gpu_handle):
    from labkv.cluster import run

    kv = labkv.create("dist_device_sync", cluster=gpu_handle, num_servers=1, server_device="gpu")
    try:
        kv.init("w", np.zeros((3, 4), np.float32))
        for pulled in run(_push_from_two_gpus, num_workers=2, kvstore=kv):
            assert [device for device, _ in pulled] == [d.id for d in gpus(2)]
            for _, value in pulled:  # ranks 1 and 2, each from two GPUs
                np.testing.assert_array_equal(value, np.full((3, 4), 6.0))
    finally:
        kv.close()


# -- a GPU server's event loop ------------------------------------------------------------
def _standin_stats():
    import cupy

    return {"to_host": cupy.stats["to_host"], "kernels": dict(cupy.stats["kernels"])}


def test_a_gpu_server_packs_small_values_on_its_gpu_with_one_copy(gpu_handle, backend):
    client = gpu_handle.client
    kv = labkv.create("dist_sync", cluster=gpu_handle, num_servers=1, server_device="gpu")
    try:
        keys = list(range(40))
        dtypes = [np.float32, np.float16, np.int32, np.float64]
        values = [np.full(3 if k % 5 else (), k, dtypes[k % 4]) for k in keys]
        kv.init(keys, values)
        worker = kv.placement()[0][0]["device"].split("@")[1]
        if backend == "standin":  # the stand-in counts its device-to-host copies
            before = client.run(_standin_stats, workers=[worker])[worker]
        pulled = kv.pull(keys)
        if backend == "standin":
            after = client.run(_standin_stats, workers=[worker])[worker]
            assert after["to_host"] - before["to_host"] == 1  # one copy for 40 keys, not 40
        for value, expected in zip(pulled, values):
            assert (value.dtype, value.shape) == (expected.dtype, expected.shape)
            np.testing.assert_array_equal(value, expected)
    finally:
        kv.close()


def test_a_gpu_server_runs_its_kernels_once_on_its_gpu_when_it_starts(standin_handle):
    client = standin_handle.client
    before = client.run(_standin_stats)
    kv = labkv.create("dist_sync", cluster=standin_handle, num_servers=1, server_device="gpu(1)")
    try:
        after = client.run(_standin_stats)  # the server has started; no key exists yet
        kv.init("w", np.zeros(2, np.float32))
        address = kv.placement()["w"][0]["device"].split("@")[1]
        warmed = after[address]["kernels"].get(1, 0) - before[address]["kernels"].get(1, 0)
        assert warmed > 0  # kernels ran on gpu(1), the server's, before its first push
    finally:
        kv.close()


# -- compressed pushes of CuPy values travel packed to GPU servers --------------------------
def _push_compressed(kv):
    import cupy

    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})  # each rank's own, as in MXNet
    grad = cupy.full(1000, 0.6 * (kv.rank + 1), dtype=cupy.float32)  # both send +0.5
    out = cupy.empty(1000, dtype=cupy.float32)
    kv.push("w", grad)
    kv.pull("w", out=out)
    return out.get()


def test_compressed_cupy_pushes_travel_packed_to_gpu_servers(gpu_handle):
    from labkv.cluster import run

    kv = labkv.create("dist_sync", cluster=gpu_handle, num_servers=1, server_device="gpu")
    try:
        kv.init("w", np.zeros(1000, np.float32))
        before = sum(load["bytes_in"] for load in kv.server_load())
        for pulled in run(_push_compressed, num_workers=2, kvstore=kv):
            np.testing.assert_array_equal(pulled, np.full(1000, 1.0))
        after = sum(load["bytes_in"] for load in kv.server_load())
        assert after - before == 2 * 1000 // 4  # 2 bits a value from each rank
    finally:
        kv.close()


# -- replicated GPU servers: a backup keeps each entry's value on its own GPU ------------
def _replica_values(topic, key, dask_worker=None):
    """Each server of the store ``topic`` on this worker: (is primary, the key's
    value on the host, its merge buffer's device or None, its value's device)."""
    from labkv.cluster._device import host_copy
    from labkv.devices import device_of

    return [
        (
            a.primary,
            host_copy(a.shard.read(key)),
            str(device_of(a.shard._merge_buffers[key])) if key in a.shard._merge_buffers else None,
            str(device_of(a.shard.read(key))),
        )
        for a in dask_worker.state.actors.values()
        if getattr(a, "topic", None) == topic and key in a.shard
    ]


@pytest.mark.parametrize("big", [False, True], ids=["small", "big"])
def test_a_gpu_backup_applies_its_primarys_updates_on_its_own_gpu(gpu_handle, big):
    from labkv.cluster._event_relay import topic_of

    size = (1 << 15) if big else 5  # a big entry value travels as its own frame
    kv = labkv.create(
        "dist_sync", cluster=gpu_handle, num_servers=1, replicas=2, server_device="gpu"
    )
    try:
        kv.init("w", np.zeros(size, np.float32))
        kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.5, momentum=0.9))
        for step in range(3):
            kv.push("w", np.full(size, step + 1.0, np.float32))
        expected = kv.pull("w")
        primary, backup = kv.placement()["w"][0]["replicas"]
        (mine,) = gpu_handle.client.run(_replica_values, topic_of(kv._id), "w", workers=[primary])[
            primary
        ]
        (theirs,) = gpu_handle.client.run(_replica_values, topic_of(kv._id), "w", workers=[backup])[
            backup
        ]
        assert mine[0] and not theirs[0]
        np.testing.assert_array_equal(theirs[1], mine[1])
        np.testing.assert_array_equal(mine[1], expected)
        assert theirs[3].startswith("gpu") and theirs[2] == theirs[3]  # kept on its own GPU
    finally:
        kv.close()
