"""The servers' optimizer of ``DistributedOptimizer(update_on_kvstore=True)``: a
``torch.optim.SGD`` or ``torch.optim.Adam`` translated into :mod:`labkv.optimizers`
with the same hyper-parameters, or refused, naming the option, where labkv has
no equivalent.

How the formulas compare (``g`` the gradient averaged over the ranks: the
servers' ``rescale_grad`` is ``1/num_workers`` on a synchronous store, where
they sum the ranks' pushes, and 1 where each push is applied alone):

- **SGD**: torch keeps ``buf = momentum*buf + (g + wd*w)`` and steps ``w -= lr*buf``;
  labkv's SGD (MXNet's) keeps ``mom = -lr*buf``: ``mom = momentum*mom - lr*wd*w - lr*g``,
  ``w += mom``. The same numbers, up to float32 rounding, while ``lr`` is constant.
- **SGD with nesterov**: labkv's NAG; the same numbers up to rounding with
  ``weight_decay=0``. With weight decay MXNet's kernel decays the *updated*
  weight in its momentum, torch the weight before the step: refused.
- **Adam**: the same moments and bias corrections (each key's own step count),
  but MXNet adds ``eps`` to ``sqrt(v)`` before the bias correction, torch after:
  labkv steps ``lr*sqrt(1-b2^t)/(1-b1^t) * m/(sqrt(v) + eps)``, torch
  ``lr/(1-b1^t) * m/(sqrt(v)/sqrt(1-b2^t) + eps)``. The same ``eps`` acts as
  ``eps/sqrt(1-b2^t)`` in torch's formula (31.6 ``eps`` at the first step with
  ``b2 = 0.999``, ``eps`` after a few thousand): steps differ by about
  ``30*eps/|g|`` relative at first, negligible where gradients are far above ``eps``.

>>> import torch
>>> w = torch.nn.Parameter(torch.zeros(2))
>>> server_optimizer(torch.optim.SGD([w], lr=0.1, momentum=0.9), "dist_sync", 2)
SGD(learning_rate=0.1, wd=0.0, rescale_grad=0.5, begin_num_update=0, momentum=0.9)
>>> server_optimizer(torch.optim.Adam([w], amsgrad=True), "local", 1)
Traceback (most recent call last):
...
ValueError: torch.optim.Adam with amsgrad=True has no equivalent on the servers (update_on_kvstore=True): labkv's Adam has no AMSGrad; use update_on_kvstore=False, where the torch optimizer itself steps on every rank
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from . import optimizers
from ._types import SYNC_KINDS

#: Per supported torch optimizer, the options that decide the servers' optimizer.
OPTIONS: dict[type, tuple[str, ...]] = {
    torch.optim.SGD: (
        "lr",
        "momentum",
        "dampening",
        "weight_decay",
        "nesterov",
        "maximize",
        "differentiable",
    ),
    torch.optim.Adam: (
        "lr",
        "betas",
        "eps",
        "weight_decay",
        "amsgrad",
        "maximize",
        "differentiable",
        "decoupled_weight_decay",
    ),
}
#: How torch would run its own step (kernels, CUDA graphs): no bearing on the servers'.
HOW = ("foreach", "fused", "capturable")


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return float(value)
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    return value


def _supported(optimizer: torch.optim.Optimizer) -> type:
    cls = type(optimizer)
    if cls not in OPTIONS:
        raise ValueError(
            f"update_on_kvstore=True runs the optimizer on the servers, which labkv.torch can "
            f"do for torch.optim.SGD and torch.optim.Adam, not {cls.__module__}.{cls.__qualname__}; "
            "use update_on_kvstore=False, where the torch optimizer itself steps on every rank"
        )
    return cls


def hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Per param group, the options that decide the servers' optimizer (tensors as floats).

    >>> w = torch.nn.Parameter(torch.zeros(1))
    >>> hyperparameters(torch.optim.SGD([w], lr=torch.tensor(0.5)))[0]["lr"]
    0.5
    """
    names = OPTIONS[_supported(optimizer)]
    return [{k: _plain(group.get(k)) for k in names} for group in optimizer.param_groups]


def _refuse(cls: type, option: str, value: Any, why: str) -> None:
    raise ValueError(
        f"torch.optim.{cls.__name__} with {option}={value!r} has no equivalent on the servers "
        f"(update_on_kvstore=True): {why}; use update_on_kvstore=False, where the torch "
        "optimizer itself steps on every rank"
    )


def _check_other_options(optimizer: torch.optim.Optimizer, cls: type) -> None:
    """An option labkv.torch does not know (a later torch's) is refused unless it
    keeps the constructor's default."""
    defaults = inspect.signature(cls.__init__).parameters
    for option in optimizer.defaults:
        if option in OPTIONS[cls] or option in HOW:
            continue
        default = defaults[option].default if option in defaults else inspect.Parameter.empty
        for group in optimizer.param_groups:
            if default is inspect.Parameter.empty or _plain(group.get(option)) != _plain(default):
                _refuse(cls, option, group.get(option), "labkv.torch does not translate it")


def _same_in_every_group(groups: list[dict[str, Any]]) -> dict[str, Any]:
    first = groups[0]
    for i, group in enumerate(groups[1:], 1):
        for option, value in group.items():
            if value != first[option]:
                raise ValueError(
                    f"param groups 0 and {i} differ in {option} ({first[option]!r} and {value!r}): "
                    "labkv's optimizers (MXNet's) take one set of hyper-parameters per store, "
                    "with no per-key learning-rate multipliers, so update_on_kvstore=True needs "
                    "every param group alike; use update_on_kvstore=False, where the torch "
                    "optimizer steps and honours each group"
                )
    return first


def server_optimizer(
    optimizer: torch.optim.Optimizer, kind: str, num_workers: int
) -> optimizers.Optimizer:
    """The labkv optimizer that runs ``optimizer``'s step on the servers of a
    ``kind`` store (``'local'``, ``'dist_sync'``...) shared by ``num_workers`` ranks."""
    cls = _supported(optimizer)
    _check_other_options(optimizer, cls)
    h = _same_in_every_group(hyperparameters(optimizer))
    if h["maximize"]:
        _refuse(cls, "maximize", True, "labkv's optimizers minimise")
    if h["differentiable"]:
        _refuse(cls, "differentiable", True, "the servers' step is not part of autograd's graph")
    rescale = 1.0 / num_workers if kind in SYNC_KINDS else 1.0
    lr, wd, momentum = float(h["lr"]), float(h["weight_decay"]), float(h.get("momentum", 0.0))
    if cls is torch.optim.SGD:
        if h["dampening"] != 0:
            _refuse(cls, "dampening", h["dampening"], "labkv's SGD (MXNet's) has no dampening")
        if h["nesterov"]:
            if h["weight_decay"] != 0:
                _refuse(
                    cls,
                    "nesterov",
                    True,
                    f"with weight_decay={h['weight_decay']!r}, labkv's NAG (MXNet 1.9.1's) decays "
                    "the updated weight in its momentum, torch the weight before the step",
                )
            return optimizers.NAG(learning_rate=lr, momentum=momentum, rescale_grad=rescale)
        return optimizers.SGD(learning_rate=lr, momentum=momentum, wd=wd, rescale_grad=rescale)
    if h["amsgrad"]:
        _refuse(cls, "amsgrad", True, "labkv's Adam has no AMSGrad")
    if h["decoupled_weight_decay"] and h["weight_decay"] != 0:
        _refuse(
            cls,
            "decoupled_weight_decay",
            True,
            "labkv's Adam (MXNet's) adds the weight decay to the gradient, as an L2 term",
        )
    beta1, beta2 = (float(b) for b in h["betas"])
    return optimizers.Adam(
        learning_rate=lr,
        beta1=beta1,
        beta2=beta2,
        epsilon=float(h["eps"]),
        wd=wd,
        rescale_grad=rescale,
    )
