"""The minibatch: a dict of named arrays that also says which samples it holds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["Minibatch", "concat", "finish"]


class Minibatch(dict):
    """A dict ``name -> array`` (first axis: samples) with bookkeeping.

    ``indices``: the sample ids (rows of the source) in this minibatch;
    ``padding``: True for samples repeated to give every rank equal steps
    (``pad`` counts them, like MXNet's ``DataBatch.pad``); ``epoch`` and
    ``step``: where it comes from; ``sweep_end``: it holds the last sample of
    an epoch (CNTK's name); ``mask``: for sequence data, ``name -> (batch,
    length)`` booleans, True where a padded sequence has a real step.

    >>> mb = Minibatch({'x': np.zeros((2, 3))}, indices=np.array([4, 0]),
    ...                padding=np.array([False, True]))
    >>> mb['x'].shape, mb.pad, mb.num_samples
    ((2, 3), 1, 2)
    """

    def __init__(
        self,
        data: dict[str, Any],
        indices: np.ndarray,
        padding: np.ndarray | None = None,
        epoch: int = 0,
        step: int = 0,
        sweep_end: bool = False,
        mask: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(data)
        self.indices = np.asarray(indices, dtype=np.int64)
        self.padding = (
            np.zeros(len(self.indices), dtype=bool) if padding is None else np.asarray(padding)
        )
        self.epoch, self.step, self.sweep_end = epoch, step, sweep_end
        self.mask = mask

    @property
    def pad(self) -> int:
        """How many samples are padding (repeats)."""
        return int(self.padding.sum())

    @property
    def num_samples(self) -> int:
        """The number of samples (``len(mb)`` is the number of fields, as for any dict)."""
        return len(self.indices)

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{k}: {getattr(v, 'shape', '?')} {getattr(v, 'dtype', '')}" for k, v in self.items()
        )
        return (
            f"Minibatch({self.num_samples} samples, epoch={self.epoch}, step={self.step}, "
            f"pad={self.pad}; {fields})"
        )

    def slice(self, a: int, b: int) -> Minibatch:
        """Samples ``[a, b)`` (raw minibatches only: before :func:`finish`)."""
        return Minibatch(
            {k: v[a:b] for k, v in self.items()},
            self.indices[a:b],
            self.padding[a:b],
            self.epoch,
            self.step,
            self.sweep_end and b == self.num_samples,
        )


def concat(parts: Sequence[Minibatch], step: int = 0) -> Minibatch:
    """Join raw minibatches (copies, so no part keeps a larger buffer alive)."""
    if len(parts) == 1:
        p = parts[0]
        data = {k: v.copy() for k, v in p.items()}
    else:
        p = parts[0]
        data = {k: np.concatenate([q[k] for q in parts]) for k in p}
    return Minibatch(
        data,
        np.concatenate([q.indices for q in parts]),
        np.concatenate([q.padding for q in parts]),
        p.epoch,
        step,
        any(q.sweep_end for q in parts),
    )


def _pad_sequences(seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(batch, max length, *sample shape)`` zeros-padded values and their mask."""
    lengths = [len(s) for s in seqs]
    first = seqs[0]
    out = np.zeros((len(seqs), max(lengths, default=0), *first.shape[1:]), dtype=first.dtype)
    mask = np.zeros(out.shape[:2], dtype=bool)
    for i, (s, n) in enumerate(zip(seqs, lengths)):
        out[i, :n] = s
        mask[i, :n] = True
    return out, mask


def finish(mb: Minibatch, device: Any = None) -> Minibatch:
    """Pad variable-length fields (adding ``mb.mask``) and move arrays to ``device``."""
    mask = {}
    for k, v in mb.items():
        if isinstance(v, np.ndarray) and v.dtype == object:
            mb[k], mask[k] = _pad_sequences(v)
    if mask:
        mb.mask = mask
    if device is not None:
        from ..devices import to_device

        for k, v in mb.items():
            mb[k] = to_device(v, device, copy=False)
        if mb.mask:
            mb.mask = {k: to_device(v, device, copy=False) for k, v in mb.mask.items()}
    return mb
