"""What every optimizer of :mod:`labkv.optimizers` shares: the :class:`Optimizer`
base class (learning rate or scheduler, weight decay, per-key multipliers of
both, gradient rescaling and clipping, per-key update counts, config round
trip), the registry of names
(:func:`register`, :func:`create`), and the helpers the update formulas use.
The public names are imported from :mod:`labkv.optimizers`."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from .. import lr_scheduler as _lr
from ..devices import array_module, device_of, to_device
from ..sparse._row_ops import cast, put_rows, take_rows

_REGISTRY: dict[str, type[Optimizer]] = {}


def register(cls: type[Optimizer]) -> type[Optimizer]:
    """Class decorator: make ``create(cls.__name__.lower())`` build ``cls``."""
    _REGISTRY[cls.__name__.lower()] = cls
    return cls


class Optimizer:
    """Base class: learning rate (or scheduler), weight decay, their per-key
    multipliers (:meth:`set_lr_mult`, :meth:`set_wd_mult`), gradient rescaling
    and clipping, and per-key update counts."""

    default_lr = 0.01

    def __new__(cls, *args: Any, **kwargs: Any) -> Optimizer:
        if args:  # MXNet's positional order: learning_rate is a keyword, never first
            _check_positional(cls, args, kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        learning_rate: float | None = None,
        wd: float = 0.0,
        rescale_grad: float = 1.0,
        clip_gradient: float | None = None,
        lr_scheduler: _lr.LRScheduler | None = None,
        begin_num_update: int = 0,
    ):
        self.lr = self.default_lr if learning_rate is None else float(learning_rate)
        self.wd = float(wd)
        self.rescale_grad = float(rescale_grad)
        if clip_gradient is not None and clip_gradient < 0:
            clip_gradient = None  # MXNet: a negative bound means no clipping
        self.clip_gradient = clip_gradient
        self.lr_scheduler = lr_scheduler
        if lr_scheduler is not None and learning_rate is not None:
            lr_scheduler.base_lr = self.lr  # as MXNet: a rate given to the optimizer wins
        self.begin_num_update = begin_num_update
        self.num_update = begin_num_update
        self.index_update_count: dict[Any, int] = {}
        self.lr_mult: dict[Any, float] = {}
        self.wd_mult: dict[Any, float] = {}
        self._params: dict[str, Any] = {
            "learning_rate": learning_rate,
            "wd": wd,
            "rescale_grad": rescale_grad,
            "clip_gradient": clip_gradient,
            "begin_num_update": begin_num_update,
        }

    @property
    def name(self) -> str:
        return type(self).__name__.lower()

    @property
    def learning_rate(self) -> float:
        """The rate the next update would use (before per-step adjustments)."""
        return self.lr_scheduler(self.num_update) if self.lr_scheduler else self.lr

    def _update_count(self, index: Any) -> int:
        count = self.index_update_count.get(index, self.begin_num_update) + 1
        self.index_update_count[index] = count
        self.num_update = max(count, self.num_update)
        return count

    def set_lr_mult(self, args_lr_mult: dict[Any, float]) -> None:
        """Scale the learning rate of each key of ``args_lr_mult`` by its value
        (others keep 1); replaces the multipliers set before, as MXNet's does.
        A key is the store's key, as the servers pass it to :meth:`update`.
        MXNet also reads multipliers from a symbol's attributes and zeroes
        weight decay by parameter name (``param_idx2name``); labkv has neither.

        >>> opt = create("sgd", learning_rate=0.5)
        >>> opt.set_lr_mult({"bias": 0.1})
        >>> opt._get_lr("bias"), opt._get_lr("weight")
        (0.05, 0.5)
        """
        self.lr_mult = _multipliers(args_lr_mult, "set_lr_mult")

    def set_wd_mult(self, args_wd_mult: dict[Any, float]) -> None:
        """Scale the weight decay of each key of ``args_wd_mult`` by its value
        (others keep 1), replacing the multipliers set before; see :meth:`set_lr_mult`.

        >>> opt = create("sgd", wd=0.01)
        >>> opt.set_wd_mult({"bias": 0.0})
        >>> opt._get_wd("bias"), opt._get_wd("weight")
        (0.0, 0.01)
        """
        self.wd_mult = _multipliers(args_wd_mult, "set_wd_mult")

    def _get_lr(self, index: Any) -> float:
        lr = self.lr_scheduler(self.num_update) if self.lr_scheduler else self.lr
        return lr * self.lr_mult[index] if index in self.lr_mult else lr

    def _get_wd(self, index: Any) -> float:
        return self.wd * self.wd_mult[index] if index in self.wd_mult else self.wd

    def create_state(self, index: Any, weight: Any) -> tuple:
        """The state arrays for one key (an empty tuple when none are needed)."""
        return ()

    def update(self, index: Any, weight: Any, grad: Any, state: tuple) -> None:
        """One step for key ``index``: change ``weight`` (and ``state``) in place.
        ``grad`` may be used as scratch space."""
        raise NotImplementedError

    @property
    def lazy(self) -> bool:
        """Whether a row-sparse gradient updates only its rows (MXNet's lazy update:
        SGD and Adam with ``lazy_update=True``, their default, and AdaGrad)."""
        return False

    def update_rows(self, index: Any, weight: Any, grad: Any, state: tuple) -> None:
        """One step with a row-sparse gradient ``grad`` (a
        :class:`~labkv.sparse.RowSparseArray`) for the dense ``weight``. Lazy
        (:attr:`lazy`): only the rows ``grad`` holds change, weight decay and
        momentum included, with the formula of :meth:`update` on those rows; else
        every row, as for the dense gradient.

        >>> import numpy as np, labkv.sparse as sparse
        >>> opt = create("sgd", learning_rate=1.0, wd=0.5)
        >>> w = np.ones((3, 1), np.float32)
        >>> opt.update_rows(0, w, sparse.row_sparse_array(([[1.0]], [1]), shape=(3, 1)), ())
        >>> w.ravel()
        array([ 1. , -0.5,  1. ], dtype=float32)
        """
        device = device_of(weight)
        data = to_device(grad.data, device, copy=False)
        if data.dtype != weight.dtype:
            data = cast(data, weight.dtype)
        if not self.lazy:
            dense = array_module(weight).zeros_like(weight)
            put_rows(dense, grad.indices, data)
            self.update(index, weight, dense, state)
            return
        rows = grad.indices
        part = take_rows(weight, rows)
        part_state = tuple(take_rows(s, rows) for s in state)
        self.update(index, part, data, part_state)
        put_rows(weight, rows, part)
        for whole, changed in zip(state, part_state, strict=True):
            put_rows(whole, rows, changed)

    def _rescaled(
        self, grad: Any, weight: Any, wd: float | None = None, clip_after_wd: bool = True
    ) -> Any:
        """MXNet's gradient preprocessing: ``rescale_grad * grad``, clipped, with
        ``wd * weight`` added (``wd`` given: the key's, from :meth:`_get_wd`)
        before or after the clip (per optimizer)."""
        xp, dt = array_module(weight), weight.dtype.type
        g = dt(self.rescale_grad) * grad
        if wd is not None and clip_after_wd:
            g = g + dt(wd) * weight
        if self.clip_gradient is not None:
            c = dt(self.clip_gradient)
            g = xp.clip(g, -c, c)
        if wd is not None and not clip_after_wd:
            g = g + dt(wd) * weight
        return g

    def to_config(self) -> dict[str, Any]:
        """Name, hyper-parameters and scheduler as JSON-able data (no code).
        Multipliers, where set, are in ``params`` as ``[key, value]`` pairs in
        key order (ints first), so that equal optimizers have equal configs;
        pairs, as JSON keeps an int key an int there, not in an object's names.

        >>> opt = create("sgd")
        >>> opt.set_wd_mult({"w": 0.0, 3: 2})
        >>> opt.to_config()["params"]["wd_mult"]
        [[3, 2.0], ['w', 0.0]]
        """
        params = dict(self._params)
        for option, mult in (("lr_mult", self.lr_mult), ("wd_mult", self.wd_mult)):
            if mult:
                params[option] = [[k, v] for k, v in mult.items()]
        return {
            "name": self.name,
            "params": params,
            "lr_scheduler": self.lr_scheduler.to_config() if self.lr_scheduler else None,
        }

    @staticmethod
    def from_config(config: dict[str, Any]) -> Optimizer:
        """Rebuild an optimizer from :meth:`to_config` output."""
        params = dict(config.get("params") or {})
        lr_mult, wd_mult = params.pop("lr_mult", None), params.pop("wd_mult", None)
        sched = config.get("lr_scheduler")
        if sched:
            params["lr_scheduler"] = _lr.create(sched["name"], sched.get("params"))
        optimizer = create(config["name"], **params)
        optimizer.set_lr_mult(dict(lr_mult or ()))
        optimizer.set_wd_mult(dict(wd_mult or ()))
        return optimizer

    def __repr__(self) -> str:
        shown = [f"{k}={v!r}" for k, v in self._params.items() if v is not None]
        shown += [
            f"{k}={v!r}" for k, v in (("lr_mult", self.lr_mult), ("wd_mult", self.wd_mult)) if v
        ]
        return f"{type(self).__name__}({', '.join(shown)})"


def _check_positional(cls: type, args: tuple, kwargs: dict[str, Any]) -> None:
    """Refuse a call that does not bind to ``cls``'s MXNet signature, saying
    that ``learning_rate`` is a keyword (``SGD(0.1, momentum=0.9)`` would
    otherwise say only "multiple values for argument 'momentum'").

    >>> from labkv.optimizers import SGD
    >>> SGD(0.1, momentum=0.9)
    Traceback (most recent call last):
    ...
    TypeError: SGD(momentum=0.0, lazy_update=True, **kwargs): multiple values for argument 'momentum' (its positional arguments are MXNet's: momentum, lazy_update); learning_rate is a keyword: SGD(learning_rate=0.1, momentum=0.9)
    """
    signature = inspect.signature(cls.__init__)
    try:
        signature.bind(None, *args, **kwargs)
    except TypeError as exc:
        params = list(signature.parameters.values())[1:]
        shown = ", ".join(
            f"**{p.name}" if p.kind == p.VAR_KEYWORD else f"{p.name}={p.default!r}" for p in params
        )
        positional = [p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
        order = (
            f"its positional arguments are MXNet's: {', '.join(positional)}"
            if positional
            else "it takes keywords only"
        )
        hint = f"{cls.__name__}({shown}): {exc} ({order})"
        if "learning_rate" not in kwargs and "learning_rate" not in positional:
            hint += "; learning_rate is a keyword"
            if len(args) == 1:
                given = "".join(f", {k}={v!r}" for k, v in kwargs.items())
                hint += f": {cls.__name__}(learning_rate={args[0]!r}{given})"
        raise TypeError(hint) from None


def _multipliers(given: dict[Any, float], method: str) -> dict[Any, float]:
    """``given`` checked (int or str keys, the store's kinds), with float values, in key order."""
    if not isinstance(given, dict):
        raise TypeError(f"{method} takes a dict of key to multiplier, got {type(given).__name__}")
    for key in given:
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise TypeError(f"{method}: key {key!r} is not an int or a str (a store's key)")
    checked = {k: float(v) for k, v in given.items()}
    return {k: checked[k] for k in sorted(checked, key=lambda k: (isinstance(k, str), k))}


def _zeros(weight: Any) -> Any:
    return array_module(weight).zeros_like(weight)


def _plus_epsilon(x: Any, value: float) -> Any:
    """``x + value`` in ``x``'s dtype, or in float32 where that dtype rounds ``value``
    to 0 (``1e-8`` is 0 in float16: a step would divide by ``sqrt(0) + 0``). ``x`` is
    cast, not only the epsilon: CuPy types a float scalar beside a float16 array by its
    value, as float16, so a float32 epsilon added alone would still be 0 there.

    >>> _plus_epsilon(np.zeros(1, np.float16), 1e-8).dtype
    dtype('float32')
    """
    eps = x.dtype.type(value)
    if eps != 0 or value == 0:
        return x + eps
    return x.astype(np.float32) + np.float32(value)


def create(name: str, **params: Any) -> Optimizer:
    """An optimizer by (case-insensitive) name, e.g. ``create('adam', learning_rate=0.01)``.

    >>> create("SGD", learning_rate=0.5)
    SGD(learning_rate=0.5, wd=0.0, rescale_grad=1.0, begin_num_update=0, momentum=0.0)
    """
    try:
        cls = _REGISTRY[name.lower()]
    except KeyError:
        raise ValueError(f"unknown optimizer {name!r}; known: {sorted(_REGISTRY)}") from None
    return cls(**params)
