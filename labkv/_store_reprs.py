"""A store as a notebook shows it: ``KVStore._repr_html_``.

The table of keys (shape, dtype, placement, bytes) and of bytes per server
or device uses the monitor's formatting (:mod:`labkv.widgets._render.format`) and its
one escaping sink (:mod:`labkv.widgets._render.html`), so a key named like markup
shows as text. Rendering never raises: what it cannot read becomes a line
that says so.

>>> import labkv, numpy as np
>>> kv = labkv.create("local")
>>> kv.init("w", np.zeros((2, 3), np.float32))
>>> html = store_html(kv)
>>> "<td>w</td><td>2x3</td><td>float32</td><td>cpu(0)</td><td>24 B</td>" in html
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .widgets._render.format import fmt_bytes, fmt_key, fmt_placement, fmt_shape
from .widgets._render.html import STYLE, esc, table_html

__all__ = ["KEY_ROWS", "store_html"]

#: keys a store's repr lists (the rest are counted)
KEY_ROWS = 40


def _nbytes(shape: tuple[int, ...], dtype: Any) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _title(kv: Any) -> str:
    parts = [f"<b>labkv.KVStore</b> type <code>{esc(kv.type)}</code>"]
    store_id = getattr(kv, "store_id", None)
    if store_id is not None:
        parts.append(f"rank {esc(kv.rank)} of {esc(kv.num_workers)}")
        parts.append(f"servers {esc(kv.num_servers)}")
        replicas = getattr(getattr(kv, "spec", None), "replicas", 1)
        parts.append(f"replicas {esc(replicas)}")
        parts.append(f"id {esc(store_id)}")
    return " · ".join(parts)


def _servers(kv: Any) -> str:
    """Per server: device, bytes held, keys, bytes in and out, its workers."""
    try:
        loads = kv.server_load()
    except Exception as exc:  # a closed store, a lost server
        return f'<div class="labkv-empty">servers not read: {esc(exc)}</div>'
    members = getattr(getattr(kv, "spec", None), "replica_members", None) or []
    headers = ["server", "device", "bytes held", "keys", "bytes in", "bytes out", "workers"]
    rows = []
    for load in loads:
        sid = load.get("server")
        held = members[sid] if isinstance(sid, int) and sid < len(members) else []
        workers = [f"{m[0]} (primary)" if i == 0 else str(m[0]) for i, m in enumerate(held)]
        rows.append(
            [
                str(sid),
                str(load.get("device", "-")),
                fmt_bytes(load.get("bytes_held")),
                str(load.get("keys", "-")),
                fmt_bytes(load.get("bytes_in")),
                fmt_bytes(load.get("bytes_out")),
                ", ".join(workers) or "-",
            ]
        )
    return table_html(headers, rows, "labkv-repr-servers", "no servers")


def _devices(meta: dict, placement: dict) -> str:
    """A local store's bytes per device."""
    per: dict[str, int] = {}
    for key, (_shape, dtype) in meta.items():
        for piece in placement.get(key) or []:
            size = int(piece.get("stop", 0)) - int(piece.get("start", 0))
            device = str(piece.get("device", "?"))
            per[device] = per.get(device, 0) + size * np.dtype(dtype).itemsize
    rows = [[d, fmt_bytes(n)] for d, n in sorted(per.items())]
    return table_html(["device", "bytes"], rows, "labkv-repr-devices", "no keys")


def store_html(kv: Any) -> str:
    """The HTML a notebook shows for ``kv``: its type (rank and ranks, servers and
    replicas for a cluster store), one row per key (the first :data:`KEY_ROWS`),
    and the bytes each server (or device) holds."""
    meta = dict(getattr(kv, "_meta", {}))
    try:
        placement = kv.placement()
    except Exception as exc:
        placement, note = {}, f"placement not read: {exc}"
    else:
        note = ""
    rows = [
        [
            fmt_key(key),
            fmt_shape(shape),
            str(np.dtype(dtype)),
            fmt_placement(placement.get(key)),
            fmt_bytes(_nbytes(shape, dtype)),
        ]
        for key, (shape, dtype) in list(meta.items())[:KEY_ROWS]
    ]
    total = sum(_nbytes(shape, dtype) for shape, dtype in meta.values())
    keys = table_html(
        ["key", "shape", "dtype", "placement", "bytes"], rows, "labkv-repr-keys", "no keys yet"
    )
    more = f"{len(meta)} keys, {fmt_bytes(total)}"
    if len(meta) > KEY_ROWS:
        more += f" (the first {KEY_ROWS} shown)"
    where = _servers(kv) if getattr(kv, "store_id", None) is not None else _devices(meta, placement)
    lines = [f"<div>{_title(kv)}</div>", keys, f'<div class="labkv-empty">{esc(more)}</div>']
    if note:
        lines.append(f'<div class="labkv-empty">{esc(note)}</div>')
    lines.append(where)
    return STYLE + '<div class="labkv-repr">' + "".join(lines) + "</div>"
