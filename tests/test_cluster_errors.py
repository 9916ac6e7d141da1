"""The cluster's errors (``labkv.cluster._errors``): its own as types, a server's
answer and a failed update as tags that travel inside the user's exception."""

from __future__ import annotations

import asyncio
import pickle

import cloudpickle
import pytest

from labkv.cluster import _errors
from labkv.cluster._errors import (
    CallTimedOut,
    ClusterError,
    Deposed,
    ServerLost,
    answered,
    answered_by,
    deposed,
    failed_update,
    is_deposed,
    is_lost,
    mark_answer,
    mark_failed_update,
)


def _travel(exc: BaseException) -> BaseException:
    """``exc`` as Dask hands it over: cloudpickled, then unpickled."""
    return pickle.loads(cloudpickle.dumps(exc))


def test_the_clusters_own_errors_are_cluster_errors_of_their_own_types():
    for kind in (ServerLost, CallTimedOut, Deposed):
        assert issubclass(kind, ClusterError)
    assert not issubclass(ServerLost, CallTimedOut) and not issubclass(CallTimedOut, ServerLost)
    assert isinstance(_travel(ServerLost("server 1 is lost")), ServerLost)


def test_a_servers_answer_keeps_its_type_and_its_tag_travels():
    error = mark_answer(ValueError("the updater raised"), 3)
    assert answered_by(error) == 3 and answered_by(ValueError("not a server's")) is None
    back = _travel(error)
    assert type(back) is ValueError and str(back) == "the updater raised"
    assert answered_by(back) == 3


def test_a_failed_update_names_its_server_and_the_senders_pushes():
    error = mark_failed_update(ValueError("too big"), 1, {"w": 4, "b": 2})
    back = _travel(error)
    assert failed_update(back) == (1, {"w": 4, "b": 2})
    assert failed_update(back).server == 1 and failed_update(back).seqs == {"w": 4, "b": 2}
    assert failed_update(ValueError("plain")) is None
    assert type(back) is ValueError


def test_a_failed_update_tagged_by_a_server_of_this_version_is_read():
    # the server's own tag (labkv.cluster._server.rounds.Failure.report_to) is read as is
    from labkv.cluster._errors import Failure

    failure = Failure(KeyError("missing"), 2, ["w"], {"rank-a": {"w": 7}})
    assert failed_update(failure.report_to("rank-a")) == (2, {"w": 7})


def test_answered_marks_every_exception_of_a_server_method():
    class Server:
        sid = 5

        @answered
        async def push(self, fail):
            if fail:
                raise OSError("a user's OSError")
            return "ok"

    assert asyncio.run(Server().push(False)) == "ok"
    with pytest.raises(OSError) as raised:
        asyncio.run(Server().push(True))
    assert answered_by(raised.value) == 5
    assert not is_lost(raised.value)  # a server's own OSError is its answer, not a loss


def test_what_says_a_server_is_lost():
    assert is_lost(ServerLost("gone")) and is_lost(OSError("connection refused"))
    assert not is_lost(ClusterError("a timeout")) and not is_lost(CallTimedOut("late"))
    assert not is_lost(mark_answer(ServerLost("relayed by a server"), 0))


def test_a_deposing_answer_is_its_own_type_across_the_wire():
    error = deposed("server-0-1 is the primary now")
    assert isinstance(error, Deposed) and is_deposed(error)
    assert is_deposed(_travel(mark_answer(error, 0)))
    assert not is_deposed(ClusterError("x")) and not is_deposed(None)
    assert not is_deposed(RuntimeError("Deposed"))  # the type says it, not the text


def test_no_module_but_errors_reads_a_tag_and_lost_and_timeout_are_types():
    import re
    from pathlib import Path

    cluster = Path(_errors.__file__).parent
    readers, old_tags = [], []
    for path in cluster.rglob("*.py"):
        text = path.read_text()
        if path.name != "_errors.py" and re.search(r"(getattr|hasattr)\([^)]*_labkv_", text):
            readers.append(path.name)
        if re.search(r"_labkv_(lost|timeout)\b", text):
            old_tags.append(path.name)
    assert readers == [] and old_tags == []
