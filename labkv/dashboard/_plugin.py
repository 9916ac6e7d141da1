"""The scheduler's side of the labkv pane: one fold of every watched store's events.

:class:`LabkvDashboard` is a ``SchedulerPlugin``. Dask's event broker calls its
:meth:`~LabkvDashboard.log_event` with every batch a store's servers and ranks
send on the store's topic (:func:`labkv.cluster._event_relay.topic_of`), on the
scheduler's event loop: it only appends the batch (one pickled ``bytes``) to
the store's queue. The batches are unpacked and folded into one
:class:`~labkv.widgets._model.monitor_model.MonitorModel` per store when a page asks (at most
twice a second, however many pages are open) or once :data:`MAX_PENDING`
batches wait with nobody looking, so memory stays bounded and the totals exact.
What a page shows is rendered once per model version and shared by every
viewer (:meth:`Board.render`).

>>> from labkv.cluster._event_relay import pack_batch
>>> plugin = LabkvDashboard()
>>> plugin.log_event("labkv-events-dist_sync-1", pack_batch([{"seq": 0, "time": 1.0,
...     "store": "dist_sync-1", "op": "push", "key": "w", "server": 0, "nbytes": 8}]))
>>> board = plugin.board("dist_sync-1")
>>> board.fold(), board.model.keys["w"].pushes
(1, 1)
"""

from __future__ import annotations

import pickle
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from ..events import Event
from ..widgets._model.monitor_model import MonitorModel

__all__ = ["INFO_TOPIC", "MAX_PENDING", "MAX_STORES", "NAME", "Board", "LabkvDashboard"]

#: the plugin's name on the scheduler (``scheduler.plugins[NAME]``)
NAME = "labkv-dashboard"
#: the topic a notebook names its watched store on (:func:`labkv.dashboard.watch`)
INFO_TOPIC = "labkv-stores"
#: the topics of a store's events: its servers' and ranks', and a watched
#: notebook store's own (:mod:`._forward`)
_PREFIXES = ("labkv-events-", "labkv-notebook-")
#: batches a store's queue holds before they are folded with nobody looking
MAX_PENDING = 200
#: stores the plugin keeps (the least recently heard one is forgotten first)
MAX_STORES = 8


class Board:
    """One store as the pages see it: its model, what the notebook said of it
    (``info``: type, ranks, servers, replicas, placement), its queue of batches,
    and each page's last rendering."""

    def __init__(self, store_id: str):
        self.store_id = store_id
        # Smaller rings than a notebook's monitor: the pages show the newest state.
        self.model = MonitorModel(log_size=200, trace_size=20, timeline_size=5000)
        self.info: dict[str, Any] = {}
        self.info_version = 0  # bumped whenever the notebook sends a new info
        self.pending: deque[bytes] = deque()
        self.heard = time.time()
        self.batches = 0
        self._rendered: dict[str, tuple[Any, Any]] = {}

    def fold(self) -> int:
        """Unpack and fold every queued batch; returns the events folded."""
        pending, model = self.pending, self.model
        while pending:
            for data in pickle.loads(pending.popleft()):
                model.on_event(Event.from_dict(data))
        return model.flush()

    def render(self, page: str, draw: Callable[[Board], Any], stamp: Any = None) -> Any:
        """``draw(self)`` once per model version (and ``stamp``: a page whose text
        says how long something waits passes the second): every viewer of the
        page gets the same object."""
        self.fold()
        key = (self.model.version, self.info_version, stamp)
        done = self._rendered.get(page)
        if done is None or done[0] != key:
            done = self._rendered[page] = (key, draw(self))
        return done[1]


class LabkvDashboard(SchedulerPlugin):
    """Keeps a :class:`Board` per store whose events reach the scheduler (at most
    :data:`MAX_STORES`); ``viewers`` counts the open pages."""

    name = NAME

    def __init__(self) -> None:
        self.boards: OrderedDict[str, Board] = OrderedDict()
        self.viewers = 0

    def log_event(self, topic: str, msg: Any) -> None:
        """The broker's call for every event on the scheduler: O(1) for a batch
        of a store's events, nothing for other topics."""
        if topic.startswith(_PREFIXES):
            if not isinstance(msg, bytes):
                return
            board = self.board(topic.split("-", 2)[2])
            board.pending.append(msg)
            board.batches += 1
            board.heard = time.time()
            if len(board.pending) >= MAX_PENDING:
                board.fold()
        elif topic == INFO_TOPIC and isinstance(msg, bytes):
            info = pickle.loads(msg)  # labkv.dashboard._forward.store_info, as the notebook sent it
            board = self.board(str(info["store"]))
            board.info = info
            board.info_version += 1

    def board(self, store_id: str) -> Board:
        """The board of ``store_id`` (a new one, the oldest forgotten past
        :data:`MAX_STORES`)."""
        board = self.boards.get(store_id)
        if board is None:
            board = self.boards[store_id] = Board(store_id)
            while len(self.boards) > MAX_STORES:
                self.boards.popitem(last=False)
        else:
            self.boards.move_to_end(store_id)
        return board

    def newest(self) -> str | None:
        """The store heard from last (None before any)."""
        if not self.boards:
            return None
        return max(self.boards.values(), key=lambda b: b.heard).store_id
