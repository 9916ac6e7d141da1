"""Optimizer states to and from a state file: what ``save_optimizer_states`` writes
and the checks ``load_optimizer_states`` makes before anything changes.

>>> import numpy as np, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "states")
>>> save(path, None, 3, {"w": 3}, {"w": (np.ones(2),)})
>>> config, num_update, counts, states = load(path, {"w": (2,)})
>>> config, num_update, counts, states["w"][0]
(None, 3, {'w': 3}, array([1., 1.]))
"""

from __future__ import annotations

import os
from typing import Any

from . import _statefile

Key = int | str


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
        entry = {"key": _statefile.encode_key(k), "count": counts.get(k, 0), "n": len(state)}
        meta["keys"].append(entry)
        for j, array in enumerate(state):
            arrays[f"s{i}_{j}"] = array
    for k, count in counts.items():
        if k not in states:
            meta["keys"].append({"key": _statefile.encode_key(k), "count": count, "n": None})
    _statefile.save(fname, meta, arrays)


def load(
    fname: str | os.PathLike, shapes: dict[Key, tuple[int, ...]], have_optimizer: bool = True
) -> tuple[dict[str, Any] | None, int, dict[Key, int], dict[Key, tuple]]:
    """``(optimizer config or None, num_update, counts, states)`` from ``fname``,
    checked whole against the store's keys and their ``shapes``; a file without
    an optimizer's config is refused for a store ``have_optimizer`` False."""
    meta, arrays = _statefile.load(fname)
    if not meta.get("optimizer") and not have_optimizer:
        raise RuntimeError("no optimizer is set and the file holds none: set_optimizer first")
    counts: dict[Key, int] = {}
    states: dict[Key, tuple] = {}
    for i, entry in enumerate(meta["keys"]):
        k = _statefile.decode_key(entry["key"])
        if k not in shapes:
            raise KeyError(f"the state file has key {k!r}, which this store does not have")
        counts[k] = int(entry["count"])
        if entry["n"] is not None:
            state = tuple(arrays[f"s{i}_{j}"] for j in range(entry["n"]))
            shape = shapes[k]
            for array in state:
                if array.shape != shape:
                    raise ValueError(
                        f"state for key {k!r} has shape {array.shape}, the value has {shape}"
                    )
            states[k] = state
    return meta.get("optimizer") or None, int(meta["num_update"]), counts, states
