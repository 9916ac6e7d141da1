"""Optimizer-state files: arrays in an ``.npz``, everything else as JSON inside it.

Loading never runs code: ``np.load(..., allow_pickle=False)`` and ``json``
only. The file is written to exactly the given name (no ``.npz`` is added).
"""

from __future__ import annotations

import json
import os
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
    with open(path, "wb") as f:
        np.savez(f, **{_META: np.frombuffer(blob, dtype=np.uint8)}, **host)


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
