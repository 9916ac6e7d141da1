"""CNTK Text Format (CTF) files, read in chunks.

A line is ``[sequence id] |name values |name values ... |# comment``. Dense
values are numbers separated by spaces or tabs; sparse values are
``index:value`` pairs and become dense vectors of ``dim`` (zeros elsewhere).
Consecutive lines with the same sequence id form one sequence; a line without
an id is a sequence on its own.

Opening a file makes one pass over it that records, per chunk of about
``chunk_bytes``, its byte offset, first line number and number of sequences
(memory O(chunks)); values are parsed when a chunk is read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._sources import DEFAULT_CHUNK_BYTES

__all__ = ["CTFSource", "CTFFormatError", "StreamSpec"]

_BLOCK = 1 << 20


class CTFFormatError(ValueError):
    """A malformed CTF line: ``path``, ``line`` (1-based) and what was expected."""

    def __init__(self, path: str, line: int, message: str, text: str = "") -> None:
        self.path, self.line, self.reason = path, line, message
        shown = text if len(text) <= 80 else text[:77] + "..."
        super().__init__(f"{path}:{line}: {message}" + (f"\n    {shown}" if text else ""))


@dataclass(frozen=True)
class StreamSpec:
    """One input stream of a CTF file, like CNTK's ``StreamDef(field, shape, is_sparse)``.

    >>> StreamSpec.parse('labels', {'dim': 10, 'sparse': True})
    StreamSpec(name='labels', field='labels', dim=10, sparse=True, dtype=dtype('float32'))
    """

    name: str
    field: str
    dim: int
    sparse: bool = False
    dtype: np.dtype = np.dtype(np.float32)

    @classmethod
    def parse(cls, name: str, spec: Mapping[str, Any] | int) -> StreamSpec:
        if isinstance(spec, (int, np.integer)):
            spec = {"dim": spec}
        known = {"dim", "shape", "sparse", "is_sparse", "field", "dtype"}
        unknown = set(spec) - known
        if unknown:
            raise ValueError(
                f"stream {name!r}: unknown keys {sorted(unknown)}; use {sorted(known)}"
            )
        dim = spec.get("dim", spec.get("shape"))
        if isinstance(dim, (tuple, list)) and len(dim) == 1:
            dim = dim[0]
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise ValueError(f"stream {name!r}: 'dim' must be a positive int, got {dim!r}")
        field = str(spec.get("field", name))
        if not field or any(c.isspace() or c == "|" for c in field):
            raise ValueError(f"stream {name!r}: bad field name {field!r}")
        sparse = bool(spec.get("sparse", spec.get("is_sparse", False)))
        return cls(name, field, int(dim), sparse, np.dtype(spec.get("dtype", np.float32)))


def _sequence_id(path: str, lineno: int, line: str) -> str | None:
    """The sequence id of a line (None when omitted); raises on a malformed start."""
    bar = line.find("|")
    if bar < 0:
        raise CTFFormatError(path, lineno, "expected '|' followed by a field name", line)
    head = line[:bar].strip()
    if not head:
        return None
    if not head.isdigit():
        raise CTFFormatError(
            path,
            lineno,
            f"expected a sequence id (a non-negative integer) or '|', got {head!r}",
            line,
        )
    return head


class CTFSource:
    """A CTF text file as a chunked source.

    ``sequences=None`` detects from the file whether any sequence spans several
    lines. Without sequences each field is an array ``(n, dim)``; with them
    each sample of a field is an array ``(length, dim)`` (the minibatch source
    pads these and gives a mask).

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), 'd.ctf')
    >>> _ = open(p, 'w').write('|x 1 2 |y 1:1\\n|x 3 4 |y 0:1\\n')
    >>> s = CTFSource(p, {'x': {'dim': 2}, 'y': {'dim': 2, 'sparse': True}})
    >>> c = s.read_chunk(0); c['x'].tolist(), c['y'].tolist()
    ([[1.0, 2.0], [3.0, 4.0]], [[0.0, 1.0], [1.0, 0.0]])
    """

    def __init__(
        self,
        path: str | os.PathLike,
        streams: Mapping[str, Mapping[str, Any] | int],
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        sequences: bool | None = None,
    ) -> None:
        self.path = os.fspath(path)
        if not streams:
            raise ValueError("from_ctf needs at least one stream, e.g. {'features': {'dim': 784}}")
        self.streams = {name: StreamSpec.parse(name, spec) for name, spec in streams.items()}
        fields = [s.field for s in self.streams.values()]
        if len(set(fields)) != len(fields):
            raise ValueError(f"two streams read the same field: {fields}")
        self._by_field = {s.field: s for s in self.streams.values()}
        self.names = tuple(self.streams)
        self._index(max(1, int(chunk_bytes)))
        if sequences is False and self._multi_line:
            raise ValueError(
                f"{self.path}: sequences=False but line {self._multi_line} continues a sequence "
                "(same sequence id as the line before)"
            )
        self.sequences = self._multi_line > 0 if sequences is None else bool(sequences)

    def _index(self, chunk_bytes: int) -> None:
        """One pass over the file: chunk offsets, first lines and sizes."""
        offsets, first_lines, sizes = [], [], []
        self._multi_line = 0
        prev_id: str | None = None
        pos, lineno, chunk_start, nseq = 0, 0, 0, 0
        with open(self.path, "rb") as f:
            carry = b""
            while True:
                block = f.read(_BLOCK)
                data = carry + block
                lines = data.split(b"\n")
                carry = lines.pop() if block else b""
                if not block and not data:
                    break
                for raw in lines:
                    lineno += 1
                    line = raw.decode("utf-8", errors="replace")
                    if line.strip():
                        seq = _sequence_id(self.path, lineno, line)
                        if seq is not None and seq == prev_id:
                            self._multi_line = self._multi_line or lineno
                        else:
                            if nseq and pos - chunk_start >= chunk_bytes:
                                sizes.append(nseq)
                                nseq, chunk_start = 0, pos
                            if nseq == 0:
                                offsets.append(pos)
                                first_lines.append(lineno)
                            nseq += 1
                        prev_id = seq
                    pos += len(raw) + 1
                if not block:
                    break
        if nseq:
            sizes.append(nseq)
        if not sizes:
            raise ValueError(f"{self.path}: the file has no samples (it is empty or blank)")
        self.chunk_sizes = sizes
        self._offsets = [*offsets, pos]
        self._first_lines = first_lines

    def read_chunk(self, i: int) -> dict[str, np.ndarray]:
        with open(self.path, "rb") as f:
            f.seek(self._offsets[i])
            text = f.read(self._offsets[i + 1] - self._offsets[i]).decode("utf-8", errors="replace")
        return self._parse(text.split("\n"), self._first_lines[i], self.chunk_sizes[i])

    def _parse(self, lines: list[str], first_line: int, expected: int) -> dict[str, np.ndarray]:
        found: dict[str, tuple[list[int], list]] = {name: ([], []) for name in self.streams}
        seq_of_row: list[int] = []
        line_of_row: list[int] = []
        prev_id, nseq = None, 0
        for k, line in enumerate(lines):
            if not line.strip():
                continue
            lineno = first_line + k
            seq = _sequence_id(self.path, lineno, line)
            if seq is None or seq != prev_id:
                nseq += 1
            prev_id = seq
            row = len(seq_of_row)
            seq_of_row.append(nseq - 1)
            line_of_row.append(lineno)
            for part in line.split("|")[1:]:
                if part.startswith("#"):
                    continue  # a comment, or an escaped '|#' inside one
                head = part.split(None, 1)
                if not head or part[0].isspace():
                    raise CTFFormatError(
                        self.path, lineno, "expected a field name right after '|'", line
                    )
                spec = self._by_field.get(head[0])
                if spec is None:
                    continue  # a field nobody asked for
                tokens = head[1].split() if len(head) > 1 else []
                rows, values = found[spec.name]
                if not self.sequences and rows and rows[-1] == row:
                    raise CTFFormatError(
                        self.path, lineno, f"field |{spec.field} appears twice in one sample", line
                    )
                values.append(self._check_tokens(spec, tokens, lineno, line))
                rows.append(row)
        if nseq != expected:  # the file changed since it was indexed
            raise ValueError(f"{self.path} changed while being read; open it again")
        out = {}
        for name, (rows, values) in found.items():
            spec = self.streams[name]
            dense = self._to_dense(spec, rows, values, line_of_row)
            if self.sequences:
                out[name] = _group(dense, np.asarray(seq_of_row)[rows], nseq, spec)
            else:
                if len(rows) != len(seq_of_row):
                    missing = sorted(set(range(len(seq_of_row))) - set(rows))[0]
                    ln = line_of_row[missing]
                    raise CTFFormatError(
                        self.path,
                        ln,
                        f"expected field |{spec.field} (dim {spec.dim}), not found",
                        lines[ln - first_line],
                    )
                out[name] = dense
        return out

    def _check_tokens(self, spec: StreamSpec, tokens: list[str], lineno: int, line: str) -> list:
        if not spec.sparse:
            if len(tokens) != spec.dim:
                raise CTFFormatError(
                    self.path,
                    lineno,
                    f"field |{spec.field}: expected {spec.dim} dense values, got {len(tokens)}",
                    line,
                )
            return tokens
        pairs = [t.partition(":") for t in tokens]
        for t, (_, sep, value) in zip(tokens, pairs):
            if not sep or not value:
                raise CTFFormatError(
                    self.path,
                    lineno,
                    f"field |{spec.field} is sparse: expected index:value, got {t!r}",
                    line,
                )
        return pairs

    def _to_dense(
        self, spec: StreamSpec, rows: list[int], values: list, line_of_row: list[int]
    ) -> np.ndarray:
        if not spec.sparse:
            try:
                flat = np.array([t for v in values for t in v], dtype=spec.dtype)
            except ValueError:
                self._locate(spec, rows, values, line_of_row, lambda v: np.array(v, spec.dtype))
                raise
            return flat.reshape(len(rows), spec.dim)
        dense = np.zeros((len(rows), spec.dim), dtype=spec.dtype)
        counts = [len(v) for v in values]
        try:
            idx = np.array([i for v in values for i, _, _ in v], dtype=np.int64)
            val = np.array([x for v in values for _, _, x in v], dtype=spec.dtype)
        except ValueError:
            self._locate(spec, rows, values, line_of_row, _sparse_values(spec))
            raise
        bad = (idx < 0) | (idx >= spec.dim)
        if bad.any():
            k = int(np.searchsorted(np.cumsum(counts), np.argmax(bad), side="right"))
            raise CTFFormatError(
                self.path,
                line_of_row[rows[k]],
                f"field |{spec.field}: sparse index {idx[bad][0]} out of range [0, {spec.dim})",
            )
        dense[np.repeat(np.arange(len(rows)), counts), idx] = val
        return dense

    def _locate(self, spec, rows, values, line_of_row, convert) -> None:
        """Re-raise a conversion error with the line it happened on."""
        for row, v in zip(rows, values):
            try:
                convert(v)
            except ValueError as e:
                raise CTFFormatError(
                    self.path, line_of_row[row], f"field |{spec.field}: expected numbers ({e})"
                ) from None


def _sparse_values(spec: StreamSpec):
    def convert(pairs: list) -> None:
        np.array([i for i, _, _ in pairs], dtype=np.int64)
        np.array([x for _, _, x in pairs], dtype=spec.dtype)

    return convert


def _group(dense: np.ndarray, seq: np.ndarray, nseq: int, spec: StreamSpec) -> np.ndarray:
    """Per-sequence ``(length, dim)`` arrays as a 1-d object array."""
    out = np.empty(nseq, dtype=object)
    bounds = np.searchsorted(seq, np.arange(nseq + 1))
    for s in range(nseq):
        out[s] = dense[bounds[s] : bounds[s + 1]]
    return out
