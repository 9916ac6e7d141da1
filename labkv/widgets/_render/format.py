"""How the monitor writes numbers, bytes, keys, shapes, times and places: the one
formatting of every table, text and HTML alike.

>>> fmt_num(2.0), fmt_bytes(3 * 2**20), fmt_shape((2, 3))
('2', '3.0 MiB', '2x3')
"""

from __future__ import annotations

import time
from typing import Any

from ...events import Event

__all__ = [
    "fmt_bytes",
    "fmt_key",
    "fmt_num",
    "fmt_placement",
    "fmt_shape",
    "fmt_summary",
    "fmt_time",
    "fmt_where",
]


def fmt_num(x: float | None) -> str:
    """Four significant digits; ``-`` for nothing.

    >>> fmt_num(2.0), fmt_num(1234567.0), fmt_num(None)
    ('2', '1.235e+06', '-')
    """
    return "-" if x is None else f"{x:.4g}"


def fmt_bytes(n: int | None) -> str:
    """Bytes with a binary unit.

    >>> fmt_bytes(24), fmt_bytes(3 * 2**20)
    ('24 B', '3.0 MiB')
    """
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(n)  # unreachable


def fmt_key(key: Any) -> str:
    """Keys as the user wrote them: ``3``, ``w``."""
    return "-" if key is None else str(key)


def fmt_shape(shape: tuple[int, ...], empty: str = "()") -> str:
    """``2x3``; ``empty`` for a 0-d (or unknown) shape.

    >>> fmt_shape((2, 3)), fmt_shape(())
    ('2x3', '()')
    """
    return "x".join(map(str, shape)) or empty


def fmt_time(t: float) -> str:
    """Local wall-clock time with milliseconds."""
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


def fmt_summary(s: dict[str, float] | None) -> str:
    """``mean (min..max)``, the compact form used in the log."""
    if not s:
        return "-"
    return f"{fmt_num(s.get('mean'))} ({fmt_num(s.get('min'))}..{fmt_num(s.get('max'))})"


def fmt_where(e: Event) -> str:
    """Where an event happened: its server, else its devices."""
    if e.server is not None:
        return f"server {e.server}"
    if len(e.devices) > 2:
        return f"{e.devices[0]} +{len(e.devices) - 1}"
    return " ".join(e.devices) or "-"


def fmt_placement(pieces: list[dict[str, Any]] | None) -> str:
    """``kv.placement()`` entries for one key: ``s0[0:512] s1[512:1024]`` or ``cpu(0)``."""
    if not pieces:
        return "-"
    out = []
    for p in pieces:
        where = p.get("device", "?") if p.get("server") is None else f"s{p['server']}"
        if len(pieces) > 1:
            where += f"[{p.get('start')}:{p.get('stop')}]"
        out.append(str(where))
    return " ".join(out)
