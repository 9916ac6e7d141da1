"""The source protocol and the array, ``.npy`` and ``dask.array`` sources.

A source is a table of named fields with the same number of samples, cut into
*chunks* (runs of consecutive samples) that are read one at a time. That is all
a :class:`~labkv.data.MinibatchSource` needs, so a new format only has to say
how big its chunks are and how to read one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "Source",
    "ArraySource",
    "NpySource",
    "DaskSource",
    "DEFAULT_CHUNK_BYTES",
    "check_lengths",
]

DEFAULT_CHUNK_BYTES = 4 << 20


@runtime_checkable
class Source(Protocol):
    """What a minibatch source reads from.

    ``names``: the fields; ``chunk_sizes``: samples per chunk (all > 0; they
    sum to the number of samples); ``read_chunk(i)``: a dict giving, for each
    name, an array whose first axis runs over the samples of chunk ``i``
    (a ``dtype=object`` array of per-sample arrays for variable-length data).
    """

    names: tuple[str, ...]
    chunk_sizes: Sequence[int]

    def read_chunk(self, i: int) -> Mapping[str, Any]: ...


def check_lengths(lengths: Mapping[str, int], what: str = "field") -> int:
    """The common length of named fields, or a ``ValueError`` naming the odd one.

    >>> check_lengths({'x': 3, 'y': 3})
    3
    """
    if not lengths:
        raise ValueError("a source needs at least one field, got none")
    first, n = next(iter(lengths.items()))
    for name, m in lengths.items():
        if m != n:
            raise ValueError(
                f"{what} {name!r} has {m} samples but {what} {first!r} has {n}: "
                "all fields must have the same number of samples (first axis)"
            )
    if n == 0:
        raise ValueError("the source has no samples: nothing to iterate over")
    return n


def _cuts(n: int, step: int, boundaries: Sequence[int] = ()) -> list[int]:
    """Chunk sizes for ``n`` samples: every ``step`` samples and at every boundary."""
    cuts = sorted({0, n, *range(0, n, max(1, step)), *(b for b in boundaries if 0 < b < n)})
    return [b - a for a, b in zip(cuts, cuts[1:])]


def _rows_per_chunk(row_bytes: int, chunk_bytes: int) -> int:
    return max(1, chunk_bytes // max(1, row_bytes))


class ArraySource:
    """In-memory arrays (anything indexable with a first axis: numpy, memmaps, h5py).

    >>> s = ArraySource({'x': np.zeros((5, 2)), 'y': np.arange(5)}, chunk_size=2)
    >>> s.names, s.chunk_sizes, s.read_chunk(2)['y']
    (('x', 'y'), [2, 2, 1], array([4]))
    """

    def __init__(
        self,
        arrays: Mapping[str, Any],
        chunk_size: int | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        self.arrays = {
            name: a if hasattr(a, "shape") else np.asarray(a) for name, a in arrays.items()
        }
        n = check_lengths({k: int(a.shape[0]) if a.ndim else 0 for k, a in self.arrays.items()})
        if chunk_size is None:
            row = sum(int(np.prod(a.shape[1:])) * a.dtype.itemsize for a in self.arrays.values())
            chunk_size = _rows_per_chunk(row, chunk_bytes)
        self.names = tuple(self.arrays)
        self.chunk_sizes = _cuts(n, int(chunk_size))
        self._starts = np.concatenate([[0], np.cumsum(self.chunk_sizes)])

    def read_chunk(self, i: int) -> dict[str, Any]:
        a, b = int(self._starts[i]), int(self._starts[i + 1])
        return {k: v[a:b] for k, v in self.arrays.items()}


class NpySource:
    """``.npy`` files, each field one file or a list of shards concatenated along
    the first axis. Each chunk is read through its own small memmap, which is
    unmapped after use, so resident memory does not grow with the file.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); p = os.path.join(d, 'x.npy'); np.save(p, np.arange(6))
    >>> NpySource({'x': p}, chunk_bytes=16).read_chunk(1)['x'].tolist()
    [2, 3]
    """

    def __init__(
        self,
        paths_by_name: Mapping[str, str | os.PathLike | Sequence[str | os.PathLike]],
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        self._shards: dict[str, list[tuple[str, int, int, tuple, np.dtype]]] = {}
        lengths, bounds, row_bytes = {}, set(), 0
        for name, paths in paths_by_name.items():
            if isinstance(paths, (str, os.PathLike)):
                paths = [paths]
            shards, total = [], 0
            for path in paths:
                head = np.load(path, mmap_mode="r")
                if head.ndim == 0:
                    raise ValueError(f"{path}: a 0-d array has no samples (field {name!r})")
                if shards and (head.shape[1:], head.dtype) != (shards[0][3], shards[0][4]):
                    raise ValueError(
                        f"field {name!r}: {path} holds samples of shape {head.shape[1:]} "
                        f"{head.dtype}, but {shards[0][0]} holds {shards[0][3]} {shards[0][4]}"
                    )
                if not head.flags.c_contiguous:
                    raise ValueError(f"{path}: Fortran-ordered .npy files are not supported")
                shards.append(
                    (os.fspath(path), total, int(head.offset), head.shape[1:], head.dtype)
                )
                total += head.shape[0]
                bounds.add(total)
                del head
            self._shards[name] = [*shards, ("", total, 0, (), np.dtype(np.uint8))]
            lengths[name] = total
            row_bytes += int(np.prod(shards[0][3])) * shards[0][4].itemsize
        n = check_lengths(lengths, "field")
        self.names = tuple(self._shards)
        self.chunk_sizes = _cuts(n, _rows_per_chunk(row_bytes, chunk_bytes), sorted(bounds))
        self._starts = np.concatenate([[0], np.cumsum(self.chunk_sizes)])

    def read_chunk(self, i: int) -> dict[str, np.ndarray]:
        a, b = int(self._starts[i]), int(self._starts[i + 1])
        out = {}
        for name, shards in self._shards.items():
            k = max(j for j in range(len(shards) - 1) if shards[j][1] <= a)
            path, first, offset, shape, dtype = shards[k]
            row = int(np.prod(shape)) * dtype.itemsize
            out[name] = np.memmap(
                path,
                dtype=dtype,
                mode="r",
                offset=offset + (a - first) * row,
                shape=(b - a, *shape),
            )
        return out


class DaskSource:
    """``dask.array`` fields; chunks follow the dask chunks along the first axis
    (cut wherever any field's chunks are cut) and are computed on demand.

    >>> import dask.array as da
    >>> s = DaskSource({'x': da.arange(6, chunks=4), 'y': da.ones(6, chunks=3)})
    >>> s.chunk_sizes, s.read_chunk(1)['x']
    ([3, 1, 2], array([3]))
    """

    def __init__(self, arrays: Mapping[str, Any]) -> None:
        lengths, bounds = {}, set()
        for name, a in arrays.items():
            if not hasattr(a, "chunks") or not hasattr(a, "compute"):
                raise TypeError(f"field {name!r}: expected a dask array, got {type(a).__name__}")
            if a.ndim == 0:
                raise ValueError(f"field {name!r}: a 0-d array has no samples")
            if any(np.isnan(c) for c in a.chunks[0]):
                raise ValueError(
                    f"field {name!r} has unknown chunk sizes; call .compute_chunk_sizes() first"
                )
            lengths[name] = int(a.shape[0])
            bounds.update(np.cumsum(a.chunks[0]).tolist())
        n = check_lengths(lengths)
        self.arrays = dict(arrays)
        self.names = tuple(self.arrays)
        self.chunk_sizes = _cuts(n, n, sorted(bounds))
        self._starts = np.concatenate([[0], np.cumsum(self.chunk_sizes)])

    def read_chunk(self, i: int) -> dict[str, np.ndarray]:
        import dask

        a, b = int(self._starts[i]), int(self._starts[i + 1])
        # One compute call so shared parents of several fields are computed once.
        (values,) = dask.compute([v[a:b] for v in self.arrays.values()])
        return {k: np.asarray(v) for k, v in zip(self.arrays, values)}
