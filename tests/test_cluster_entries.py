"""A replicated primary's log entries (``labkv.cluster._protocol.entries``): typed
notes on the wire as their tagged tuples, a note of the wrong shape refused at
decode, and what each note does on a replica (``replication.notes.NoteEffects``,
the one dispatch by type). No Dask, no event loop."""

from __future__ import annotations

import asyncio
import pickle

import numpy as np
import pytest

from labkv.cluster._errors import Failure
from labkv.cluster._protocol.entries import (
    Clock,
    Entry,
    Failed,
    Passed,
    Told,
    Vote,
    decode_entry,
    decode_note,
    encode_entry,
    encode_note,
)
from labkv.cluster._protocol.messages import KeyMeta
from labkv.cluster._protocol.packing import PACK_BELOW
from labkv.cluster._server.key_table import KeyTable
from labkv.cluster._server.replication.notes import NoteEffects
from labkv.cluster._server.rounds import SyncRounds
from labkv.cluster._server.ssp_clocks import Clocks
from labkv.cluster._server.updates import KeptVotes
from labkv.cluster._server.waiting import Barriers, Waiters

NOTES = [
    Failed(ValueError("no"), {"a": {"w": 3}}),
    Told("a", ["w", "b"]),
    Clock(2),
    Vote("w", 7, None, ("a", 1)),
]


@pytest.mark.parametrize("note", NOTES, ids=lambda n: type(n).__name__)
def test_a_note_travels_as_its_tagged_tuple_and_comes_back_typed(note):
    raw = encode_note(note)
    assert type(raw) is tuple and raw[1:] == tuple(note)
    assert raw[0] == {Failed: "failed", Told: "told", Clock: "clock", Vote: "vote"}[type(note)]
    got = decode_entry(encode_entry(3, [], [("a", "w", 3)], note)).note
    assert type(got) is type(note)
    assert repr(got) == repr(note)  # the exception inside compares by its text


def test_the_tags_are_the_tuples_backups_read_before_the_notes_had_types():
    assert encode_note(Clock(2)) == ("clock", 2)
    assert encode_note(Told("a", ["w"])) == ("told", "a", ["w"])
    assert encode_note(Vote("w", 1, None, None)) == ("vote", "w", 1, None, None)


@pytest.mark.parametrize("note", NOTES, ids=lambda n: type(n).__name__)
def test_a_note_of_another_arity_fails_at_decode_naming_its_fields(note):
    raw = encode_note(note)
    name = type(note).__name__
    with pytest.raises(TypeError, match=rf"a {name} note has {len(note)} fields"):
        decode_note((*raw, "extra"))
    with pytest.raises(TypeError, match=rf"a {name} note has {len(note)} fields"):
        decode_note(raw[:-1])


def test_a_note_with_an_unknown_tag_fails_at_decode():
    with pytest.raises(TypeError, match="note has a tag of"):
        decode_note(("promoted", 1))
    with pytest.raises(TypeError, match="note has a tag of"):
        decode_note(())


def test_an_entry_keeps_its_updates_in_order_with_big_values_as_their_own_frames():
    small, big = np.arange(3.0), np.arange(PACK_BELOW // 8, dtype=np.float64)
    updates = [("a", small), ("big", big), ("failed", None), ("c", small + 1)]
    index, blob, bigs = encode_entry(9, updates, [("s", "a", 4)], Clock(1))
    assert index == 9 and type(blob) is bytes and len(bigs) == 1 and bigs[0] is big
    entry = decode_entry(pickle.loads(pickle.dumps((index, blob, bigs))))
    assert isinstance(entry, Entry) and entry.index == 9 and entry.note == Clock(1)
    assert [k for k, _ in entry.updates] == ["a", "big", "failed", "c"]
    assert entry.updates[2][1] is None
    for (_, want), (_, got) in zip(updates, entry.updates, strict=True):
        if want is not None:
            np.testing.assert_array_equal(got, want)
    assert entry.pushes == [("s", "a", 4)]


def test_an_error_of_a_class_no_module_defines_travels_in_a_note():
    class Local(Exception):
        pass

    entry = decode_entry(encode_entry(0, [], [], Failed(Local("boom"), {})))
    assert type(entry.note.error).__name__ == "Local" and str(entry.note.error) == "boom"


# -- what each note does on a replica ----------------------------------------------------
def _replica(staleness=None):
    table = KeyTable(sid=1)
    for key in ("w", "b"):
        table.add(key, KeyMeta((2,), "float32", 0), whole=True)
    rounds = SyncRounds(num_workers=2)
    rounds.add("w"), rounds.add("b")
    kept = KeptVotes()
    clocks = None if staleness is None else Clocks(staleness, num_workers=2)
    barriers = Barriers(Waiters("server 1", 1.0))
    return NoteEffects(1, table, rounds, kept, clocks, barriers), rounds, kept, clocks


def test_a_passed_note_releases_a_barrier_whose_arrivals_this_replica_lacks():
    """A replica seeded after rank 0 entered the barrier sees only rank 1 arrive:
    the primary's Passed note releases it (and every generation before)."""
    effects, *_ = _replica()
    barriers = effects.barriers

    async def scenario():
        waiting = asyncio.ensure_future(barriers.enter("run", 1, (1, 0), parties=2))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        raw = decode_entry(encode_entry(7, [], [], Passed("run", (1, 0)))).note
        effects.apply(raw, [], [])
        await asyncio.wait_for(waiting, 1.0)
        return barriers.passed, barriers.arrived

    assert asyncio.run(scenario()) == ({"run": (1, 0)}, {})


def test_a_failed_note_is_the_failure_of_the_keys_the_entry_left_unchanged():
    effects, *_ = _replica()
    error = ValueError("too big")
    failure = effects.apply(Failed(error, {"r0": {"w": 5}}), [("w", None), ("b", 1.0)], [])
    assert isinstance(failure, Failure)
    assert (failure.error, failure.server, failure.keys) == (error, 1, ["w"])
    assert failure.untold == {"r0": {"w": 5}}


def test_a_told_note_crosses_the_failure_off_for_that_sender_only():
    effects, rounds, *_ = _replica()
    rounds["w"].finish(Failure(ValueError("x"), 1, ["w"], {"r0": {"w": 0}, "r1": {"w": 0}}))
    assert effects.apply(Told("r0", ["w"]), [], []) is None
    assert rounds["w"].report_to("r0") is None
    assert isinstance(rounds["w"].report_to("r1"), ValueError)


def test_a_clock_note_advances_the_pushing_ranks_clocks_of_known_keys():
    effects, _, _, clocks = _replica(staleness=1)
    effects.apply(Clock(1), [], [("r1", "w", 0), ("r1", "gone", 0)])
    assert clocks.of("w") == {0: 0, 1: 1} and "gone" not in clocks.clocks
    assert clocks.ranks == {"r1": 1}


def test_a_vote_note_is_kept_for_the_last_two_updates_of_its_key():
    effects, _, kept, _ = _replica()
    for number in range(4):
        effects.apply(Vote("w", number, None, ("s", number)), [], [])
    assert sorted(v.number for v in kept) == [2, 3]
    assert kept.placed("w") == {2: ("s", 2), 3: ("s", 3)}


def test_an_entry_without_a_note_changes_nothing():
    effects, rounds, kept, _ = _replica()
    assert effects.apply(None, [("w", 1.0)], [("s", "w", 0)]) is None
    assert list(kept) == [] and rounds["w"].done == 0
