"""What a push runs on the stored values: a custom updater or an optimizer (and its
saved states), and gradient compression of what is pushed.

:class:`Updating` is a part of :class:`labkv.store.KVStore`: it checks the
settings and hands them to the backend (the ``_..._impl`` methods), which runs
them through its :class:`~labkv.shard.Shard`.

>>> import labkv, numpy as np
>>> kv = labkv.create()
>>> kv.set_optimizer("sgd", learning_rate=0.5)
>>> kv.set_updater(42)
Traceback (most recent call last):
...
TypeError: updater must be callable, got int
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from .._optim import optimizer_states
from .._types import Key
from ..compression import GradientCompression
from ..optimizers import Optimizer
from ..optimizers import create as create_optimizer


class Updating:
    """Updater, optimizer, optimizer states and compression of a store (see module doc)."""

    _meta: dict[Key, tuple[tuple[int, ...], np.dtype]]
    _compression: GradientCompression | None
    _optimizer: Optimizer | None
    _updater: Callable | None

    def set_updater(self, updater: Callable[[Key, Any, Any], Any]) -> None:
        """Use ``updater(key, merged, stored)`` for every push; it changes
        ``stored`` in place. Called once per key per push, after aggregation,
        with the key as the user gave it. If it raises, the exception reaches
        the caller and no key of that push changes.

        On a ``dist_*`` store every rank ships its updater to the servers and
        returns once they have it; the store's owner's (rank 0 of a run, or the
        notebook that shares its store) replaces what is there, another rank's
        is used only where none is set yet (pickled code cannot be compared,
        so otherwise it is ignored): set the same updater on every rank. MXNet:
        a worker's ``_set_updater`` changes only its own process's store.

        >>> import labkv, numpy as np
        >>> kv = labkv.create()
        >>> kv.init(3, np.ones(2))
        >>> def update(key, merged, stored):
        ...     stored += merged * 2
        >>> kv.set_updater(update)
        >>> kv.push(3, np.ones(2))
        >>> kv.pull(3)
        array([3., 3.])
        """
        if not callable(updater):
            raise TypeError(f"updater must be callable, got {type(updater).__name__}")
        self._set_updater_impl(updater)
        self._updater, self._optimizer = updater, None

    _set_updater = set_updater

    def set_optimizer(self, optimizer: Optimizer | str, **params: Any) -> None:
        """Run ``optimizer`` on the store: pushes are gradients, the stored
        values are the weights. ``optimizer`` is a :mod:`labkv.optimizers`
        object or its name (then ``params`` are its hyper-parameters).

        On a ``dist_*`` store every rank ships the optimizer (its config) to
        the servers and returns once they have it, so that its later pushes
        are applied with it. The store's owner's (rank 0 of a run, or the
        notebook that shares its store) replaces what is there, with fresh
        states, except an equal one another rank set first, which is kept with
        its states. Another rank's is used where none is set yet; if the
        servers use a different one, it raises ``ValueError`` naming the rank
        and the difference, and changes nothing. MXNet: the servers take every
        worker's, the last to arrive wins, states start afresh each time.

        >>> import labkv, numpy as np
        >>> kv = labkv.create()
        >>> kv.init(0, np.zeros(2, dtype=np.float32))
        >>> kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.5))
        >>> kv.push(0, [np.ones(2, dtype=np.float32)] * 2)
        >>> kv.pull(0)
        array([-1., -1.], dtype=float32)
        """
        if isinstance(optimizer, str):
            optimizer = create_optimizer(optimizer, **params)
        elif params:
            raise TypeError("params are only taken with an optimizer name")
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"expected a labkv optimizer, got {type(optimizer).__name__}")
        self._set_optimizer_impl(optimizer)
        self._optimizer, self._updater = optimizer, None

    def save_optimizer_states(self, fname: str | os.PathLike, dump_optimizer: bool = False) -> None:
        """Save the optimizer's per-key states (and with ``dump_optimizer``
        its settings) to ``fname`` as npz + JSON; loading never runs code.

        >>> import labkv, numpy as np, tempfile, os
        >>> kv = labkv.create()
        >>> kv.init(0, np.zeros(2, dtype=np.float32))
        >>> kv.set_optimizer("sgd", learning_rate=0.1, momentum=0.9)
        >>> kv.push(0, np.ones(2, dtype=np.float32))
        >>> path = os.path.join(tempfile.mkdtemp(), "states")
        >>> kv.save_optimizer_states(path)
        >>> kv.load_optimizer_states(path)
        """
        if self._optimizer is None:
            raise RuntimeError("no optimizer is set: call set_optimizer first")
        num_update, counts, states = self._optimizer_states()
        config = self._optimizer.to_config() if dump_optimizer else None
        optimizer_states.save(fname, config, num_update, counts, states)

    def load_optimizer_states(self, fname: str | os.PathLike) -> None:
        """Load states saved by :meth:`save_optimizer_states`. If the file
        holds the optimizer's settings, that optimizer is set first.
        The file is checked whole before anything changes: its keys against
        the store's, each key's number of states against what the optimizer
        keeps, their shapes and float dtypes against the value's; only the
        members needed are read, each no bigger than its header says; a
        refusal is a ``ValueError`` naming the file, the key and the field."""
        loaded = optimizer_states.load(fname, dict(self._meta), self._optimizer)
        optimizer, num_update, counts, states = loaded
        if optimizer is not self._optimizer:
            self.set_optimizer(optimizer)
        self._load_optimizer_states(num_update, counts, states)

    def set_gradient_compression(self, compression_params: dict[str, Any]) -> None:
        """Compress pushed gradients: ``{'type': '2bit', 'threshold': 0.5}``
        (or ``'1bit'``; ``'none'`` turns it off). Each device keeps a residual
        per key; only float32 values can be compressed.

        Applied where the pushes are made: on a ``dist_*`` store each rank
        compresses its own pushes (each message says how), so a rank's pushes
        after the call are compressed whatever the other ranks do. MXNet: each
        worker compresses its own; rank 0 also tells the servers the type.

        >>> import labkv, numpy as np
        >>> kv = labkv.create("device")
        >>> kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
        >>> kv.init(0, np.zeros(3, dtype=np.float32))
        >>> kv.push(0, np.array([0.7, -0.2, -0.6], dtype=np.float32))
        >>> kv.pull(0)
        array([ 0.5,  0. , -0.5], dtype=float32)
        """
        compression = GradientCompression.from_params(compression_params)
        self._compression = compression if compression.type != "none" else None

    # -- what backends implement ---------------------------------------------
    def _set_updater_impl(self, updater: Callable) -> None:
        raise NotImplementedError

    def _set_optimizer_impl(self, optimizer: Optimizer) -> None:
        raise NotImplementedError

    def _optimizer_states(self) -> tuple[int, dict, dict]:
        """``(num_update, per-key update counts, per-key states)``: the global
        count stays apart, so any key name (even ``'__num_update__'``) is safe."""
        raise NotImplementedError

    def _load_optimizer_states(self, num_update: int, counts: dict, states: dict) -> None:
        raise NotImplementedError

    def _residuals_committed(self, replaced: dict) -> None:
        """A push's compression residuals were committed, replacing ``replaced``
        (a backend whose push can still fail later keeps them to restore; here
        the push is done, and their arrays take the next push's residuals)."""
        if self._compression is not None:
            self._compression.release(replaced)
