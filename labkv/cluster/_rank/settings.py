"""The updater side of a :class:`~labkv.cluster._rank.store.DistStore`: updaters and optimizers
shipped to the servers (by every rank, saying whether it owns the store: the
servers' rules are in :mod:`labkv.cluster._server.control`), optimizer states gathered from and
loaded into them, and the compression residuals put back when a server's
update of this rank's push fails."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from ...optimizers import Optimizer
from . import split as messages

__all__ = ["StoreUpdaters"]


class StoreUpdaters:
    """:class:`~labkv.cluster._rank.store.DistStore` methods; they use its ``_owner``, ``_rank``, ``_calls``,
    ``_pieces``, ``_meta``, ``_compression``, ``_residual_undo``,
    ``num_servers`` and its ways of calling the servers."""

    def _set_updater_impl(self, updater: Callable) -> None:
        self._check_replicated_updater(updater, self._pieces)
        blob = messages.pickled_updater(updater)  # refused here if it cannot travel
        self._all_servers("set_updater", blob, self._owner, self._call_id())

    def _set_optimizer_impl(self, optimizer: Optimizer) -> None:
        # An optimizer travels as its config (data, not code), which the servers
        # compare with theirs: a non-owner's that differs is refused there.
        config = optimizer.to_config()
        self._all_servers("set_optimizer", config, self._owner, self._rank, self._call_id())

    def _call_id(self) -> tuple[str, str]:
        """A setting call's id: a replica takes a call made again after a
        failover (which it may have taken already) once."""
        return self._calls.sender, uuid.uuid4().hex

    def _optimizer_states(self) -> tuple[int, dict, dict]:
        self.flush()
        return messages.gather_states(self._all_servers("get_states"), self._meta, self._pieces)

    def _load_optimizer_states(self, num_update: int, counts: dict, states: dict) -> None:
        per_server = messages.split_states(counts, states, self._pieces, self.num_servers)
        parts = {s: (num_update, c, st) for s, (c, st) in enumerate(per_server)}
        calls = self._calls.call_each("set_states", parts)
        self._wait_all(calls, "load_optimizer_states")

    def _residuals_committed(self, replaced: dict) -> None:
        for key in {slot[0] for slot in replaced}:
            mine = {slot: r for slot, r in replaced.items() if slot[0] == key}
            pushed = {p.server: self._calls.sent[p.server] - 1 for p in self._pieces[key]}
            self._residual_undo[key] = (mine, pushed)

    def _restore_residuals(self, exc: BaseException) -> None:
        """An update of keys this rank pushed failed on a server: put back the
        compression residuals of those keys whose last push it was."""
        failed = getattr(exc, "_labkv_update", None)
        if failed is None or self._compression is None:
            return
        for key, seq in failed["seqs"].items():
            undo = self._residual_undo.get(key)
            if undo is not None and undo[1].get(failed["server"]) == seq:
                self._compression.restore(undo[0])
                del self._residual_undo[key]
