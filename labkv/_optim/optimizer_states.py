"""Optimizer states to and from a state file: what ``save_optimizer_states`` writes
and the checks ``load_optimizer_states`` makes before anything changes.

>>> import numpy as np, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "states")
>>> save(path, None, 3, {"w": 3}, {"w": (np.ones(2),)})
>>> from labkv.optimizers import SGD
>>> optimizer, num_update, counts, states = load(path, {"w": ((2,), "f8")}, SGD(momentum=0.9))
>>> num_update, counts, states["w"][0]
(3, {'w': 3}, array([1., 1.]))
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .._types import Key
from . import statefile


def save(
    fname: str | os.PathLike,
    config: dict[str, Any] | None,
    num_update: int,
    counts: dict[Key, int],
    states: dict[Key, tuple],
) -> None:
    """Write the states (and the optimizer's ``config``, if given) to ``fname``."""
    meta: dict[str, Any] = {"keys": [], "optimizer": config, "num_update": num_update}
    arrays = {}
    for i, (k, state) in enumerate(states.items()):
        entry = {"key": statefile.encode_key(k), "count": counts.get(k, 0), "n": len(state)}
        meta["keys"].append(entry)
        for j, array in enumerate(state):
            arrays[f"s{i}_{j}"] = array
    for k, count in counts.items():
        if k not in states:
            meta["keys"].append({"key": statefile.encode_key(k), "count": count, "n": None})
    statefile.save(fname, meta, arrays)


def load(
    fname: str | os.PathLike,
    metas: dict[Key, tuple[tuple[int, ...], Any]],
    optimizer: Any | None,
) -> tuple[Any, int, dict[Key, int], dict[Key, tuple]]:
    """``(optimizer, num_update, counts, states)`` from ``fname``, checked
    whole against the store's keys (``metas``: shape and dtype per key) and
    the optimizer that will use them: the file's, when it holds its settings,
    else ``optimizer`` (the store's; None: refused). Each key's states must be
    as many as that optimizer keeps, float arrays of the value's shape; every
    refusal names the file, the key and the field (see :mod:`.statefile`)."""
    from ..optimizers import Optimizer

    with statefile.StateFile(fname) as f:
        meta = f.meta
        config = meta.get("optimizer")
        if config:
            if not isinstance(config, dict):
                raise f.error("field 'optimizer' is not an object")
            try:
                optimizer = Optimizer.from_config(config)
            except Exception as exc:
                raise f.error(f"field 'optimizer' is not an optimizer's settings ({exc})") from None
        elif optimizer is None:
            raise RuntimeError("no optimizer is set and the file holds none: set_optimizer first")
        num_update = _natural(f, meta.get("num_update"), "num_update")
        entries = meta.get("keys")
        if not isinstance(entries, list):
            raise f.error("field 'keys' is not a list")
        counts: dict[Key, int] = {}
        states: dict[Key, tuple] = {}
        for i, entry in enumerate(entries):
            where = f"keys[{i}]"
            if not isinstance(entry, dict):
                raise f.error(f"field {where!r} is not an object")
            k = _key(f, entry.get("key"), where)
            if k not in metas:
                raise f.error(f"{where} is key {k!r}, which this store does not have")
            if k in counts:
                raise f.error(f"{where}: key {k!r} appears twice")
            if "n" not in entry:
                raise f.error(f"field '{where}.n' is missing")
            counts[k] = _natural(f, entry.get("count"), f"{where}.count")
            n = entry["n"]
            if n is None:
                continue
            shape, dtype = metas[k]
            kept = len(optimizer.create_state(k, np.zeros(1, dtype=dtype)))
            if isinstance(n, bool) or not isinstance(n, int) or n != kept:
                raise f.error(
                    f"{where}.n: key {k!r} has {n!r} states in the file; "
                    f"{type(optimizer).__name__} keeps {kept}"
                )
            states[k] = tuple(
                f.array(f"s{i}_{j}", tuple(shape), f"key {k!r}, state {j}") for j in range(n)
            )
    return optimizer, num_update, counts, states


def _natural(f: statefile.StateFile, value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise f.error(f"field {field!r} is {value!r}, not a count")
    return value


def _key(f: statefile.StateFile, encoded: Any, where: str) -> Key:
    try:
        kind, key = encoded
        if (kind, type(key)) in (("int", int), ("str", str)):
            return key
    except (TypeError, ValueError):
        pass
    raise f.error(f"field '{where}.key' is {encoded!r}, not a key")
