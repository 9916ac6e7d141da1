"""Optimizer-state files: arrays in an ``.npz``, everything else as JSON inside it.

Loading never runs code: ``np.load(..., allow_pickle=False)`` and ``json``
only. The file is written to exactly the given name (no ``.npz`` is added),
atomically: into a temporary file in the same folder, flushed to disk, then
renamed over the name. A save that fails (a full disk) or is killed leaves the
previous file exactly as it was, so the last good checkpoint is never lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from .devices import is_cupy

FORMAT = "labkv-optimizer-states/1"
_META = "__meta__"


def encode_key(key: int | str) -> list:
    """A key as JSON that keeps its type: ``[\"int\", 3]`` or ``[\"str\", \"w\"]``."""
    return ["int", key] if isinstance(key, int) else ["str", key]


def decode_key(encoded: list) -> int | str:
    kind, key = encoded
    if kind == "int":
        return int(key)
    if kind == "str":
        return str(key)
    raise ValueError(f"unknown key kind {kind!r} in optimizer-state file")


def save(path: str | os.PathLike, meta: dict[str, Any], arrays: dict[str, Any]) -> None:
    """Write ``meta`` (JSON-able) and named arrays (numpy or CuPy) to ``path``."""
    host = {name: (a.get() if is_cupy(a) else np.asarray(a)) for name, a in arrays.items()}
    blob = json.dumps({"format": FORMAT, **meta}).encode()
    with atomic_write(path) as f:
        np.savez(f, **{_META: np.frombuffer(blob, dtype=np.uint8)}, **host)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike) -> Any:
    """A binary file that replaces ``path`` only once it is wholly written
    and on disk; on an error ``path`` is left as it was (see module doc).

    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "states"
    >>> with atomic_write(target) as f:
    ...     _ = f.write(b"new")
    >>> target.read_bytes()
    b'new'
    """
    target = Path(path)
    tmp = target.parent / f".{target.name}.{uuid.uuid4().hex[:12]}.tmp"
    # 0o666 as open() uses: the kernel applies the umask, as for a plain save.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileNotFoundError):  # an overwritten file keeps its mode
            os.chmod(tmp, target.stat().st_mode & 0o7777)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself on disk (not on every filesystem)
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def load(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read a file written by :func:`save`: ``(meta, arrays)``."""
    try:
        with np.load(path, allow_pickle=False) as f:
            if _META not in f.files:
                raise ValueError(f"{os.fspath(path)!r} is not a labkv optimizer-state file")
            meta = json.loads(f[_META].tobytes().decode())
            arrays = {name: f[name] for name in f.files if name != _META}
    except (OSError, EOFError) as exc:
        raise ValueError(f"cannot read optimizer states from {os.fspath(path)!r}: {exc}") from exc
    if meta.get("format") != FORMAT:
        raise ValueError(f"{os.fspath(path)!r} has format {meta.get('format')!r}, not {FORMAT}")
    return meta, arrays
