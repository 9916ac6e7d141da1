"""The bus's bookkeeping of calls that get no detailed event: exact counts, little work.

A subscriber may ask for at most ``burst`` detailed events per op, key, rank and
server in every ``interval`` seconds (see :meth:`labkv.events.EventBus.subscribe`).
:class:`Tallies` decides for each call whether it gets a detailed event now
(:meth:`Tallies.admit`: ``(count, nbytes)`` that event stands for) or is only
counted (``None``), and hands the calls counted since their last event to whoever
delivers them (:meth:`Tallies.due`).

Credits: once a busy (op, key)'s window has used its detailed events, its next
calls are counted without reading the clock, as many as its rate so far fills the
rest of the window with (:data:`CREDITS_MIN` to :data:`CREDITS_MAX`, so a window
ends at most one grant late). A call of one array by the bus's own store spends
such a credit in :meth:`labkv.events.EventBus.count` as ``next(credits, False)``
on an ``itertools.repeat(True, n)`` (from :attr:`Tallies.credits`): one C call
both spends the credit and counts the call (the calls are read back later as
``n - length_hint(credits)``; bytes are calls x bytes of one call). Other calls
spend theirs in :meth:`Tallies.admit`.

A budget per op: besides each slot's ``burst``, a bus hands out at most
``burst`` x ``op_budget`` detailed events per op in every ``interval``
(:data:`OP_BUDGET`; a cluster's event streams use 1),
whatever the keys, ranks and servers, so that a stream's detail stays what a
view can show when a call of each of 500 keys comes once a round from each of
64 ranks (every slot then sees one call per window, and each call would be a
detailed event). Calls beyond it are only counted, exactly as the others.

Threads: only the calling thread adds to a slot's calls and bytes, without a lock;
what was reported changes under the lock (in :meth:`admit` or :meth:`due`, which
may run on another thread and reads in an order that can only fall short for a
moment, never count a call twice).

>>> t = Tallies()
>>> t.configure(interval=60.0, burst=1)
>>> [t.admit("push", "w", 8) for _ in range(3)]
[(1, 8), None, None]
>>> t.due()
[(('push', 'w', 0, None), 2, 16)]
"""

from __future__ import annotations

import collections
import itertools
import operator
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

#: (op, key, rank, server): what one slot counts
SlotId = tuple[str, Any, int, Any]

#: the bounds of a grant of credits (see module doc)
CREDITS_MIN, CREDITS_MAX = 32, 1024
#: per op, the detailed events a bus hands out in every interval: this many slots' bursts
OP_BUDGET = 4
#: the ops whose calls of one array may spend credits inline
QUICK_OPS = ("push", "pull")

#: no credits: ``next(SPENT, False)`` is False, so the call goes to admit()
SPENT: Iterator[bool] = itertools.repeat(True, 0)
_NO_QUICK: tuple[Iterator[bool], int] = (SPENT, 0)


def _spent(quick: tuple[Iterator[bool], int]) -> int:
    """Calls counted inline with a ``(credits, granted)`` grant."""
    credits, granted = quick
    return granted - operator.length_hint(credits) if granted else 0


class _Slot:
    """The counts of one (op, key, rank, server)."""

    __slots__ = (
        "calls",
        "nbytes",
        "reported",
        "reported_bytes",
        "window",
        "used",
        "window_calls",
        "credit",
        "quick",
        "unit_bytes",
        "rows",
        "reported_rows",
    )

    def __init__(self, now: float, nbytes: int, reported: bool = True, rows: int = 0):
        #: calls and bytes counted here (inline counts are folded in later)
        self.calls, self.nbytes = 1, nbytes
        #: calls and bytes already reported in events
        self.reported, self.reported_bytes = (1, nbytes) if reported else (0, 0)
        #: rows of row-sparse values counted here, and those already reported
        self.rows, self.reported_rows = rows, rows if reported else 0
        #: the detail window's start, detailed events used in it, calls before it
        self.window, self.used, self.window_calls = now, 1, 0
        #: credits left for calls through admit()
        self.credit = 0
        #: the credits spent inline: ``(iterator, granted)``, one tuple so that
        #: another thread reads both at once; the bytes of one such call
        self.quick, self.unit_bytes = _NO_QUICK, nbytes

    def report(self, nbytes: int, rows: int = 0) -> tuple[int, int, int]:
        """Count one call of ``nbytes`` (and ``rows``) and report it with the calls
        only counted since the last report: ``(count, nbytes, rows)`` (under the lock)."""
        self.calls += 1
        self.nbytes += nbytes
        self.rows += rows
        count, total = self.calls - self.reported, self.nbytes - self.reported_bytes
        moved = self.rows - self.reported_rows
        self.reported, self.reported_bytes, self.reported_rows = self.calls, self.nbytes, self.rows
        return count, total, moved


class Tallies:
    """Which calls get a detailed event, and exact counts of the rest (see module doc)."""

    def __init__(self) -> None:
        self.interval = 0.0
        self.burst = 1
        #: per op, at most ``burst * op_budget`` detailed events per interval
        self.op_budget = OP_BUDGET
        self._slots: dict[SlotId, _Slot] = {}
        self._lock = threading.Lock()
        #: per op, ``[window start, detailed events in it]`` (see module doc)
        self._budget: dict[str, list] = {}
        #: the slots counted in since due() last looked, and those holding credits
        #: spent inline (see due())
        #: calls of many keys kept whole once their op's detail was used up:
        #: ``(op, rank, server, keys, bytes per key)``, counted per key by due()
        self._bulk: collections.deque[tuple[str, int, Any, Sequence[Any], Sequence[int]]] = (
            collections.deque()
        )
        #: (dicts: a flush reports them in the order they were counted)
        self._touched: dict[SlotId, None] = {}
        self._granted: dict[SlotId, None] = {}
        #: per op, key -> the credits a store's calls of one array spend, as
        #: ``next(credits[op].get(key, SPENT), False)`` (see module doc); every key
        #: admit() has seen is in here
        self.credits: dict[str, dict[Any, Iterator[bool]]] = {op: {} for op in QUICK_OPS}

    def configure(self, interval: float, burst: int) -> None:
        """Follow new detail settings. Credits were granted under the old ones:
        take them back, so that each key's next call goes through admit() (which
        folds what was counted inline; a credit spent meanwhile stays counted)."""
        self.interval, self.burst = interval, burst
        for credits in self.credits.values():
            for key in list(credits):  # a store may be adding keys on its thread
                credits[key] = SPENT
        for slot in list(self._slots.values()):
            slot.credit = 0

    def admit(
        self,
        op: str,
        key: Any,
        nbytes: int,
        rank: int = 0,
        server: int | None = None,
        units: int = 1,
    ) -> tuple[int, int] | None:
        """``(count, nbytes)`` of the calls a detailed event of this call stands
        for, or ``None`` when the call was only counted."""
        admitted = self.admit_rows(op, key, nbytes, 0, rank, server, units)
        return None if admitted is None else admitted[:2]

    def admit_rows(
        self,
        op: str,
        key: Any,
        nbytes: int,
        rows: int,
        rank: int = 0,
        server: int | None = None,
        units: int = 1,
    ) -> tuple[int, int, int] | None:
        """:meth:`admit` for a call that moved ``rows`` rows of a row-sparse value:
        ``(count, nbytes, rows)`` of the calls its detailed event stands for. The
        rows of calls only counted are summed as their bytes are.

        >>> t = Tallies()
        >>> t.configure(interval=60.0, burst=1)
        >>> [t.admit_rows("pull", "e", 80, 10) for _ in range(3)]
        [(1, 80, 10), None, None]
        >>> t.due_groups()
        {('pull', 0, None): {'e': [2, 160, 0, 20]}}
        """
        interval = self.interval
        if server is not None and interval and self.used_up(op):
            # A server's receipt, with no detail left: due() counts it, nothing else
            # (a watched server got 32,000 receipts a round at 64 ranks x 500 keys).
            self._bulk.append((op, rank, server, (key,), (nbytes,)))
            return None
        sid = (op, key, rank, server)
        slot = self._slots.get(sid)
        if not interval:
            # Every call is an event; calls counted under earlier settings ride on it.
            if slot is None:
                return 1, nbytes, rows
            return self._with_backlog(op, key, slot, nbytes, rows)
        if slot is not None:
            if slot.quick[1]:
                self._fold_quick(op, key, slot)
            if slot.credit > 0:  # > 0: configure() may zero it between check and use
                slot.credit -= 1
                return self._counted(sid, slot, nbytes, rows)
        now = time.monotonic()
        elapsed = now - slot.window if slot is not None else interval
        if elapsed < interval and slot.used >= self.burst:
            # calls since the window's first one (at elapsed 0), this one included
            since_first = slot.calls + 1 - slot.window_calls - 1
            rate_fill = since_first * (interval - elapsed) / max(elapsed, 1e-6)
            grant = min(max(int(rate_fill), CREDITS_MIN), CREDITS_MAX)
            # rows vary from call to call: only calls of one dense array count inline
            if units == 1 and server is None and not rows and op in self.credits:
                credits = itertools.repeat(True, grant)
                slot.unit_bytes = nbytes
                slot.quick = (credits, grant)
                self._granted[sid] = None  # after the grant: see due()
                self.credits[op][key] = credits
            else:
                slot.credit = grant
            return self._counted(sid, slot, nbytes, rows)
        budget = self._budget.get(op)
        if budget is None or now - budget[0] >= interval:
            budget = self._budget[op] = [now, 0]
        spent = budget[1] >= self.burst * self.op_budget
        if spent and slot is not None:
            # The op's detail is used up: only counted, and so are the slot's next
            # few calls, without reading the clock.
            slot.credit = CREDITS_MIN
            return self._counted(sid, slot, nbytes, rows)
        budget[1] += 1
        with self._lock:
            if slot is None:
                self._slots[sid] = _Slot(now, nbytes, not spent, rows)
                if server is None and op in self.credits:
                    self.credits[op][key] = SPENT  # found by the inline spend from now on
                if spent:
                    self._touched[sid] = None
                    return None
                return 1, nbytes, rows
            if now - slot.window >= interval:
                slot.window, slot.used, slot.window_calls = now, 0, slot.calls
            slot.used += 1
            return slot.report(nbytes, rows)

    def admit_keys(
        self, op: str, keys: Sequence[Any], nbytes: Sequence[int], rank: int = 0
    ) -> list[tuple[int, int, int]]:
        """:meth:`admit` for a call of many keys (``nbytes[i]``: the bytes of
        ``keys[i]``): ``(i, count, nbytes)`` of those that get a detailed event.
        Once the op's detail is used up, the rest of the call is kept whole and
        counted per key by :meth:`due`: one check for the call, not one per key
        (a rank's pull of 500 keys cost more in admit() than in the pull)."""
        admitted = []
        for i, key in enumerate(keys):
            if self.interval and self.used_up(op):
                self._bulk.append((op, rank, None, keys[i:], nbytes[i:]))
                break
            counted = self.admit(op, key, nbytes[i], rank)
            if counted is not None:
                admitted.append((i, *counted))
        return admitted

    def take(self, op: str) -> bool:
        """Take one detailed event of ``op``'s budget for this interval, if one is left."""
        if not self.interval:
            return True
        now = time.monotonic()
        budget = self._budget.get(op)
        if budget is None or now - budget[0] >= self.interval:
            budget = self._budget[op] = [now, 0]
        if budget[1] >= self.burst * self.op_budget:
            return False
        budget[1] += 1
        return True

    def used_up(self, op: str) -> bool:
        """Whether the op's detailed events of this interval are all handed out."""
        budget = self._budget.get(op)
        return (
            budget is not None
            and budget[1] >= self.burst * self.op_budget
            and time.monotonic() - budget[0] < self.interval
        )

    def counted(self, op: str, keys: Sequence[Any], nbytes: Sequence[int], server: Any) -> None:
        """Calls counted by their owner (a server's receipts while the op's detail
        was used up: :meth:`used_up`), reported by the next :meth:`due`."""
        self._bulk.append((op, 0, server, keys, nbytes))

    def _counted(self, sid: SlotId, slot: _Slot, nbytes: int, rows: int = 0) -> None:
        """Count one call only; due() looks at the slot next time (marked after
        the count: see due())."""
        slot.calls += 1
        slot.nbytes += nbytes
        slot.rows += rows
        self._touched[sid] = None

    def _fold_quick(self, op: str, key: Any, slot: _Slot) -> None:
        """Add the calls counted inline to the slot (the calling thread's job):
        clear the grant first (due() may be reading), then take the spent
        credits away from the inline spend."""
        quick, slot.quick = slot.quick, _NO_QUICK
        self.credits[op][key] = SPENT
        spent = _spent(quick)
        slot.calls += spent
        slot.nbytes += spent * slot.unit_bytes

    def _with_backlog(
        self, op: str, key: Any, slot: _Slot, nbytes: int, rows: int
    ) -> tuple[int, int, int]:
        """This call's ``(count, nbytes, rows)`` plus those of the calls only counted so far."""
        if slot.quick[1]:
            self._fold_quick(op, key, slot)
        with self._lock:
            return slot.report(nbytes, rows)

    def due(self) -> list[tuple[SlotId, int, int]]:
        """``(slot id, count, nbytes)`` of every slot with calls counted since its
        last report, which are reported by this (any thread may call it)."""
        return [
            ((op, key, counted[2], server), counted[0], counted[1])
            for (op, _, server), keys in self.due_groups().items()
            for key, counted in keys.items()
        ]

    def due_groups(self) -> dict[tuple[str, int, Any], dict[Any, list[int]]]:
        """What :meth:`due` returns, grouped as a flush sends it: per ``(op, rank,
        server)`` (a server's from every rank together, as rank 0), per key
        ``[count, nbytes, rank, rows]`` (``rows``: of row-sparse values, see
        :meth:`admit_rows`).

        Only the slots counted in since the last call are looked at (``_touched``)
        and those whose credits are spent inline (``_granted``): a rank of a
        500-key store has 1,000 slots, and looking at each at every flush cost
        more than its calls. The caller marks a slot after counting in it, and this
        unmarks it before reading it, so a call is either read now or marked again.
        """
        groups: dict[tuple[str, int, Any], dict[Any, list[int]]] = {}

        def add(
            op: str, key: Any, rank: int, server: Any, calls: int, nbytes: int, rows: int
        ) -> None:
            group = groups.setdefault((op, 0 if server is not None else rank, server), {})
            counted = group.get(key)
            if counted is None:
                group[key] = [calls, nbytes, rank, rows]
            else:
                counted[0] += calls
                counted[1] += nbytes
                counted[3] += rows

        with self._lock:
            bulk = self._bulk
            chunks: dict[tuple[str, int, Any], list[tuple[int, Sequence[Any], Sequence[int]]]] = {}
            while bulk:  # the calls kept whole (admit_keys), counted per key below
                op, rank, server, keys, nbytes = bulk.popleft()
                gid = (op, 0 if server is not None else rank, server)
                chunks.setdefault(gid, []).append((rank, keys, nbytes))
            touched, granted = self._touched, self._granted
            for k in {**touched.copy(), **granted.copy()}:
                touched.pop(k, None)
                granted.pop(k, None)
                slot = self._slots[k]
                # calls and bytes before the inline count: a fold in between can only
                # make this total fall short for now, never count a call twice
                calls, nbytes = slot.calls, slot.nbytes
                quick = slot.quick
                if operator.length_hint(quick[0]):
                    granted[k] = None  # credits left to spend inline
                spent = _spent(quick)
                calls, nbytes = calls + spent, nbytes + spent * slot.unit_bytes
                if calls > slot.reported:
                    rows = slot.rows
                    moved = rows - slot.reported_rows
                    add(*k, calls - slot.reported, nbytes - slot.reported_bytes, moved)
                    slot.reported, slot.reported_bytes, slot.reported_rows = calls, nbytes, rows
        for gid, calls_of_keys in chunks.items():
            columns = None if gid in groups else Columns.of(calls_of_keys)
            if columns is not None:
                groups[gid] = columns
                continue
            group = groups.setdefault(gid, {})
            for rank, keys, nbytes in calls_of_keys:
                for key, n in zip(keys, nbytes):
                    counted = group.get(key)
                    if counted is None:
                        group[key] = [1, n, rank, 0]
                    else:
                        counted[0] += 1
                        counted[1] += n
        return groups


class Columns(Mapping):
    """One group of :meth:`Tallies.due_groups` made only of calls of the same
    keys by one rank (a rank's push or pull of all its keys, once or a few times
    per flush), kept as columns: ``key_column``, ``counts``, ``nbytes`` and ``rows``
    lists, built at C speed. It reads as the dict of ``key -> [count, nbytes,
    rank, rows]`` the other groups are, so callers may treat both alike; a flush
    sends its columns as they are (making 500 lists per call cost more than the
    call at 64 ranks x 500 keys).

    >>> c = Columns.of([(3, ("a", "b"), (8, 4)), (3, ("a", "b"), (8, 4))])
    >>> c.key_column, c.counts, c.nbytes, dict(c)
    (['a', 'b'], [2, 2], [16, 8], {'a': [2, 16, 3, 0], 'b': [2, 8, 3, 0]})
    >>> Columns.of([(3, ("a",), (8,)), (3, ("b",), (8,))]) is None  # other keys
    True
    >>> Columns.of([(3, ("b",), (4,)), (3, ("a", "b"), (8, 4))]).counts  # a call's last keys
    [1, 2]
    """

    def __init__(self, keys: list, counts: list[int], nbytes: list[int], rank: int):
        self.key_column, self.counts, self.nbytes, self.rank = keys, counts, nbytes, rank
        self.rows = [0] * len(keys)
        self._index: dict[Any, int] | None = None

    @classmethod
    def of(cls, calls: list[tuple[int, Sequence[Any], Sequence[int]]]) -> Columns | None:
        """The columns of ``(rank, keys, nbytes)`` calls, or None unless every call
        is of the same distinct keys, in the same order, by the same rank; a call
        may have only the last of them (what is left of a call once its first keys
        got detailed events: see :meth:`Tallies.admit_keys`)."""
        rank = calls[0][0]
        keys = list(max((keys for _, keys, _ in calls), key=len))
        n = len(keys)
        if len(set(keys)) != n:
            return None
        counts, summed = [0] * n, [0] * n
        for other_rank, other, nbytes in calls:
            start = n - len(other)
            if other_rank != rank or (keys[start:] if start else keys) != list(other):
                return None
            counts[start:] = map(operator.add, counts[start:], itertools.repeat(1))
            summed[start:] = map(operator.add, summed[start:], nbytes)
        return cls(keys, counts, summed, rank)

    def __getitem__(self, key: Any) -> list[int]:
        if self._index is None:
            self._index = {k: i for i, k in enumerate(self.key_column)}
        i = self._index[key]
        return [self.counts[i], self.nbytes[i], self.rank, self.rows[i]]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.key_column)

    def __len__(self) -> int:
        return len(self.key_column)
