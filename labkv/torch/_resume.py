"""A lost rank's replacement resuming torch training bit-identically
(``run(..., on_rank_loss="replace")``, the loop written ``for step in
kv.steps(n)`` around a :class:`labkv.torch.DistributedOptimizer`).

The replacement runs the rank's function again: it makes its model and its
DistributedOptimizer, and its step loop starts at the resume step (the first
step its lost incarnation had not pushed every gradient of, see
:mod:`labkv.cluster._rank.steps`). There, before the loop's body, it needs what
its lost incarnation held at that step's start, which is where each mode keeps
it:

- ``update_on_kvstore=True``: the weights and the optimizer's state live on the
  servers (on every replica). The replacement pulls the weights as of its
  resume step's start (the servers keep each key one round back for that).
- ``update_on_kvstore=False``: the servers hold only the last round's summed
  gradients; the weights and the torch optimizer's state live on the ranks.
  Every rank applies the same averaged gradients with the same optimizer to the
  same weights, so at a step's start every rank holds the same ones: each rank
  of a ``"replace"`` run keeps a copy of them as of the start of its current
  step in its process (one more copy of the trained parameters and the
  optimizer state, made each step), and a replacement takes its resume step's
  copy from a live rank (:mod:`labkv.cluster._runtime.kept`). A run of one
  rank has no other rank to take it from: refused when the optimizer is made.

Every pull of the step loop reads the values the lost incarnation read (a pull
of a key pushed in the same step reads the round of that push), so the replayed
gradients are the lost incarnation's; a replayed push is compared with its
first, bit for bit (a mismatch is a ``RuntimeWarning`` when the run ends).
What no store and no rank holds is not restored: module buffers (BatchNorm's
running statistics), a torch lr scheduler's count, torch's global random
generator, Python variables kept across steps. Derive them from ``step``
(``torch.manual_seed(step.number)``, ``LambdaLR`` of ``step.number``), or keep
them out of a ``"replace"`` run.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

_WHAT = "the torch weights and optimizer state (update_on_kvstore=False)"


class Resume:
    """Keeps and restores what a replacement of ``optimizer``'s rank needs, at
    each step of ``kvstore``'s loops (see module doc). ``pull_weights()``: the
    optimizer pulling its trained parameters from the store, as of now."""

    def __init__(self, optimizer: Any, kvstore: Any, pull_weights: Any) -> None:
        spec = kvstore._spec
        self.kvstore, self.run = kvstore, spec.group
        self.optimizer, self.pull_weights = optimizer, pull_weights
        self.timeout = spec.timeout + spec.replace_hold
        self.keeps = _keeps(optimizer.update_on_kvstore, kvstore)
        kvstore._steps.hooks.append(self.at_step)

    @staticmethod
    def check(update_on_kvstore: bool, kvstore: Any) -> None:
        """Refuse what a replacement could not resume (see module doc)."""
        if _keeps(update_on_kvstore, kvstore) and kvstore.num_workers == 1:
            raise ValueError(
                "on_rank_loss='replace' with update_on_kvstore=False needs 2 or more ranks: "
                "the weights and the torch optimizer state live on the ranks only, and a "
                "replacement takes them from a live rank; use update_on_kvstore=True (they "
                "live on the servers) or more ranks"
            )

    def remove(self) -> None:
        """Stop keeping and restoring (the optimizer's hooks were removed)."""
        hooks = self.kvstore._steps.hooks
        if self.at_step in hooks:
            hooks.remove(self.at_step)

    def at_step(self, number: int, resumed: bool) -> None:
        """Step ``number`` starts; ``resumed``: a replacement resumes there."""
        if resumed:
            if self.optimizer.update_on_kvstore:
                self.pull_weights()
            else:
                from ..cluster._runtime.kept import take

                rank = self.kvstore.rank
                self._restore(take(self.run, number, rank, self.timeout, _WHAT))
        if self.keeps:
            from ..cluster._runtime.kept import keep

            keep(self.run, self.kvstore.rank, number, self._state())

    def _state(self) -> dict[str, Any]:
        """Copies of the trained parameters and the torch optimizer's state dict."""
        params = [p.detach().clone() for _, p in self.optimizer._trained]
        return {
            "params": params,
            "optimizer": copy.deepcopy(self.optimizer._optimizer.state_dict()),
        }

    def _restore(self, state: dict[str, Any]) -> None:
        params = self.optimizer._trained
        with torch.no_grad():
            for (_, p), saved in zip(params, state["params"], strict=True):
                p.copy_(saved)
        # a copy: the state may be another rank's, kept in this process
        self.optimizer._optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))


def _keeps(update_on_kvstore: bool, kvstore: Any) -> bool:
    """Whether the ranks keep their state for a replacement: only they hold it,
    in a ``"replace"`` run."""
    spec = getattr(kvstore, "_spec", None)
    return not update_on_kvstore and spec is not None and spec.replace_hold > 0
