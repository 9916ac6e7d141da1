"""The strict CuPy stand-in (``tests/gpu_standin/cupy``) in this process and on a cluster.

``standin_cupy()`` makes ``import cupy`` give the stand-in while it is open (and
labkv forget which CuPy it found); ``standin_cluster()`` starts a real
``LocalCluster`` whose workers import the stand-in as ``cupy``, each with its own
``CUDA_VISIBLE_DEVICES`` rotated as dask-cuda's ``LocalCUDACluster`` does it (worker
``i`` sees GPUs ``i, i+1, ..., 0, ..., i-1``)."""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

# (labkv re-exports a function named ``devices``: fetch the module itself)
_devices = importlib.import_module("labkv.devices")


STANDIN_DIR = Path(__file__).parent / "gpu_standin"


def _forget_cupy() -> dict[str, ModuleType]:
    return {
        name: sys.modules.pop(name)
        for name in list(sys.modules)
        if name == "cupy" or name.startswith("cupy.")
    }


@contextlib.contextmanager
def standin_cupy(physical: int = 2, visible: str | None = None) -> Iterator[ModuleType]:
    """The stand-in imported as ``cupy``, simulating ``physical`` GPUs of which
    ``visible`` (a ``CUDA_VISIBLE_DEVICES`` string; all when None) are seen."""
    saved = _forget_cupy()
    spec = importlib.util.spec_from_file_location("cupy", STANDIN_DIR / "cupy" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["cupy"] = module
    spec.loader.exec_module(module)
    module.configure(physical, visible or ",".join(map(str, range(physical))))
    _devices._cupy.cache_clear()
    try:
        yield module
    finally:
        _forget_cupy()
        sys.modules.update(saved)
        _devices._cupy.cache_clear()


def rotated(index: int, physical: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` of dask-cuda's worker ``index`` on ``physical`` GPUs."""
    return ",".join(str((index + i) % physical) for i in range(physical))


def standin_cluster(n_workers: int = 2, physical: int = 2):
    """A ``ClusterHandle`` on a LocalCluster of stand-in GPU workers (see module doc)."""
    import dask
    from distributed import Client, LocalCluster

    from labkv.cluster import ClusterHandle

    class RotatedGPUCluster(LocalCluster):
        # As dask-cuda's LocalCUDACluster: each new worker gets its own rotation.
        def new_worker_spec(self):
            ((name, spec),) = super().new_worker_spec().items()
            spec = copy.deepcopy(spec)
            env = {"CUDA_VISIBLE_DEVICES": rotated(int(name), physical)}
            spec["options"]["env"] = {**spec["options"].get("env", {}), **env}
            return {name: spec}

    environ = {"LABKV_STANDIN_GPUS": str(physical), "LABKV_STANDIN_PATH": str(STANDIN_DIR)}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}):
        cluster = RotatedGPUCluster(
            n_workers=0,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
            memory_limit="1GiB",
            preload=[str(STANDIN_DIR / "preload.py")],
        )
        cluster.scale(n_workers)
        client = Client(cluster, direct_to_workers=True, set_as_default=False)
        client.wait_for_workers(n_workers, timeout=60)
    return ClusterHandle(client, cluster)
