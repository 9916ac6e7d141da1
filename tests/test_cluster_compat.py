"""A cluster labkv did not start, from other environments: a scheduler and
workers without labkv, with a numpy of another major version, or with another
labkv. Each fails within seconds naming the node and what differs;
``connect(address, upload=True)`` ships labkv there. Also: the attached
cluster is the default one."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import labkv
from labkv.cluster import ClusterError, ClusterMismatchError, connect, default_handle, run
from labkv.cluster._runtime.compat import CHECK_TIMEOUT_S
from labkv.cluster._runtime.connect import attached_handle
from tests._cli import Procs, clean_env, start_scheduler, start_worker
from tests._cli import bare_python as make_bare_python

pytestmark = pytest.mark.slow

# The user's own module, as a user ships it: the CLI processes run outside the
# repository, where no test module can be imported.
RANKS_MODULE = """
import numpy as np

def sum_ranks(kv):
    kv.init("w", np.zeros(3))
    kv.push("w", np.full(3, kv.rank + 1.0))
    return kv.pull("w")
"""

# A failed check must come well before any store or run timeout (120 s).
FAST_S = 3 * CHECK_TIMEOUT_S


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """The python of a new venv with Dask and numpy but not labkv."""
    return make_bare_python(tmp_path_factory.mktemp("bare"))


@pytest.fixture(scope="module")
def numpy1_path(tmp_path_factory) -> str:
    """A directory holding numpy 1.x, to put before this environment's numpy 2."""
    if int(np.__version__.split(".")[0]) < 2:
        pytest.skip("this environment's numpy is not 2.x")
    target = tmp_path_factory.mktemp("numpy1")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target"]
        + [str(target), "numpy<2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        pytest.skip(f"numpy<2 could not be installed: {done.stderr[-300:]}")
    return str(target)


@pytest.fixture(scope="module")
def old_labkv_path(tmp_path_factory) -> str:
    """A directory holding this labkv's code under an older version and protocol."""
    target = tmp_path_factory.mktemp("oldlabkv")
    shutil.copytree(Path(labkv.__file__).parent, target / "labkv")
    (target / "labkv" / "_version.py").write_text('__version__ = "0.1.0"\nPROTOCOL = 1\n')
    return str(target)


def _sum_ranks(kv):
    kv.init("w", np.zeros(3))
    kv.push("w", np.full(3, kv.rank + 1.0))
    return kv.pull("w")


@pytest.fixture
def ranks_module(tmp_path, monkeypatch):
    """``labkv_field_ranks``, a module of the user's in a file of its own."""
    path = tmp_path / "labkv_field_ranks.py"
    path.write_text(RANKS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "labkv_field_ranks", raising=False)
    import labkv_field_ranks

    return labkv_field_ranks, str(path)


def _failing_check(make) -> str:
    start = time.monotonic()
    with pytest.raises(ClusterError) as info:
        make()
    assert time.monotonic() - start < FAST_S
    return str(info.value)


def test_a_cluster_without_labkv_fails_fast_and_upload_ships_it(
    tmp_path, bare_python, ranks_module
):
    ranks, ranks_path = ranks_module
    procs = Procs(tmp_path)
    try:
        env = clean_env()
        address = start_scheduler(procs, tmp_path, python=bare_python, env=env)
        start_worker(procs, "w", address, tmp_path, python=bare_python, env=env, nworkers=2)
        with connect(address, n_workers=2) as handle:
            workers = handle.workers()
            # No cluster= given: the attached cluster, not an embedded one.
            message = _failing_check(lambda: labkv.create("dist_sync", num_servers=2))
            lines = message.splitlines()
            assert any(line.startswith(f"  scheduler {address}: no labkv") for line in lines)
            for w in workers:
                assert any(line.startswith(f"  worker {w}: no labkv") for line in lines), message
            assert f"connect({address!r}, upload=True)" in message
            message = _failing_check(lambda: run(ranks.sum_ranks, num_workers=2))
            assert "no labkv" in message
        with connect(address, n_workers=2, upload=True) as handle:
            kv = labkv.create("dist_sync", num_servers=2)
            try:
                assert kv.handle is handle
                kv.init("w", np.zeros(3, np.float32))
                kv.push("w", np.ones(3, np.float32))
                np.testing.assert_array_equal(kv.pull("w"), [1.0, 1.0, 1.0])
                hosts = {p["device"].split("@")[1] for p in kv.placement()["w"]}
                assert hosts <= set(handle.workers())
                assert set(kv.spec.server_addresses) == set(handle.workers())
            finally:
                kv.close()
            handle.upload_module(ranks_path)  # the user's module, as the docs say
            for value in run(ranks.sum_ranks, num_workers=2):
                np.testing.assert_array_equal(value, [3.0, 3.0, 3.0])
            # A worker that joins later gets labkv from the upload plugin.
            start_worker(procs, "late", address, tmp_path, python=bare_python, env=env)
            handle.client.wait_for_workers(3, timeout=60)
            for value in run(ranks.sum_ranks, num_workers=3):
                np.testing.assert_array_equal(value, [6.0, 6.0, 6.0])
    finally:
        procs.stop()


def test_numpy_and_labkv_version_mismatches_fail_fast_each_on_its_line(
    tmp_path, numpy1_path, old_labkv_path
):
    procs = Procs(tmp_path)
    try:
        address = start_scheduler(procs, tmp_path, env=clean_env())
        start_worker(procs, "np1", address, tmp_path, env=clean_env(PYTHONPATH=numpy1_path))
        start_worker(procs, "old", address, tmp_path, env=clean_env(PYTHONPATH=old_labkv_path))
        with connect(address, n_workers=2) as handle:
            versions = handle.client.run(lambda: __import__("numpy").__version__)
            np1 = [w for w, v in versions.items() if v.startswith("1.")]
            assert len(np1) == 1, versions
            (old,) = set(handle.workers()) - set(np1)
            message = _failing_check(lambda: labkv.create("dist_async", cluster=handle))
            lines = message.splitlines()
            (np_line,) = [line for line in lines if line.startswith(f"  worker {np1[0]}:")]
            assert f"numpy {versions[np1[0]]}, not 2.x" in np_line and "labkv" not in np_line
            (old_line,) = [line for line in lines if line.startswith(f"  worker {old}:")]
            want = f"labkv 0.1.0 (wire protocol 1), not {labkv.__version__} (protocol {labkv.PROTOCOL})"
            assert want in old_line
            assert "numpy" not in old_line
            assert not any(line.startswith("  scheduler") for line in lines)
            assert "install numpy 2.x" in message
        # The upload replaces the old labkv; numpy cannot be shipped: connect says so.
        message = _failing_check(lambda: connect(address, n_workers=2, upload=True))
        assert f"  worker {old}:" not in message
        assert f"  worker {np1[0]}: numpy" in message
        with connect(address, n_workers=2) as handle:
            versions = handle.client.run(lambda: __import__("labkv").__version__, workers=[old])
            assert versions == {old: labkv.__version__}
    finally:
        procs.stop()


def test_store_and_run_use_the_attached_cluster_by_default(handle):
    from distributed import Client

    # The session cluster's own client is not Dask's default; a user's plain Client is.
    with Client(handle.address, set_as_default=True, direct_to_workers=True) as client:
        attached = default_handle()
        assert attached.client is client and attached.address == handle.address
        kv = labkv.create("dist_sync", num_servers=1)
        try:
            assert kv.handle.client is client
            assert kv.spec.server_addresses[0] in handle.workers()
        finally:
            kv.close()
        for value in run(_sum_ranks, num_workers=2):
            np.testing.assert_array_equal(value, [3.0, 3.0, 3.0])
        attached.close()  # a handle on someone's client leaves that client open
        assert client.status == "running"
    # A later connect() is the default while it is open.
    with connect(handle.address) as mine:
        assert default_handle() is mine
    assert attached_handle() is not mine


def test_too_many_ranks_says_how_to_get_more_workers(handle):
    with pytest.raises(ClusterError, match=r"connect\(n_workers=5\)"):
        run(_sum_ranks, num_workers=5, cluster=handle)


# A torch model's module, as a user writes it (torch at its top, labkv.torch too).
TORCH_MODULE = """
import torch

import labkv.torch as lkt


def train(kv):
    model = torch.nn.Linear(2, 1)
    opt = lkt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), kv)
    return [p.detach().numpy() for p in model.parameters()]
"""


@pytest.fixture(scope="module")
def torchless_python(tmp_path_factory) -> str:
    """The python of a new venv with Dask and numpy but neither labkv nor torch."""
    return make_bare_python(tmp_path_factory.mktemp("torchless"), without=("torch",))


def _refusal(make) -> str:
    with pytest.raises(ClusterMismatchError) as info:
        make()
    return str(info.value)


def _one_line_each(message: str, nodes: list[str], text: str) -> None:
    for who in nodes:
        lines = [line for line in message.splitlines() if line.startswith(f"  {who}: ")]
        assert len(lines) == 1 and text in lines[0], (who, message)


def test_a_cluster_without_torch_is_named_node_by_node_before_anything_is_sent(
    tmp_path, torchless_python, monkeypatch
):
    import torch

    module_dir = tmp_path / "user"
    module_dir.mkdir()
    path = module_dir / "labkv_field_mlp.py"
    path.write_text(TORCH_MODULE)
    monkeypatch.syspath_prepend(str(module_dir))
    monkeypatch.delitem(sys.modules, "labkv_field_mlp", raising=False)
    import labkv_field_mlp as mlp

    procs = Procs(tmp_path)
    try:
        env = clean_env()
        address = start_scheduler(procs, tmp_path, python=torchless_python, env=env)
        start_worker(procs, "w", address, tmp_path, python=torchless_python, env=env, nworkers=2)
        with connect(address, n_workers=2, upload=True) as handle:
            nodes = [f"scheduler {address}"] + [f"worker {w}" for w in handle.workers()]
            release = torch.__version__.split("+")[0]

            # labkv's upload path checks first: nothing is left behind on a refusal.
            start = time.monotonic()
            message = _refusal(lambda: handle.upload_module(path))
            upload_s = time.monotonic() - start
            _one_line_each(message, nodes, "no torch (labkv_field_mlp.py imports it)")
            assert f"install torch=={release} in the cluster's environment" in message
            assert "labkv cannot ship torch" in message

            def plugins(dask_scheduler=None):
                return [*dask_scheduler.plugins, *dask_scheduler.worker_plugins]

            assert not [
                n for n in handle.client.run_on_scheduler(plugins) if "labkv_field_mlp" in n
            ]

            # run of a function of the module: torch and the module itself, per node
            start = time.monotonic()
            message = _refusal(lambda: run(mlp.train, num_workers=2))
            run_s = time.monotonic() - start
            _one_line_each(message, nodes, "no torch (train needs it, through labkv_field_mlp)")
            _one_line_each(message, nodes, "no labkv_field_mlp (train needs it)")
            assert f"handle.upload_module({str(path)!r})" in message

            # a function sent by value (a notebook's, or a script's __main__)
            def train_here(kv):
                return float(torch.ones(1).sum()) * kv.rank

            message = _refusal(lambda: run(train_here, num_workers=2))
            _one_line_each(message, nodes, "no torch (train_here needs it)")
            print(f"refused: upload_module {upload_s:.2f} s, run {run_s:.2f} s\n{message}")
    finally:
        procs.stop()
