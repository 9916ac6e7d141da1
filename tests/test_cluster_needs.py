"""What a rank function or a user's module needs on the cluster's nodes
(``labkv/cluster/_runtime/needs.py``), and the check that names each node
without it: on the session cluster, a module only this process can import
(its workers started before the module's directory was on the path)."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from labkv.cluster import ClusterMismatchError, run
from labkv.cluster._runtime.compat import _install_line
from labkv.cluster._runtime.needs import file_imports, file_needs, modules_needed

TORCH_MODULE = """
import json
import torch
from torch import nn
try:
    import labkv_no_such_module_a
except ImportError:
    pass
if False:
    import labkv_no_such_module_b


def train(kv):
    return nn.Linear(2, 2)
"""


def _user_module(tmp_path: Path, monkeypatch, source: str, name: str | None = None):
    """A module of the user's in a file of its own, importable here only."""
    name = name or f"labkv_needs_{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return __import__(name), path


def test_a_function_of_a_users_module_needs_the_module_and_what_it_imports(tmp_path, monkeypatch):
    module, path = _user_module(tmp_path, monkeypatch, TORCH_MODULE)
    needs = modules_needed(module.train)
    # torch first; json is the standard library's; the guarded imports may not run
    assert list(needs) == ["torch", module.__name__]
    assert needs["torch"] == f"train needs it, through {module.__name__}"
    assert file_needs(path) == {"torch": f"{path.name} imports it"}
    assert file_imports(path) == ["json", "torch", "torch", "torch.nn"]


def test_a_function_sent_by_value_needs_what_its_code_names():
    torch = pytest.importorskip("torch")
    import labkv.torch as lkt

    def plain(kv):
        return np.zeros(2)

    def with_torch(kv):
        return torch.zeros(2)

    def through_labkv_torch(kv):
        return lkt.DistributedOptimizer

    class Net(torch.nn.Module):  # travels by value; its base by name
        pass

    def with_a_class(kv):
        return Net()

    def with_a_closure(kv):
        return with_torch(kv)

    assert modules_needed(plain) == {}
    assert modules_needed(with_torch) == {"torch": "with_torch needs it"}
    assert modules_needed(through_labkv_torch)["torch"].endswith("through labkv.torch")
    assert list(modules_needed(with_a_class)) == ["torch"]
    assert list(modules_needed(with_a_closure)) == ["torch"]
    assert modules_needed(plain, (torch.ones(1),)) == {"torch": "an argument of plain needs it"}


def test_torch_is_to_be_installed_at_this_version_not_shipped():
    torch = pytest.importorskip("torch")
    line = _install_line("torch")
    release = torch.__version__.split("+")[0]
    assert line.startswith(f"install torch=={release} in the cluster's environment")
    assert "labkv cannot ship torch" in line


def _lines(message: str, who: str) -> list[str]:
    return [line for line in message.splitlines() if line.startswith(f"  {who}")]


def test_run_names_each_node_without_the_module_and_upload_module_ships_it(
    handle, tmp_path, monkeypatch
):
    source = "import numpy as np\n\ndef sum_ranks(kv):\n    return kv.rank + 1.0\n"
    module, path = _user_module(tmp_path, monkeypatch, source)
    name = module.__name__
    with pytest.raises(ClusterMismatchError) as info:
        run(module.sum_ranks, num_workers=2, cluster=handle)
    message = str(info.value)
    assert message.startswith(f"the Dask cluster at {handle.address} lacks what")
    for worker in handle.workers():  # the scheduler runs in this process: it has the module
        assert _lines(message, f"worker {worker}: no {name} (sum_ranks needs it)"), message
    assert not _lines(message, "scheduler"), message
    assert f"ship {name} with handle.upload_module({str(path)!r})" in message
    handle.upload_module(path)
    assert run(module.sum_ranks, num_workers=2, cluster=handle) == [1.0, 2.0]


def _upload_plugins(handle) -> list[str]:
    def names(dask_scheduler=None):
        return sorted([*dask_scheduler.plugins, *dask_scheduler.worker_plugins])

    return [n for n in handle.client.run_on_scheduler(names) if n.startswith("labkv-module-")]


def test_upload_module_refuses_a_module_whose_imports_no_node_has_and_uploads_nothing(
    handle, tmp_path
):
    missing = f"labkv_absent_{uuid.uuid4().hex[:8]}"
    path = tmp_path / "needs_absent.py"
    path.write_text(f"import {missing}\n")
    before = _upload_plugins(handle)
    with pytest.raises(ClusterMismatchError) as info:
        handle.upload_module(path)
    message = str(info.value)
    assert _lines(message, f"scheduler {handle.address}: no {missing} (needs_absent.py imports it)")
    for worker in handle.workers():
        assert _lines(message, f"worker {worker}: no {missing}"), message
    assert f"install {missing} in the cluster's environment" in message
    assert _upload_plugins(handle) == before
    with pytest.raises(ValueError, match=r"a \.py file or a \.zip/\.egg archive"):
        handle.upload_module(tmp_path / "no_such_file.py")
