"""The table of a server's remote methods (``labkv.cluster._protocol.methods``):
complete, and the one place the transport and a replicated link read a
method's properties from."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from labkv.cluster._protocol import methods
from labkv.cluster._protocol.messages import Pull, Push, PushHeader, decode_push, pack
from labkv.cluster._protocol.methods import METHODS, method
from labkv.cluster._server.actor import Server
from labkv.cluster._transport.base import _encoded


def _remote_methods() -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(fn)
        for name, fn in inspect.getmembers(Server, inspect.iscoroutinefunction)
        if not name.startswith("_")
    }


def test_the_table_names_every_remote_method_of_the_server_and_nothing_else():
    assert sorted(METHODS) == sorted(_remote_methods())
    assert all(row.name == name for name, row in METHODS.items())


def test_a_message_method_takes_one_message():
    for name, row in METHODS.items():
        if row.message:
            assert list(_remote_methods()[name].parameters) == ["self", "msg"], name


def test_the_acknowledged_methods_are_the_data_path_a_near_read_and_the_replay():
    assert {n for n, row in METHODS.items() if row.acknowledged} == {
        "push",
        "pull",
        "read",
        "replay",
    }
    # a message method's reply is acknowledged: a replicated link counts on it
    assert all(row.acknowledged for row in METHODS.values() if row.message)


def test_every_run_control_goes_to_every_replica_and_init_and_settings_to_the_primary():
    """init and the settings go to the primary alone, which logs them for its
    backups (a replica seeded before a rank hears of it still gets them)."""
    broadcast = {n for n, row in METHODS.items() if row.broadcast}
    assert broadcast == {
        "configure",
        "abort",
        "fence",  # a lost rank's old incarnation stays refused after a failover
        "link",
        "streaming",  # a backup streams the events of the near reads it answers
    }
    # every replica of server 0 holds the arrivals (a failover loses none); the
    # backups take them without being waited for
    assert {n: row.backups for n, row in METHODS.items() if row.backups} == {
        "barrier": "barrier_arrived"
    }
    assert not (broadcast & {"push", "pull", "promote", "replay", "members"})
    assert not (broadcast & {"init", "set_updater", "set_optimizer", "set_states"})


def test_only_methods_that_copy_what_they_keep_run_in_process():
    local = {n for n, row in METHODS.items() if row.local}
    assert local == {
        "push",
        "pull",
        "read",
        "keys",
        "wait_keys",
        "init",
        "barrier",
        "barrier_arrived",
        "resume_step",
    }


def test_only_message_arguments_are_encoded():
    header = PushHeader("s", 0, 1, ["w"], None, [], False, None)
    push = Push(header, pack([np.ones(2)]), [])
    (sent,) = _encoded("push", (push,))
    assert isinstance(sent, bytes) and decode_push(sent).header.seq == 1
    pull = Pull("s", 1, ["w"], None, None, None, ())
    assert isinstance(_encoded("pull", (pull,))[0], bytes)
    assert _encoded("peek", (["w"],)) == [["w"]]
    assert _encoded("promote", ((("a", "k"),),)) == [(("a", "k"),)]  # a tuple, left alone


def test_an_unknown_method_is_named():
    with pytest.raises(KeyError, match="no server method 'pushh'"):
        method("pushh")
    assert method("push") is METHODS["push"] and methods.method("peek").local is False
