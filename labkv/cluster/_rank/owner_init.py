"""A rank's ``init`` on the servers: the owner's (rank 0, or the notebook when it
shares its store with a run) sends every key's pieces; any other rank waits
until the owner's keys exist where it placed them, and checks that the owner
gave the same shapes, dtypes and ids (:func:`~.split.check_same_init`). Rank 0
of a run on the notebook's store sends the keys the notebook has not
initialised and checks the others (:func:`heir_init`)."""

from __future__ import annotations

import uuid
from collections import defaultdict
from typing import Any

from .._errors import ClusterError
from .._protocol.messages import InitItem
from .._rows.rank import init_pieces
from . import split
from .calls import Calls

Items = list[tuple[Any, Any]]


def send_init(calls: Calls, items: Items, ids: dict, placed: dict) -> None:
    """The owner's init of ``items`` (``ids``: each key's id, ``placed``: its
    pieces), every server its pieces, waited for. The call's id lets a replica
    take it once when it is made again after a failover (a primary lost under
    it may have passed it to its backup)."""
    per_server: dict[int, list] = defaultdict(list)
    for key, array in items:
        rows = init_pieces(array, placed[key])  # a row-sparse value: each server's rows
        parts = rows or split.split(split.host(array), placed[key])
        shape, dtype = tuple(array.shape), array.dtype.str
        for s, piece in parts:
            per_server[s].append(InitItem(key, piece, shape, dtype, ids[key], rows is not None))
    call_id = (calls.sender, uuid.uuid4().hex)
    sent = calls.call_each("init", {s: (b, call_id) for s, b in per_server.items()})
    calls.wait(sent, "init")


def heir_init(calls: Calls, items: Items, ids: dict, placed: dict) -> None:
    """The init of a rank that initialises only the keys not there yet: the
    owner's replacement (rank 0 replaced mid-run, replaying its function; its
    lost incarnation's keys are there) and rank 0 of a run on the notebook's
    store (the notebook's are). The keys there are checked as a non-owner's
    are, the others initialised as the owner's."""
    found: dict[Any, Any] = {}
    for metas in calls.all("keys", [k for k, _ in items]):
        found.update(metas)
    missing = [(k, a) for k, a in items if k not in found]
    if missing:
        send_init(calls, missing, ids, placed)
    present = [(k, a) for k, a in items if k in found]
    if present:
        wait_for_owner(calls, present, ids, placed)


def wait_for_owner(calls: Calls, items: Items, ids: dict, placed: dict) -> None:
    """A non-owner's init: wait until the owner has initialised ``items``
    where this rank placed them, and check it gave the same shapes, dtypes
    and ids. A str key the owner numbered otherwise lives elsewhere: every
    server is asked first (the owner may have initialised it already) and
    after a wait that timed out, so that the error says why."""
    named = [k for k, _ in items if isinstance(k, str)]
    if named:
        check_owner_ids(calls, named, items, ids)
    per_server: dict[int, list] = defaultdict(list)
    for key, _ in items:
        for p in placed[key]:
            per_server[p.server].append(key)
    waits = [(s, calls.call(s, "wait_keys", keys)) for s, keys in per_server.items()]
    try:
        found = calls.wait(waits, "init (waiting for rank 0)")
    except ClusterError:
        mismatch = _mismatch(calls, named, items, ids) if named else None
        if mismatch is None:
            raise
        raise mismatch from None
    for meta in found:
        split.check_same_init(meta, items, ids)


def check_owner_ids(calls: Calls, keys: list, items: Items, ids: dict) -> None:
    """Refuse ``keys`` that the owner has initialised differently (any server)."""
    found: dict[Any, Any] = {}
    for metas in calls.all("keys", keys):
        found.update(metas)
    split.check_same_init(found, items, ids)  # the first key of items named


def _mismatch(calls: Calls, keys: list, items: Items, ids: dict) -> ValueError | None:
    """After a wait for ``keys`` timed out: the error of the owner's other
    init of one of them, the real cause (None when there is none to see)."""
    try:
        check_owner_ids(calls, keys, items, ids)
    except ValueError as exc:
        return exc
    except ClusterError:
        pass  # the servers cannot say: the timeout stands
    return None


def uninitialised(key: Any, rank: int) -> str:
    """The error of a rank of a run that uses ``key`` before any init of it
    reached the servers.

    >>> print(uninitialised("w", 1))
    rank 1 uses key 'w', which is not initialised on the servers yet: call kv.init('w', value) on every rank (rank 0's value is used; on the notebook's store, the notebook's when it initialised the key before run), or only on rank 0 followed by kv.barrier() on every rank before the key is used
    """
    return (
        f"rank {rank} uses key {key!r}, which is not initialised on the servers yet: "
        f"call kv.init({key!r}, value) on every rank (rank 0's value is used; on the "
        "notebook's store, the notebook's when it initialised the key before run), or only "
        "on rank 0 followed by kv.barrier() on every rank before the key is used"
    )
