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

import itertools
import operator
import threading
import time
from collections.abc import Iterator
from typing import Any

#: (op, key, rank, server): what one slot counts
SlotId = tuple[str, Any, int, Any]

#: the bounds of a grant of credits (see module doc)
CREDITS_MIN, CREDITS_MAX = 32, 1024
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
    )

    def __init__(self, now: float, nbytes: int):
        #: calls and bytes counted here (inline counts are folded in later)
        self.calls, self.nbytes = 1, nbytes
        #: calls and bytes already reported in events
        self.reported, self.reported_bytes = 1, nbytes
        #: the detail window's start, detailed events used in it, calls before it
        self.window, self.used, self.window_calls = now, 1, 0
        #: credits left for calls through admit()
        self.credit = 0
        #: the credits spent inline: ``(iterator, granted)``, one tuple so that
        #: another thread reads both at once; the bytes of one such call
        self.quick, self.unit_bytes = _NO_QUICK, nbytes

    def report(self, nbytes: int) -> tuple[int, int]:
        """Count one call of ``nbytes`` and report it with the calls only counted
        since the last report: ``(count, nbytes)`` (under the lock)."""
        self.calls += 1
        self.nbytes += nbytes
        count, total = self.calls - self.reported, self.nbytes - self.reported_bytes
        self.reported, self.reported_bytes = self.calls, self.nbytes
        return count, total


class Tallies:
    """Which calls get a detailed event, and exact counts of the rest (see module doc)."""

    def __init__(self) -> None:
        self.interval = 0.0
        self.burst = 1
        self._slots: dict[SlotId, _Slot] = {}
        self._lock = threading.Lock()
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
        interval = self.interval
        slot = self._slots.get((op, key, rank, server))
        if not interval:
            # Every call is an event; calls counted under earlier settings ride on it.
            return (1, nbytes) if slot is None else self._with_backlog(op, key, slot, nbytes)
        if slot is not None:
            if slot.quick[1]:
                self._fold_quick(op, key, slot)
            if slot.credit > 0:  # > 0: configure() may zero it between check and use
                slot.credit -= 1
                slot.calls += 1
                slot.nbytes += nbytes
                return None
        now = time.monotonic()
        elapsed = now - slot.window if slot is not None else interval
        if elapsed < interval and slot.used >= self.burst:
            slot.calls += 1
            slot.nbytes += nbytes
            # calls since the window's first one, which came at elapsed 0
            since_first = slot.calls - slot.window_calls - 1
            rate_fill = since_first * (interval - elapsed) / max(elapsed, 1e-6)
            grant = min(max(int(rate_fill), CREDITS_MIN), CREDITS_MAX)
            if units == 1 and server is None and op in self.credits:
                credits = itertools.repeat(True, grant)
                slot.unit_bytes = nbytes
                slot.quick = (credits, grant)
                self.credits[op][key] = credits
            else:
                slot.credit = grant
            return None
        with self._lock:
            if slot is None:
                self._slots[(op, key, rank, server)] = _Slot(now, nbytes)
                if server is None and op in self.credits:
                    self.credits[op][key] = SPENT  # found by the inline spend from now on
                return 1, nbytes
            if now - slot.window >= interval:
                slot.window, slot.used, slot.window_calls = now, 0, slot.calls
            slot.used += 1
            return slot.report(nbytes)

    def _fold_quick(self, op: str, key: Any, slot: _Slot) -> None:
        """Add the calls counted inline to the slot (the calling thread's job):
        clear the grant first (due() may be reading), then take the spent
        credits away from the inline spend."""
        quick, slot.quick = slot.quick, _NO_QUICK
        self.credits[op][key] = SPENT
        spent = _spent(quick)
        slot.calls += spent
        slot.nbytes += spent * slot.unit_bytes

    def _with_backlog(self, op: str, key: Any, slot: _Slot, nbytes: int) -> tuple[int, int]:
        """This call's ``(count, nbytes)`` plus those of the calls only counted so far."""
        if slot.quick[1]:
            self._fold_quick(op, key, slot)
        with self._lock:
            return slot.report(nbytes)

    def due(self) -> list[tuple[SlotId, int, int]]:
        """``(slot id, count, nbytes)`` of every slot with calls counted since its
        last report, which are reported by this (any thread may call it)."""
        due = []
        with self._lock:
            for k, slot in list(self._slots.items()):
                # calls and bytes before the inline count: a fold in between can only
                # make this total fall short for now, never count a call twice
                calls, nbytes = slot.calls, slot.nbytes
                spent = _spent(slot.quick)
                calls, nbytes = calls + spent, nbytes + spent * slot.unit_bytes
                if calls > slot.reported:
                    due.append((k, calls - slot.reported, nbytes - slot.reported_bytes))
                    slot.reported, slot.reported_bytes = calls, nbytes
        return due
