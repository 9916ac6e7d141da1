"""Learning-rate schedules, with MXNet 1.9.1's rules and numbers.

A scheduler is called with the optimizer's update count (``num_update``,
starting at 1) and returns the learning rate. Like MXNet's, these objects
are stateful and expect increasing ``num_update``.

>>> sched = FactorScheduler(step=2, factor=0.5, base_lr=1.0)
>>> [sched(n) for n in range(1, 7)]
[1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["LRScheduler", "FactorScheduler", "MultiFactorScheduler", "CosineScheduler", "create"]


class LRScheduler:
    """Base class: a constant rate after an optional warm-up.

    ``warmup_mode`` is ``'linear'`` (from ``warmup_begin_lr`` up to
    ``base_lr`` over ``warmup_steps``) or ``'constant'``.
    """

    name = "constant"

    def __init__(
        self,
        base_lr: float = 0.01,
        warmup_steps: int = 0,
        warmup_begin_lr: float = 0.0,
        warmup_mode: str = "linear",
    ):
        if warmup_steps < 0:
            raise ValueError("warmup_steps must be >= 0")
        if warmup_mode not in ("linear", "constant"):
            raise ValueError(f"warmup_mode must be 'linear' or 'constant', got {warmup_mode!r}")
        self.base_lr = base_lr
        self.warmup_steps = warmup_steps
        self.warmup_begin_lr = warmup_begin_lr
        self.warmup_final_lr = base_lr
        self.warmup_mode = warmup_mode
        self._params: dict[str, Any] = {
            "base_lr": base_lr,
            "warmup_steps": warmup_steps,
            "warmup_begin_lr": warmup_begin_lr,
            "warmup_mode": warmup_mode,
        }

    def get_warmup_lr(self, num_update: int) -> float:
        """The rate during warm-up."""
        if self.warmup_mode == "linear":
            increase = (
                (self.warmup_final_lr - self.warmup_begin_lr) * num_update / self.warmup_steps
            )
            return self.warmup_begin_lr + increase
        return self.warmup_begin_lr

    def __call__(self, num_update: int) -> float:
        if num_update < self.warmup_steps:
            return self.get_warmup_lr(num_update)
        return self.base_lr

    def to_config(self) -> dict[str, Any]:
        """Name and constructor arguments (JSON-able); ``create(**config)`` rebuilds it."""
        return {"name": self.name, "params": dict(self._params)}


class FactorScheduler(LRScheduler):
    """Multiply the rate by ``factor`` every ``step`` updates, not below ``stop_factor_lr``."""

    name = "factor"

    def __init__(self, step: int, factor: float = 1.0, stop_factor_lr: float = 1e-8, **kwargs: Any):
        super().__init__(**kwargs)
        if step < 1:
            raise ValueError("step must be >= 1")
        if factor > 1.0:
            raise ValueError("factor must be <= 1 to make the rate decay")
        self.step, self.factor, self.stop_factor_lr = step, factor, stop_factor_lr
        self.count = 0
        self._params.update(step=step, factor=factor, stop_factor_lr=stop_factor_lr)

    def __call__(self, num_update: int) -> float:
        if num_update < self.warmup_steps:
            return self.get_warmup_lr(num_update)
        while num_update > self.count + self.step:
            self.count += self.step
            self.base_lr *= self.factor
            if self.base_lr < self.stop_factor_lr:
                self.base_lr = self.stop_factor_lr
        return self.base_lr


class MultiFactorScheduler(LRScheduler):
    """Multiply the rate by ``factor`` after each update count in ``step`` (increasing)."""

    name = "multifactor"

    def __init__(self, step: list[int], factor: float = 1.0, **kwargs: Any):
        super().__init__(**kwargs)
        step = list(step)
        if not step or any(s < 1 for s in step):
            raise ValueError("step must be a non-empty list of counts >= 1")
        if any(b <= a for a, b in zip(step, step[1:], strict=False)):
            raise ValueError("step must be increasing")
        if factor > 1.0:
            raise ValueError("factor must be <= 1 to make the rate decay")
        self.step, self.factor = step, factor
        self.cur_step_ind = 0
        self.count = 0
        self._params.update(step=step, factor=factor)

    def __call__(self, num_update: int) -> float:
        if num_update < self.warmup_steps:
            return self.get_warmup_lr(num_update)
        while self.cur_step_ind <= len(self.step) - 1:
            if num_update > self.step[self.cur_step_ind]:
                self.count = self.step[self.cur_step_ind]
                self.cur_step_ind += 1
                self.base_lr *= self.factor
            else:
                return self.base_lr
        return self.base_lr


class CosineScheduler(LRScheduler):
    """Cosine decay from ``base_lr`` to ``final_lr`` over ``max_update`` updates."""

    name = "cosine"

    def __init__(
        self, max_update: int, base_lr: float = 0.01, final_lr: float = 0.0, **kwargs: Any
    ):
        super().__init__(base_lr=base_lr, **kwargs)
        if max_update < 1:
            raise ValueError("max_update must be >= 1")
        if self.warmup_steps >= max_update:
            raise ValueError("warmup_steps must be below max_update")
        self.max_update, self.final_lr = max_update, final_lr
        self.base_lr_orig = base_lr
        self.max_steps = max_update - self.warmup_steps
        self._params.update(max_update=max_update, final_lr=final_lr)

    def __call__(self, num_update: int) -> float:
        if num_update < self.warmup_steps:
            return self.get_warmup_lr(num_update)
        if num_update <= self.max_update:
            progress = math.pi * (num_update - self.warmup_steps) / self.max_steps
            self.base_lr = (
                self.final_lr + (self.base_lr_orig - self.final_lr) * (1 + math.cos(progress)) / 2
            )
        return self.base_lr


_SCHEDULERS = {
    cls.name: cls for cls in (LRScheduler, FactorScheduler, MultiFactorScheduler, CosineScheduler)
}


def create(name: str, params: dict[str, Any] | None = None) -> LRScheduler:
    """A scheduler by name (``'factor'``, ``'multifactor'``, ``'cosine'``, ``'constant'``).

    >>> create("multifactor", {"step": [2], "factor": 0.1, "base_lr": 1.0})(3)
    0.1
    """
    try:
        cls = _SCHEDULERS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown lr scheduler {name!r}; known: {sorted(_SCHEDULERS)}") from None
    return cls(**(params or {}))
