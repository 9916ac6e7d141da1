"""A frame's body is what Dask's ``pickle.dumps`` would make of the value.

``sockets.pickled`` takes the standard pickle's body without Dask's look-up of
the value's module; these check that it still makes the same bytes (and
buffers) as Dask's function for the values a stream carries, for what only
cloudpickle can send, for a value naming ``__main__`` and while a module is
registered to go by value."""

from __future__ import annotations

import sys
import types

import cloudpickle
import numpy as np
import pytest
from distributed.protocol import pickle as dask_pickle

from labkv.cluster._errors import portable
from labkv.cluster._transport.sockets import pickled, unpickled


def _dask(value):
    buffers = []
    body = dask_pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    return body, [bytes(b.raw()) for b in buffers]


def _ours(value):
    body, raws = pickled(value)
    return body, [bytes(r) for r in raws]


class _Mainly:
    """A class as a notebook defines it: in ``__main__``."""

    def __init__(self, x):
        self.x = x


_Mainly.__module__ = "__main__"


def _in_main(monkeypatch):
    main = types.ModuleType("__main__")
    main._Mainly = _Mainly
    monkeypatch.setitem(sys.modules, "__main__", main)


VALUES = {
    "request": ("server-0-abc", "pull", [[0, 1], 3]),
    "arrays": ("server-1", "push", [np.arange(12, dtype=np.float32).reshape(3, 4), np.ones(2)]),
    "reply": {"w": np.zeros(5), "b": None, 3: (1.5, "x")},
    "error": portable(ValueError("the updater refused key 'w'")),
    "lambda": lambda x: x + 1,
}


@pytest.mark.parametrize("name", list(VALUES))
def test_a_frame_body_is_what_dasks_pickle_makes(name):
    value = VALUES[name]
    assert _ours(value) == _dask(value)


def test_a_value_naming_main_goes_by_value_as_dask_sends_it(monkeypatch):
    _in_main(monkeypatch)
    value = ("server-0", "set_updater", [_Mainly(3)])
    body, raws = _ours(value)
    assert (body, raws) == _dask(value)
    monkeypatch.delitem(sys.modules, "__main__")  # the far end has no such class
    assert unpickled(body, [])[2][0].x == 3


def test_a_module_registered_by_value_is_pickled_as_dask_does(monkeypatch):
    module = types.ModuleType("labkv_test_by_value")
    exec("def double(x):\n    return 2 * x\n", module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    cloudpickle.register_pickle_by_value(module)
    try:
        assert _ours(module.double) == _dask(module.double)
        body, _ = _ours(module.double)
    finally:
        cloudpickle.unregister_pickle_by_value(module)
    monkeypatch.delitem(sys.modules, module.__name__)  # the far end lacks the module
    assert unpickled(body, [])(4) == 8


def test_a_frame_round_trips_its_arrays_out_of_band():
    value = VALUES["arrays"]
    body, raws = pickled(value)
    assert [r.nbytes for r in raws] == [48, 16]
    got = unpickled(body, [np.frombuffer(bytes(r), np.uint8) for r in raws])
    np.testing.assert_array_equal(got[2][0], value[2][0])
    np.testing.assert_array_equal(got[2][1], value[2][1])
