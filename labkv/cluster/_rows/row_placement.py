"""Where a row-sparse key's rows live: contiguous row ranges, one per server.

MXNet cuts a row-sparse key over all its servers by rows, whatever its size; the
pieces keep the flat element offsets of :class:`~labkv.cluster._placement.Piece`, so
every other part (pulls, peeks, optimizer states) reads them as any sliced key.

>>> place_rows((5, 2), num_servers=2)
[Piece(server=0, start=0, stop=4), Piece(server=1, start=4, stop=10)]
>>> row_ranges(place_rows((5, 2), 2), (5, 2))
[(0, 0, 2), (1, 2, 5)]
>>> row_ranges([Piece(0, 0, 5), Piece(1, 5, 10)], (5, 2)) is None  # cuts row 2
True
"""

from __future__ import annotations

import math

from .._placement import Piece, place


def place_key(
    key_id: int, shape: tuple[int, ...], sparse: bool, num_servers: int, bigarray_bound: int
) -> list[Piece]:
    """The pieces of a key: a row-sparse one's by :func:`place_rows`, a dense one's by
    MXNet's rule (:func:`~labkv.cluster._placement.place`)."""
    if sparse:
        return place_rows(shape, num_servers)
    return place(key_id, math.prod(shape), num_servers, bigarray_bound)


def place_rows(shape: tuple[int, ...], num_servers: int) -> list[Piece]:
    """The pieces of a row-sparse value of ``shape``: rows ``[s*R//S, (s+1)*R//S)``
    on server ``s``."""
    if num_servers < 1:
        raise ValueError(f"need at least one server, got {num_servers}")
    rows, row = shape[0], math.prod(shape[1:])
    cuts = [s * rows // num_servers for s in range(num_servers + 1)]
    return [Piece(s, cuts[s] * row, cuts[s + 1] * row) for s in range(num_servers)]


def row_ranges(pieces: list[Piece], shape: tuple[int, ...]) -> list[tuple[int, int, int]] | None:
    """``(server, first row, end row)`` of each piece of a value of ``shape``, or None
    when a piece starts or ends inside a row (a dense key sliced by elements)."""
    if len(pieces) == 1:
        return [(pieces[0].server, 0, shape[0])]
    row = math.prod(shape[1:])
    if row == 0 or any(p.start % row or p.stop % row for p in pieces):
        return None
    return [(p.server, p.start // row, p.stop // row) for p in pieces]
