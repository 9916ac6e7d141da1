"""A replicated primary's log entries, as they travel to its backups, with their typed notes.

An entry is ``(index, updates, pushes, note)`` (:class:`Entry`): the ``index``-th
update of the primary's log, the merged value of each updated key (None: that
key's update failed, nothing to apply), the ``(sender, key, seq)`` of the pushes
it holds, and a note saying what else it means to a backup:

- :class:`Failed`: a dist_sync round's (or a sliced update's) update failed, and
  the error is still owed to some senders;
- :class:`Told`: the primary told a sender of the earliest failure of some keys;
- :class:`Clock`: a dist_ssp push, which advances its rank's clocks;
- :class:`Vote`: this server's vote on a sliced key's update, sent to the other
  servers once every backup has it;
- :class:`Passed`: a barrier generation passed on the primary (server 0);
- :class:`Control`: a rank's ``init``, updater, optimizer or optimizer states,
  taken by the primary, for every backup to take too (a rank calls only the
  primary for these: a replica seeded before the rank hears of it still gets them).

On the wire a note is its plain tuple behind a tag (``("clock", 2)``, the same
tuples as before the notes had types), cloudpickled (an updater's error may be
of a class defined in a notebook); :func:`decode_note` checks the tag and the
arity, as :func:`~labkv.cluster._protocol.messages.decode_push` does for
messages. What travels for an entry is ``(index, blob, bigs)``
(:func:`encode_entry`), the layout :mod:`labkv.cluster._transport` relies on.

>>> raw = encode_note(Clock(rank=2))
>>> raw, decode_note(raw)
(('clock', 2), Clock(rank=2))
>>> decode_note(("clock", 2, 3))
Traceback (most recent call last):
...
TypeError: a Clock note has 1 fields ('rank',), got 2: ('clock', 2, 3)
"""

from __future__ import annotations

import pickle
from typing import Any, NamedTuple

import cloudpickle

from ..._types import Key
from .packing import PACK_BELOW


class Failed(NamedTuple):
    """The entry's keys whose value is None failed to update with ``error``,
    still owed to ``owed`` (sender -> {key: seq of the push it failed})."""

    error: BaseException
    owed: dict[str, dict]


class Told(NamedTuple):
    """``sender`` was told of the earliest failed update of each of ``keys``."""

    sender: str
    keys: list


class Clock(NamedTuple):
    """A dist_ssp push of rank ``rank``: its clocks of the entry's keys advance."""

    rank: int


class Vote(NamedTuple):
    """This server's outcome of its slice of update ``number`` of ``key``
    (``error`` None: it succeeded); from server 0 in dist_async, also which
    push ``(sender, n)`` that update is."""

    key: Key
    number: int
    error: BaseException | None
    push: tuple | None


class Passed(NamedTuple):
    """Barrier ``generation`` of run ``group`` passed on the primary: a replica
    that has not seen every arrival (seeded after some) releases its waiters too."""

    group: str
    generation: Any


class Control(NamedTuple):
    """The server method ``method`` (``init``, ``set_updater``, ``set_optimizer``
    or ``set_states``) took ``args`` on the primary: each backup does the same."""

    method: str
    args: tuple


Note = Failed | Told | Clock | Vote | Passed | Control

_TAGS: dict[type, str] = {
    Failed: "failed",
    Told: "told",
    Clock: "clock",
    Vote: "vote",
    Passed: "passed",
    Control: "control",
}
_BY_TAG: dict[str, type] = {tag: cls for cls, tag in _TAGS.items()}


def encode_note(note: Note) -> tuple:
    """The plain tuple of ``note``, its tag first."""
    return (_TAGS[type(note)], *note)


def decode_note(raw: tuple) -> Note:
    """The note :func:`encode_note` made; a tag or an arity of another version fails here."""
    cls = _BY_TAG.get(raw[0]) if raw else None
    if cls is None:
        raise TypeError(f"a log entry's note has a tag of {sorted(_BY_TAG)}, got {raw!r:.200}")
    if len(raw) - 1 != len(cls._fields):
        raise TypeError(
            f"a {cls.__name__} note has {len(cls._fields)} fields {cls._fields}, "
            f"got {len(raw) - 1}: {raw!r:.200}"
        )
    return cls._make(raw[1:])


class Entry(NamedTuple):
    """A log entry as a backup reads it (see module doc)."""

    index: int
    updates: list[tuple[Key, Any]]
    pushes: list[tuple[str, Key, int]]
    note: Note | None
    # (key, rank, step, number, digest) each: _server.replication.step_marks
    marks: tuple | list = ()


def encode_entry(
    index: int,
    updates: list[tuple[Key, Any]],
    pushes: list[tuple],
    note: Note | None = None,
    marks: list[tuple] | None = None,
) -> tuple:
    """A log entry as it travels: ``(index, blob, bigs)``, the pushes, the note
    and the values under ``PACK_BELOW`` bytes pickled into one ``bytes`` (Dask
    would serialise a list of 200 small arrays one by one), the big values as
    their own frames."""
    big = [i for i, (_, v) in enumerate(updates) if _big(v)]
    small = [u for i, u in enumerate(updates) if i not in big]
    noted = None if note is None else cloudpickle.dumps(encode_note(note))
    big_keys = [updates[i][0] for i in big]
    blob = pickle.dumps((small, big, big_keys, pushes, noted, marks or []), protocol=5)
    return index, blob, [updates[i][1] for i in big]


def _big(value: Any) -> bool:
    """A value that travels as its own frame: an array of ``PACK_BELOW`` bytes or
    more (a row-sparse one, its rows and their numbers, is pickled with the entry)."""
    if value is None or getattr(value, "stype", None) == "row_sparse":
        return False
    return value.nbytes >= PACK_BELOW


def decode_entry(entry: tuple) -> Entry:
    """The :class:`Entry` of :func:`encode_entry`, updates in their order (an
    optimizer's update count, read by its schedule, follows that order).

    >>> import numpy as np
    >>> entry = encode_entry(4, [("a", np.ones(2)), ("b", np.zeros(1 << 14))], [("s", "a", 0)])
    >>> len(entry[2])  # the big value travels as its own frame
    1
    >>> got = decode_entry(entry)
    >>> got.index, [k for k, _ in got.updates], got.pushes, got.note
    (4, ['a', 'b'], [('s', 'a', 0)], None)
    >>> decode_entry(encode_entry(5, [], [], Told("s", ["a"]))).note
    Told(sender='s', keys=['a'])
    """
    index, blob, bigs = entry
    small, big, big_keys, pushes, noted, marks = pickle.loads(blob)
    updates, smalls = [], iter(small)
    placed = dict(zip(big, zip(big_keys, bigs, strict=True), strict=True))
    for i in range(len(small) + len(big)):
        updates.append(placed[i] if i in placed else next(smalls))
    note = None if noted is None else decode_note(pickle.loads(noted))
    return Entry(index, updates, pushes, note, marks)
