"""Optimizers that run on the store, with MXNet 1.9.1's update formulas.

Each optimizer keeps per-key update counts (``num_update`` feeds the
learning-rate scheduler; Adam's bias correction uses the key's own count),
makes a tuple of state arrays per key (``create_state``) and updates a
weight in place (``update``) with the key's learning rate and weight decay
(the optimizer's, times the key's multipliers from ``set_lr_mult`` and
``set_wd_mult``, as MXNet's ``_get_lr``/``_get_wd``). The code is written
once for numpy and CuPy: arrays bring their own module. Hyper-parameters are cast to the weight's
dtype before use, as MXNet's kernels do, so float32 results match MXNet's.
The base class and the registry of names live in :mod:`labkv._optim.optimizer_base`.

>>> import numpy as np
>>> opt = SGD(learning_rate=0.1, momentum=0.9)
>>> w = np.ones(2, dtype=np.float32); g = np.ones(2, dtype=np.float32)
>>> state = opt.create_state(0, w)
>>> opt.update(0, w, g, state); w
array([0.9, 0.9], dtype=float32)
"""

from __future__ import annotations

import math
from typing import Any

from ._optim.optimizer_base import Optimizer, _plus_epsilon, _zeros, create, register
from .devices import array_module

__all__ = [
    "Optimizer",
    "SGD",
    "NAG",
    "Adam",
    "AdaGrad",
    "RMSProp",
    "AdaDelta",
    "Signum",
    "SignSGD",
    "create",
    "register",
]


def _sgd_step(opt: Optimizer, weight: Any, grad: Any, lr: Any) -> Any:
    """``lr`` times the rescaled, clipped gradient, in MXNet's float32 order:
    ``lr*clip(rg*g)`` with clipping, ``(lr*rg)*g`` without."""
    dt = weight.dtype.type
    if opt.clip_gradient is None:
        return lr * dt(opt.rescale_grad) * grad
    return lr * opt._rescaled(grad, weight)


class _WithMomentum(Optimizer):
    """An optimizer with an optional momentum state (none when ``momentum`` is 0)."""

    def __init__(self, momentum: float = 0.0, **kwargs: Any):
        super().__init__(**kwargs)
        self.momentum = float(momentum)
        self._params["momentum"] = momentum

    def create_state(self, index: Any, weight: Any) -> tuple:
        return (_zeros(weight),) if self.momentum != 0.0 else ()


class _Lazy:
    """MXNet's ``lazy_update`` option (default True): a row-sparse gradient
    updates only its rows. Kept in the config only when False, so the configs of
    optimizers made before it existed stay equal."""

    def _set_lazy(self, lazy_update: bool) -> None:
        self.lazy_update = bool(lazy_update)
        if not self.lazy_update:
            self._params["lazy_update"] = False

    @property
    def lazy(self) -> bool:
        return self.lazy_update


@register
class SGD(_Lazy, _WithMomentum):
    """SGD with optional momentum: ``mom = momentum*mom - lr*wd*w - lr*g``;
    ``w += mom`` (without momentum the same with ``mom = 0``), ``g`` the
    rescaled and clipped gradient. The momentum state holds MXNet's sign
    convention (it is the negative of the usual velocity). With a row-sparse
    gradient and ``lazy_update=True`` (MXNet's default) only its rows change."""

    def __init__(self, momentum: float = 0.0, lazy_update: bool = True, **kwargs: Any):
        super().__init__(momentum=momentum, **kwargs)
        self._set_lazy(lazy_update)

    def update(self, index: Any, weight: Any, grad: Any, state: tuple) -> None:
        self._update_count(index)
        dt = weight.dtype.type
        lr, wd = dt(self._get_lr(index)), dt(self._get_wd(index))
        step = _sgd_step(self, weight, grad, lr)
        if state:
            (mom,) = state
            mom[...] = dt(self.momentum) * mom - lr * wd * weight - step
            weight += mom
        else:
            weight += -(lr * wd) * weight - step


@register
class NAG(_WithMomentum):
    """Nesterov momentum, as MXNet 1.9.1 computes it: with ``g`` the rescaled,
    clipped gradient, ``m = momentum*m``;
    ``w' = w - m + (momentum+1)*(m - lr*(g + wd*w))``; ``m -= lr*(g + wd*w')``
    (MXNet's kernel reads the already updated weight for the state)."""

    def update(self, index: Any, weight: Any, grad: Any, state: tuple) -> None:
        self._update_count(index)
        dt = weight.dtype.type
        lr, wd = dt(self._get_lr(index)), dt(self._get_wd(index))
        if not state:
            weight[...] = (dt(1.0) - lr * wd) * weight - _sgd_step(self, weight, grad, lr)
            return
        (mom,) = state
        g = self._rescaled(grad, weight)
        m = dt(self.momentum)
        mom *= m
        weight[...] = weight - mom + (m + dt(1.0)) * (mom - lr * (g + wd * weight))
        mom -= lr * (g + wd * weight)


@register
class Adam(_Lazy, Optimizer):
    """Adam; the bias correction scales the rate by ``sqrt(1-beta2^t)/(1-beta1^t)``
    with ``t`` the key's update count. With a row-sparse gradient and
    ``lazy_update=True`` (MXNet's default) only its rows (and their states) change."""

    default_lr = 0.001

    def __init__(
        self,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        lazy_update: bool = True,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)
        self._params.update(beta1=beta1, beta2=beta2, epsilon=epsilon)
        self._set_lazy(lazy_update)

    def create_state(self, index: Any, weight: Any) -> tuple:
        return (_zeros(weight), _zeros(weight))

    def update(self, index: Any, weight: Any, grad: Any, state: tuple) -> None:
        t = self._update_count(index)
        xp, dt = array_module(weight), weight.dtype.type
        lr = self._get_lr(index)
        lr *= math.sqrt(1.0 - self.beta2**t) / (1.0 - self.beta1**t)
        g = self._rescaled(grad, weight, wd=self._get_wd(index))
        mean, var = state
        b1, b2 = dt(self.beta1), dt(self.beta2)
        mean[...] = b1 * mean + (dt(1.0) - b1) * g
        var[...] = b2 * var + (dt(1.0) - b2) * g * g
        weight[...] = weight - dt(lr) * mean / _plus_epsilon(xp.sqrt(var), self.epsilon)


@register
class AdaGrad(Optimizer):
    """AdaGrad: ``h += g*g``; ``w += -lr * (g/sqrt(h + eps) + wd*w)``. A row-sparse
    gradient updates only its rows (MXNet's sparse ``adagrad_update``, which
    refuses ``wd``; here ``wd`` applies to those rows)."""

    lazy = True

    def __init__(self, eps: float = 1e-7, **kwargs: Any):
        super().__init__(**kwargs)
        self.float_stable_eps = float(eps)
        self._params["eps"] = eps

    def create_state(self, index: Any, weight: Any) -> tuple:
        return (_zeros(weight),)

    def update(self, index: Any, weight: Any, grad: Any, state: tuple) -> None:
        self._update_count(index)
        xp, dt = array_module(weight), weight.dtype.type
        lr, wd = dt(self._get_lr(index)), dt(self._get_wd(index))
        g = self._rescaled(grad, weight)
        (history,) = state
        history += g * g
        div = g / xp.sqrt(_plus_epsilon(history, self.float_stable_eps))
        weight += (div + weight * wd) * -lr


@register
class RMSProp(Optimizer):
    """RMSProp (Tieleman & Hinton), or with ``centered=True`` Graves' variant."""

    default_lr = 0.001

    def __init__(
        self,
        gamma1: float = 0.9,
        gamma2: float = 0.9,
        epsilon: float = 1e-8,
        centered: bool = False,
        clip_weights: float | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.gamma1, self.gamma2, self.epsilon = float(gamma1), float(gamma2), float(epsilon)
        self.centered = bool(centered)
        self.clip_weights = clip_weights if clip_weights is None or clip_weights >= 0 else None
        self._params.update(
            gamma1=gamma1,
            gamma2=gamma2,
            epsilon=epsilon,
            centered=centered,
            clip_weights=clip_weights,
        )

    def create_state(self, index: Any, weight: Any) -> tuple:
        if self.centered:
            return (_zeros(weight), _zeros(weight), _zeros(weight))
        return (_zeros(weight),)

    def update(self, index: Any, weight: Any, grad: Any, state: tuple) -> None:
        self._update_count(index)
        xp, dt = array_module(weight), weight.dtype.type
        lr, g1 = dt(self._get_lr(index)), dt(self.gamma1)
        g = self._rescaled(grad, weight, wd=self._get_wd(index))
        n = state[0]
        n[...] = (dt(1.0) - g1) * g * g + g1 * n
        if self.centered:
            _, mean, delta = state
            mean[...] = (dt(1.0) - g1) * g + g1 * mean
            delta[...] = dt(self.gamma2) * delta - lr * g / xp.sqrt(
                _plus_epsilon(n - mean * mean, self.epsilon)
            )
            weight += delta
        else:
            weight[...] = weight - lr * (g / xp.sqrt(_plus_epsilon(n, self.epsilon)))
        if self.clip_weights is not None:
            c = dt(self.clip_weights)
            xp.clip(weight, -c, c, out=weight)


@register
class AdaDelta(Optimizer):
    """AdaDelta (no learning rate): running averages of squared gradients
    and squared steps with decay ``rho``."""

    def __init__(self, rho: float = 0.90, epsilon: float = 1e-5, **kwargs: Any):
        super().__init__(**kwargs)
        self.rho, self.epsilon = float(rho), float(epsilon)
        self._params.update(rho=rho, epsilon=epsilon)

    def create_state(self, index: Any, weight: Any) -> tuple:
        return (_zeros(weight), _zeros(weight))

    def update(self, index: Any, weight: Any, grad: Any, state: tuple) -> None:
        xp, dt = array_module(weight), weight.dtype.type
        wd = dt(self._get_wd(index))
        self._update_count(index)
        g = self._rescaled(grad, weight)
        acc_g, acc_delta = state
        rho, one_minus_rho, eps = dt(self.rho), dt(1.0 - self.rho), dt(self.epsilon)
        acc_g *= rho
        acc_g += one_minus_rho * g * g
        delta = xp.sqrt(acc_delta + eps) / xp.sqrt(acc_g + eps) * g
        acc_delta *= rho
        acc_delta += one_minus_rho * delta * delta
        weight -= delta + wd * weight


@register
class Signum(Optimizer):
    """Signum: ``mom = momentum*mom - (1-momentum)*(wd*w + g)``;
    ``w = (1 - lr*wd_lh)*w + lr*sign(mom)``. With ``momentum=0`` it is signSGD."""

    def __init__(self, momentum: float = 0.9, wd_lh: float = 0.0, **kwargs: Any):
        super().__init__(**kwargs)
        self.momentum, self.wd_lh = float(momentum), float(wd_lh)
        self._params.update(momentum=momentum, wd_lh=wd_lh)

    def create_state(self, index: Any, weight: Any) -> tuple:
        return (_zeros(weight),) if self.momentum != 0.0 else ()

    def update(self, index: Any, weight: Any, grad: Any, state: tuple) -> None:
        self._update_count(index)
        xp, dt = array_module(weight), weight.dtype.type
        lr, wd = dt(self._get_lr(index)), dt(self._get_wd(index))
        g = self._rescaled(grad, weight)
        if state:
            (mom,) = state
            m = dt(self.momentum)
            mom[...] = m * mom - (dt(1.0) - m) * wd * weight - (dt(1.0) - m) * g
            weight[...] = (dt(1.0) - lr * dt(self.wd_lh)) * weight + lr * xp.sign(mom)
        else:  # MXNet's signsgd_update takes the sign of the raw gradient
            weight[...] = (dt(1.0) - lr * wd) * weight - lr * xp.sign(grad)


@register
class SignSGD(Signum):
    """signSGD: ``w = (1 - lr*wd)*w - lr*sign(g)`` (Signum without momentum;
    MXNet has no registry name for it, ``Signum(momentum=0)`` is the same)."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("momentum", 0.0)
        super().__init__(**kwargs)
