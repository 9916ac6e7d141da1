"""Shipping this process's labkv to a cluster: ``connect(address, upload=True)``;
and a user's module: ``handle.upload_module(path)``.

labkv is pure Python, so it travels as one zip archive of its package, which
Python imports from ``sys.path``. Dask's upload plugins put the archive on the
scheduler (``SchedulerUploadFile``) and on every worker, workers that join
later included (``UploadFile``, a worker plugin the scheduler keeps); both are
Dask's own classes, so a cluster without labkv can load them. Before that,
labkv modules a node imported already (another version) are dropped from
``sys.modules``, so the next import reads the archive.

The archive's name carries the version and a hash of its contents: Python
caches a zip archive's index by path, so a changed labkv must not reuse a name.
"""

from __future__ import annotations

import hashlib
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from distributed.diagnostics.plugin import SchedulerUploadFile, UploadFile

from ..._logger import logger
from ..._version import __version__
from .compat import by_value
from .waits import announced

#: The plugin name both uploads register under (a later upload replaces it).
PLUGIN_NAME = "labkv-upload"

_FORGET_SOURCE = '''
def labkv_forget(dask_worker=None, dask_scheduler=None):
    """Drop every imported labkv module (the next import finds the upload)."""
    import sys
    names = [n for n in sys.modules if n == "labkv" or n.startswith("labkv.")]
    for name in names:
        del sys.modules[name]
    return len(names)
'''


_forget = by_value(_FORGET_SOURCE, "labkv_forget")


def package_files(root: Path) -> list[Path]:
    """The files of the labkv package under ``root`` (sources, no caches), sorted.

    >>> import labkv
    >>> files = package_files(Path(labkv.__file__).parent)
    >>> Path("__init__.py") in files and not any("__pycache__" in f.parts for f in files)
    True
    """
    return sorted(
        p.relative_to(root)
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    )


def build_archive(directory: Path) -> Path:
    """Zip this process's labkv package into ``directory``; the archive's path."""
    root = Path(__file__).resolve().parents[2]  # labkv/cluster/_runtime/upload.py
    files = package_files(root)
    digest = hashlib.sha256()
    for name in files:
        digest.update(str(name).encode() + b"\0" + (root / name).read_bytes())
    path = directory / f"labkv-{__version__}-{digest.hexdigest()[:10]}.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in files:
            archive.write(root / name, Path("labkv") / name)
    return path


def upload_labkv(client: Any) -> None:
    """Put this process's labkv on the scheduler and every worker of ``client``'s
    cluster, and on every worker that joins later."""
    address = client.scheduler.address
    logger.info("uploading labkv to the scheduler and workers of %s", address)
    with (
        announced(f"uploading labkv to the scheduler and workers of {address}"),
        tempfile.TemporaryDirectory(prefix="labkv-upload-") as tmp,
    ):
        path = str(build_archive(Path(tmp)))
        client.run_on_scheduler(_forget)
        client.run(_forget)
        client.register_plugin(SchedulerUploadFile(path, load=True), name=PLUGIN_NAME)
        client.register_plugin(UploadFile(path, load=True), name=PLUGIN_NAME)
    logger.info("labkv uploaded to %s (and to every worker that joins)", address)


def upload_module(client: Any, path: str) -> None:
    """Put a user's module file on the scheduler, then on every worker (and
    those that join later), importing it there; one plugin name per file name,
    so that uploading it again replaces the earlier upload. The scheduler goes
    first: a module it cannot import leaves no worker plugin behind."""
    name = f"labkv-module-{Path(path).name}"
    with announced(f"uploading {Path(path).name} to the scheduler and workers"):
        client.register_plugin(SchedulerUploadFile(path, load=True), name=name)
        client.register_plugin(UploadFile(path, load=True), name=name)
