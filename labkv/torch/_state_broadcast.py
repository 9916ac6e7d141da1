"""Rank 0's torch optimizer state on every rank (:func:`labkv.torch.broadcast_optimizer_state`).

The other ranks may hold no state at all (a fresh optimizer), so they cannot
know which tensors to expect: rank 0 initialises a *manifest* key (JSON as
``uint8``: its param groups' plain options and, per parameter, each state
entry: a tensor's dtype, or a plain value) beside one key per state tensor,
under a fresh prefix ``optimizer_state.<n>`` (a key cannot be initialised
twice); after a barrier the other ranks pull the manifest (a dist store learns
the shapes of keys it never initialised from the servers), then the tensors, and
load the result with ``load_state_dict``, which casts each tensor to its
parameter's dtype and device as torch does.

>>> import torch, labkv
>>> w = torch.nn.Parameter(torch.ones(2))
>>> opt = torch.optim.Adam([w])
>>> w.grad = torch.ones(2); opt.step()
>>> kv = labkv.create()
>>> broadcast_state(opt, kv)
>>> sorted(kv.keys())
['optimizer_state.0/0/exp_avg', 'optimizer_state.0/0/exp_avg_sq', 'optimizer_state.0/0/step', 'optimizer_state.0/manifest']
"""

from __future__ import annotations

import json
import weakref
from typing import Any

import numpy as np
import torch

from ._tensors import store_array

#: Per store, how many broadcasts it carried (the next one's prefix).
_CALLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _plain(value: Any) -> Any:
    """``value`` as JSON, tuples tagged; ``TypeError`` for anything else."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        items = [_plain(v) for v in value]
        return {"tuple": items} if isinstance(value, tuple) else items
    raise TypeError(f"cannot broadcast a {type(value).__name__} optimizer value")


def _unplain(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(_unplain(v) for v in value["tuple"])
    if isinstance(value, list):
        return [_unplain(v) for v in value]
    return value


def _manifest(state_dict: dict[str, Any], prefix: str) -> tuple[dict, list[str], list[Any]]:
    groups = []
    for group in state_dict["param_groups"]:
        options = {}
        for option, value in group.items():
            if option in ("params", "param_names") or isinstance(value, torch.Tensor):
                continue  # which parameters: each rank's own; a tensor option: each rank's own
            options[option] = _plain(value)
        groups.append(options)
    state, keys, arrays = {}, [], []
    for index, entries in state_dict["state"].items():
        described = {}
        for entry, value in entries.items():
            if isinstance(value, torch.Tensor):
                key = f"{prefix}/{index}/{entry}"
                described[entry] = {"tensor": str(value.dtype).removeprefix("torch.")}
                keys.append(key)
                arrays.append(store_array(value, key))
            else:
                described[entry] = {"value": _plain(value)}
        state[str(index)] = described
    return {"groups": groups, "state": state}, keys, arrays


def broadcast_state(optimizer: torch.optim.Optimizer, kvstore: Any) -> None:
    """Rank 0's ``optimizer`` state and group options loaded on every rank (see module doc)."""
    number = _CALLS.get(kvstore, 0)
    _CALLS[kvstore] = number + 1
    prefix = f"optimizer_state.{number}"
    own = optimizer.state_dict()
    if kvstore.rank == 0:
        manifest, keys, arrays = _manifest(own, prefix)
        encoded = np.frombuffer(json.dumps(manifest).encode(), dtype=np.uint8)
        kvstore.init([f"{prefix}/manifest"] + keys, [encoded] + arrays)
    kvstore.barrier()
    if kvstore.rank == 0:
        return
    manifest = json.loads(kvstore.pull(f"{prefix}/manifest").tobytes().decode())
    if len(manifest["groups"]) != len(own["param_groups"]):
        raise ValueError(
            f"rank 0's optimizer has {len(manifest['groups'])} param groups, this rank's "
            f"{len(own['param_groups'])}: make the optimizer the same way on every rank"
        )
    tensors = [
        (index, entry, how["tensor"])
        for index, entries in manifest["state"].items()
        for entry, how in entries.items()
        if "tensor" in how
    ]
    pulled = kvstore.pull([f"{prefix}/{i}/{e}" for i, e, _ in tensors])
    state: dict[int, dict[str, Any]] = {int(i): {} for i in manifest["state"]}
    for (index, entry, dtype), array in zip(tensors, pulled, strict=True):
        state[int(index)][entry] = torch.from_numpy(np.asarray(array)).to(getattr(torch, dtype))
    for index, entries in manifest["state"].items():
        for entry, how in entries.items():
            if "value" in how:
                state[int(index)][entry] = _unplain(how["value"])
    groups = [
        {**group, **{k: _unplain(v) for k, v in options.items()}}
        for group, options in zip(own["param_groups"], manifest["groups"], strict=True)
    ]
    optimizer.load_state_dict({"state": state, "param_groups": groups})
