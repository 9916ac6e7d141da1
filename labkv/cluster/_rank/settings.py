"""The updater side of a :class:`~labkv.cluster._rank.dist_store.DistStore`: updaters and optimizers
shipped to the servers (by every rank, saying whether it owns the store: the
servers' rules are in :mod:`labkv.cluster._server.control`), optimizer states gathered from and
loaded into them, and the compression residuals put back when a server's
update of this rank's push fails."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...compression import GradientCompression
from ...optimizers import Optimizer
from .._errors import failed_update
from . import split
from .calls import Calls

if TYPE_CHECKING:
    from .._options import StoreSpec

__all__ = ["Settings", "check_replicated_updater"]


def check_replicated_updater(updater: Any, pieces: dict, sync: bool, ssp: bool) -> None:
    """Refuse a custom updater on a sliced key of a replicated dist_ssp store
    (its clocks of a sliced key's pushes, which tick as they arrive, are not
    replicated with the updates server 0 orders), before anything is sent."""
    if updater is None or sync or not ssp:
        return
    sliced = [k for k, placed in pieces.items() if len(placed) > 1]
    if sliced:
        raise ValueError(
            f"a custom updater on keys sliced across servers ({sliced[:5]}) is not "
            "available in a dist_ssp store with replicas > 1; use an optimizer "
            "(set_optimizer), a dist_sync or dist_async store, or a larger bigarray_bound "
            "so that these keys are not sliced"
        )


class Settings:
    """The settings calls of one rank (``rank``; ``owner``: it owns the store)
    through ``calls``, on the servers of ``spec``; ``meta`` and ``pieces`` are
    the store's own ``{key: (shape, dtype)}`` and ``{key: [Piece]}``."""

    def __init__(
        self, calls: Calls, spec: StoreSpec, meta: dict, pieces: dict, *, owner: bool, rank: int
    ):
        self.calls, self.spec, self.meta, self.pieces = calls, spec, meta, pieces
        self.owner, self.rank = owner, rank
        # With compression: per key, the residuals its last push replaced and
        # that push's sequence number per server (restored if that push fails).
        self.residual_undo: dict[Any, tuple[dict, dict[int, int]]] = {}

    def check_updater(self, updater: Callable | None, pieces: dict) -> None:
        """Refuse ``updater`` on the keys placed as ``pieces`` when replicas cannot take it."""
        if self.spec.replicas > 1:
            ssp = self.spec.staleness is not None
            check_replicated_updater(updater, pieces, self.spec.sync, ssp)

    def set_updater(self, updater: Callable) -> None:
        self.check_updater(updater, self.pieces)
        blob = split.pickled_updater(updater)  # refused here if it cannot travel
        self.calls.all("set_updater", blob, self.owner, self._call_id())

    def set_optimizer(self, optimizer: Optimizer) -> None:
        # An optimizer travels as its config (data, not code), which the servers
        # compare with theirs: a non-owner's that differs is refused there.
        config = optimizer.to_config()
        self.calls.all("set_optimizer", config, self.owner, self.rank, self._call_id())

    def _call_id(self) -> tuple[str, str]:
        """A setting call's id: a replica takes a call made again after a
        failover (which it may have taken already) once."""
        return self.calls.sender, uuid.uuid4().hex

    def optimizer_states(self) -> tuple[int, dict, dict]:
        """``(num_update, counts, states)`` gathered from every server, after this rank's pushes."""
        self.calls.flush()
        return split.gather_states(self.calls.all("get_states"), self.meta, self.pieces)

    def load_optimizer_states(self, num_update: int, counts: dict, states: dict) -> None:
        """Give every server its part of ``states``."""
        per_server = split.split_states(counts, states, self.pieces, self.spec.num_servers)
        parts = {s: (num_update, c, st) for s, (c, st) in enumerate(per_server)}
        self.calls.wait(self.calls.call_each("set_states", parts), "load_optimizer_states")

    def residuals_committed(self, replaced: dict) -> None:
        """The residuals a push just replaced (``{slot: residual}``), kept until a
        later push of the same key replaces them."""
        for key in {slot[0] for slot in replaced}:
            mine = {slot: r for slot, r in replaced.items() if slot[0] == key}
            pushed = {p.server: self.calls.sent[p.server] - 1 for p in self.pieces[key]}
            self.residual_undo[key] = (mine, pushed)

    def restore_residuals(
        self, exc: BaseException, compression: GradientCompression | None
    ) -> None:
        """An update of keys this rank pushed failed on a server: put back the
        compression residuals of those keys whose last push it was."""
        failed = failed_update(exc)
        if failed is None or compression is None:
            return
        for key, seq in failed.seqs.items():
            undo = self.residual_undo.get(key)
            if undo is not None and undo[1].get(failed.server) == seq:
                compression.restore(undo[0])
                del self.residual_undo[key]
