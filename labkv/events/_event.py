"""An :class:`Event` (one thing a store did) and the readers of a record that
holds many: one ``round`` event per key of a server's round record
(:func:`round_rows`, :func:`per_key`), the keys of a counted-calls record
(:func:`compact_rows`). The bus (:mod:`labkv.events`) and the trace
(:mod:`._trace`) both read records with them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any

from .._types import Key
from ._round_records import mask_ranks

__all__ = ["COMPACT_AT", "Event", "compact_rows", "per_key", "round_extra", "round_rows"]


@dataclass(slots=True)
class Event:
    """One thing the store did.

    ``op`` is one of ``init``, ``push``, ``pull``, ``update`` (a custom
    updater call), ``optimizer`` (an optimizer step), ``barrier``, or a
    cluster op (``round``, ``server``, ``clock``: a dist_ssp pull's view of
    the ranks' clocks of a key and how long it waited). ``devices`` names where the values
    came from (push) or went to (pull); ``summary`` holds ``min/max/mean/norm``
    of the value the event is about; ``before``/``after`` the stored value's
    summary around an update.
    """

    seq: int
    time: float
    store: str
    op: str
    key: Key | None
    rank: int = 0
    devices: tuple[str, ...] = ()
    shape: tuple[int, ...] = ()
    dtype: str = ""
    nbytes: int = 0
    summary: dict[str, float] | None = None
    before: dict[str, float] | None = None
    after: dict[str, float] | None = None
    server: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    count: int = 1
    tally: bool = False
    first_piece: bool = True

    def to_dict(self) -> dict[str, Any]:
        """The event as plain Python data (JSON-able), e.g. to send it between processes.
        Its dicts are copied one level deep: their values are plain numbers and
        strings (``dataclasses.asdict``, which copies recursively, cost a third
        of a watched cluster server's event work).

        >>> Event(0, 0.0, "s", "push", "w", summary={"min": 1.0}).to_dict()["summary"]
        {'min': 1.0}
        """
        data = {name: getattr(self, name) for name in _FIELDS}
        for name in ("summary", "before", "after", "extra"):
            if data[name] is not None:
                data[name] = dict(data[name])
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event:
        """Rebuild an event from :meth:`to_dict` output."""
        data = dict(data)
        data["devices"] = tuple(data.get("devices", ()))
        data["shape"] = tuple(data.get("shape", ()))
        return cls(**data)


_FIELDS = tuple(f.name for f in fields(Event))

#: a flush sends the counted calls of more keys than this, of one op and process,
#: as one record (an event with ``key`` None, ``tally`` True and the keys in ``extra``)
COMPACT_AT = 8


def round_rows(event: Event) -> list[tuple[Key, dict[str, Any]]]:
    """``(key, extra)`` of each dist_sync round a ``round`` event reports: a
    server's record of many keys' rounds (``key`` None, ``extra["round_columns"]``
    as :class:`labkv.events._round_records.RoundColumns` makes them, or ``extra["rounds"]``
    of ``[key, round, pushed, missing, waited_s, complete]`` rows), or one key's round.

    >>> e = Event(0, 1.0, "dist_sync", "round", None, server=0, extra={"num_workers": 2,
    ...     "rounds": [["w", 3, [0], [1], 0.5, False], ["b", 2, [0, 1], [], 0.1, True]]})
    >>> [(key, x["round"], x["missing"], x["complete"]) for key, x in round_rows(e)]
    [('w', 3, [1], False), ('b', 2, [], True)]
    >>> e.extra["round_columns"] = [["w"], [3], [1], [2], [0.5], [False]]; del e.extra["rounds"]
    >>> [(key, x["pushed"], x["missing"]) for key, x in round_rows(e)]
    [('w', [0], [1])]
    """
    x = event.extra
    if event.key is not None:
        return [(event.key, x)]
    columns = x.get("round_columns")
    if columns is not None:
        rows = ([k, n, mask_ranks(p), mask_ranks(m), w, c] for k, n, p, m, w, c in zip(*columns))
    elif "rounds" in x:
        rows = x["rounds"]
    else:
        return [(event.key, x)]
    workers = x["num_workers"]
    return [(row[0], round_extra(row, workers)) for row in rows]


def round_extra(row: list[Any], num_workers: int) -> dict[str, Any]:
    """One key's round ``extra`` from a row ``[key, round, pushed, missing,
    waited_s, complete]`` of a server's record (what a one-key event carries).

    >>> round_extra(["w", 3, [0], [1], 0.5, False], 2)["missing"]
    [1]
    """
    _, number, pushed, missing, waited, complete = row
    return {
        "round": number,
        "pushed": pushed,
        "missing": missing,
        "num_workers": num_workers,
        "waited_s": waited,
        "complete": complete,
    }


def per_key(event: Event) -> list[Event]:
    """``event`` as events of one key each: a server's record of many keys'
    rounds becomes one ``round`` event per key (what a trace draws)."""
    x = event.extra
    if event.op != "round" or event.key is not None or not {"rounds", "round_columns"} & x.keys():
        return [event]
    return [dataclasses.replace(event, key=key, extra=x) for key, x in round_rows(event)]


def compact_rows(event: Event) -> list[tuple[Key, int, int, dict[str, float] | None]]:
    """``(key, count, nbytes, summary)`` of each key a counted-calls record holds
    (:meth:`EventBus.flush`), or of the one key of any other event.

    The first call of the first 4 keys had a detailed event (the op's budget, see
    ``labkv/events/_tally.py``), every other call was only counted:

    >>> from labkv.events import EventBus
    >>> bus = EventBus("s"); got = []
    >>> _ = bus.subscribe(got.append, detail_interval=60)
    >>> for key in range(COMPACT_AT + 2):
    ...     for _ in range(3):
    ...         _ = bus.count("pull", key, 4)
    >>> bus.flush(), got[0].key, got[0].count
    (1, None, 26)
    >>> [count for _, count, _, _ in compact_rows(got[0])], compact_rows(got[0])[0]
    ([2, 2, 2, 2, 3, 3, 3, 3, 3, 3], (0, 2, 8, None))
    """
    x = event.extra
    if not event.tally or event.key is not None or "keys" not in x:
        return [(event.key, event.count, event.nbytes, event.summary)]
    summaries = x.get("summaries") or [None] * len(x["keys"])
    return list(zip(x["keys"], x["counts"], x["nbytes"], summaries, strict=True))
