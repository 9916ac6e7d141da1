"""``Monitor``: one store's event model plus, once displayed, its live dashboard.

>>> import labkv, numpy as np
>>> kv = labkv.create("local")
>>> mon = Monitor(kv)
>>> kv.init(3, np.full((2, 3), 2.0))
>>> kv.push(3, np.ones((2, 3)))
>>> print(mon.summary(events=0))  # doctest: +ELLIPSIS
labkv monitor local: push 1, pull 0, updater 0; 2 events (init 1, push 1)
<BLANKLINE>
keys
key  shape  push  pull  updater  pushed  pulled  min  max  mean  norm   last change        placement
---  -----  ----  ----  -------  ------  ------  ---  ---  ----  -----  -----------------  ---------
3    2x3    1     0     0        48 B    0 B     1    1    1     2.449  push ...  cpu(0)
>>> mon.close()
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..events import export_trace, summarize
from ._front import FrontEnd
from ._model.monitor_model import MonitorModel
from ._render.text import summary as text_summary
from ._render.text import unread
from ._throttle import Ticker
from ._values import downsample

__all__ = ["Monitor"]

_bokehjs_loaded = False


#: a monitor asks the bus for at most DETAIL_BURST detailed events per key and op
#: in every DETAIL_INTERVAL seconds: calls at the pace of a person running cells all
#: arrive in detail, a busy training loop's are mostly counted (exact counts, little work)
DETAIL_INTERVAL = 0.1
DETAIL_BURST = 4
#: keys whose value a refresh reads from the servers, at most
SERVER_READS = 8


def _load_bokehjs() -> None:
    """Put BokehJS into the page once per kernel, inline: the widgets' bokeh
    views cannot render without it, and the CDN may be unreachable."""
    global _bokehjs_loaded
    if _bokehjs_loaded:
        return
    try:
        from bokeh.io import output_notebook
        from bokeh.resources import INLINE
    except ImportError:
        return
    output_notebook(resources=INLINE, hide_banner=True)
    _bokehjs_loaded = True


def _same(a: Any, b: Any) -> bool:
    """Whether two downsampled pictures are equal (NaNs included)."""
    return (
        a is not None
        and b is not None
        and a.shape == b.shape
        and a.dtype == b.dtype
        and bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    )


class Monitor(FrontEnd):
    """Watches one store's events; see :func:`labkv.widgets.monitor`.

        ``hz`` bounds the dashboard's refresh rate, ``rows`` the rows of the event
        log shown, ``log_size``/``trace_size`` the rings kept; the timeline (what
    :meth:`export_trace` writes) keeps the last ``timeline_s`` seconds, at most
    ``timeline_size`` events. ``refresh_cpu`` is
        the share of a core the refreshes may take from the notebook: when a busy
        store makes them costly, they come less often (down to once a second).
        ``hidden_tabs_s``: how often the tables of the tabs the page does not show
        are drawn too (a refresh draws the shown tab; while a cell runs, the kernel
        hears of a click on another tab only when the cell ends, so that tab should
        be recent), or less often when drawing them costs more than ``refresh_cpu``
        allows. Plots are drawn only while their tab is shown.
    """

    def __init__(
        self,
        kv: Any,
        *,
        hz: float = 10.0,
        rows: int = 30,
        log_size: int = 500,
        trace_size: int = 100,
        refresh_cpu: float = 0.005,
        timeline_size: int = 20_000,
        hidden_tabs_s: float = 1.0,
        timeline_s: float = 10.0,
    ):
        sizes = {"timeline_size": timeline_size, "timeline_s": timeline_s}
        self.model = MonitorModel(log_size=log_size, trace_size=trace_size, **sizes)
        self.kv: Any = None
        self.closed = True
        self._rows = rows
        self._sub: Any = None
        self._dashboard: Any = None
        self._value: Any = None
        self._placement: dict[Any, Any] = {}
        self._placement_keys = 0
        self._chosen: Any = None
        #: what a closing monitor could not read (``store closed``, ``server 1 lost``)
        self._notes: list[str] = []
        self._refresh_lock = threading.Lock()
        self._hidden_tabs_s = hidden_tabs_s
        self._hidden_due = time.monotonic() + hidden_tabs_s
        self._ticker = Ticker(self.refresh, hz=hz, cpu_share=refresh_cpu)
        self.attach(kv)

    # -- life cycle ----------------------------------------------------------------
    def attach(self, kv: Any) -> Monitor:
        """Watch ``kv`` from now on (forgetting the previous store's events)."""
        self._noting(self._unsubscribe)  # a lost or closed store: watching it is over anyway
        with self._refresh_lock:
            self.kv = kv
            self.model.reset()
            self._placement, self._placement_keys = {}, 0
            self._chosen = None
            self._notes.clear()
            if self._value is not None:
                self._value.__init__()
                self._value.version = -2  # differs from the dashboard's, so it redraws
            # The views refresh at most `hz` times a second, so they need at most a few
            # detailed events per key and op in that time; the bus tallies the calls in
            # between (exact counts, far less work for a busy store).
            self._sub = kv.events.subscribe(
                self.model.on_event, detail_interval=DETAIL_INTERVAL, detail_burst=DETAIL_BURST
            )
            self.closed = False
        if self._dashboard is not None:
            self._ticker.start()
        return self

    def close(self) -> None:
        """Stop watching and stop the refresh thread (idempotent; never raises).

        A displayed dashboard (and every part shown with :meth:`show`) stays
        where it is, showing everything seen up to now, its header marked closed:
        a notebook that ends its monitor in its last cell still shows what
        happened after Run All. (Closing the widgets would take that picture
        away, and the page's plots would go on sending messages to widgets the
        kernel no longer has.) When the store can no longer be read (closed, or a
        server of a cluster store lost), the picture is what the monitor saw until
        then and the header says what it could not read, e.g. ``(closed; server 1
        lost)``. ``attach`` watches again.
        """
        self._ticker.stop()
        with self._refresh_lock:
            if self._sub is not None:
                # The last picture includes the calls the bus has only counted so far
                # and the values the servers hold now.
                self._noting(lambda: self._catch_up(note_failures=True))
            # Unsubscribing a cluster store tells its servers to stop streaming: the
            # store raises when it is closed or a server is lost, yet the monitor is
            # unsubscribed by then (the bus drops the subscriber first).
            self._noting(self._unsubscribe)
            self._sub = None
            self.model.flush()  # what arrived since
            self.closed = True
            self._noting(self._draw)  # the header says closed; every tab drawn

    def _noting(self, step: Callable[[], Any]) -> None:
        """Run ``step``; what it raises becomes a note of the closed monitor's header."""
        try:
            step()
        except Exception as exc:
            self._note(exc)

    def _note(self, exc: BaseException) -> None:
        note = unread(exc)
        if note not in self._notes:
            self._notes.append(note)

    def _flush_bus(self) -> None:
        """Have the store's bus deliver the calls it only tallied so far."""
        if self._sub is not None:
            self.kv.events.flush()

    def _unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            sub.unsubscribe()

    # -- refresh (the ticker's thread, or called directly) ------------------------
    def refresh(self) -> None:
        """Fold pending events and bring the dashboard (if any) up to date: its
        header and the tab the page shows, the tables of the other tabs once in a
        while (``hidden_tabs_s``), and every tab once the monitor is closed, so
        that its last picture is whole."""
        with self._refresh_lock:
            if not self.closed:
                self._catch_up()
            self._draw()

    def settle(self, timeout: float = 10.0, quiet: float = 0.3) -> bool:
        """Wait for the reports still on their way, refreshing: ``True`` once no
        event has arrived for ``quiet`` seconds and the servers' byte counters the
        monitor shows equal those the store reads from its servers now
        (``kv.server_load()``, a cluster store), ``False`` when ``timeout``
        seconds passed first. A cluster's servers and ranks send their events in
        batches (every ~0.1 s), so the monitor hears of a run's last calls a
        little after ``run`` returns: settle before reading the monitor's
        numbers or closing it, and its last picture is complete. A closed
        monitor has nothing to wait for.

        >>> import labkv, numpy as np
        >>> kv = labkv.create("local")
        >>> mon = Monitor(kv)
        >>> kv.init("w", np.zeros(2))
        >>> kv.push("w", np.ones(2))
        >>> mon.settle(quiet=0.05), mon.model.keys["w"].pushes
        (True, 1)
        >>> mon.close()
        """
        deadline = time.monotonic() + timeout
        seen, since = -1, time.monotonic()
        while not self.closed:
            self.refresh()
            now = time.monotonic()
            if self.model.events_seen != seen:
                seen, since = self.model.events_seen, now
            elif now - since >= quiet and self._servers_shown():
                return True
            if now >= deadline:
                return False
            time.sleep(min(0.05, quiet / 2))
        return True

    def _servers_shown(self) -> bool:
        """Whether the server table holds each server's byte counters as it
        reports them now (no store or server to ask: nothing more to come)."""
        read = getattr(self.kv, "server_load", None)
        try:
            loads = read() if read is not None else []
        except Exception:  # a closed store or a lost server sends nothing more
            return True
        with self.model.lock:
            shown = {s: (ld.bytes_in, ld.bytes_out) for s, ld in self.model.servers.items()}
        return all(
            shown.get(ld.get("server", i)) == (ld["bytes_in"], ld["bytes_out"])
            for i, ld in enumerate(loads)
        )

    def _draw(self) -> None:
        """Bring the dashboard (if any) up to date with the model (under the refresh lock)."""
        dashboard = self._dashboard
        if dashboard is None:
            return
        # The tables of hidden tabs are drawn once in a while too (the kernel hears
        # of a click on a tab only when the running cell ends), less often when
        # drawing them is costly, so that they keep to the refresh's CPU share.
        now = time.monotonic()
        hidden = not self.closed and now >= self._hidden_due
        if self.closed or dashboard.shows_value:
            self._read_chosen_value(dashboard)
        notes = tuple(self._notes)
        start = time.thread_time()
        dashboard.update(
            self.model,
            self._value,
            self._placement,
            self._title(),
            self.closed,
            every_tab=self.closed,
            notes=notes,
            hidden_tables=hidden,
        )
        if hidden:
            cost = time.thread_time() - start
            self._hidden_due = now + max(self._hidden_tabs_s, cost / self._ticker.cpu_share)

    def _catch_up(self, note_failures: bool = False) -> None:
        """Fold everything the bus has (detailed and only counted calls) into the
        model, and re-read the placement when keys were added."""
        self._flush_bus()
        self.model.flush()
        self._read_server_values(note_failures)
        if len(self.model.keys) != self._placement_keys:
            self._placement_keys = len(self.model.keys)
            self._placement = self._read_placement()

    def _read_server_values(self, note_failures: bool = False) -> None:
        """Summaries of values that servers changed, read from the servers. Their
        events tell what was pushed (and the ranks' what they pulled, a batch
        later), not what is stored now; at most SERVER_READS keys per refresh."""
        model = self.model
        for key in model.take_server_changed(SERVER_READS):
            try:
                value = self.kv.peek(key)
            except Exception as exc:  # e.g. a server lost: the store's next call says so
                if note_failures:  # closing: no next call, the header says it
                    self._note(exc)
                continue
            model.set_value(key, summarize(value))

    def _read_placement(self) -> dict[Any, Any]:
        return dict(self.kv.placement())

    def _read_chosen_value(self, dashboard: Any) -> None:
        chosen = dashboard.value_key.value
        self._read_value(chosen if chosen is not None else self._chosen)

    def _read_value(self, key: Any) -> None:
        value, model = self._value, self.model
        if key is None:
            with model.lock:
                key = next(iter(model.keys), None)
        changed = model.take_changed()
        if key is None or (key == value.key and key not in changed and value.picture is not None):
            return
        try:
            array = self.kv.peek(key)  # not a pull: no event, safe from this thread
            picture = downsample(array)
            if key == value.key and _same(picture, value.picture):
                return  # pushed again, but to the same value: nothing to redraw
            value.picture = picture
            value.shape, value.dtype, value.error = tuple(array.shape), str(array.dtype), ""
        except Exception as exc:  # e.g. a key the store has not initialised
            value.picture, value.error = None, f"cannot read key {key!r}: {exc}"
        value.key = key
        value.version += 1

    # -- choosing and reading ---------------------------------------------------
    def select(self, key: Any) -> None:
        """Show ``key`` in the value view (``None``: the first key)."""
        self._chosen = key
        if self._dashboard is not None:
            self._dashboard.value_key.value = key if key in self.model.keys else None

    @property
    def value(self) -> Any:
        """``(key, downsampled array)`` of the value view (the key it shows, as the
        store holds it now), or ``None`` before the dashboard is built. The view's
        tab reads it at each refresh while shown; while hidden, this reads it."""
        v, dashboard = self._value, self._dashboard
        if v is None:
            return None
        if dashboard is not None and not dashboard.shows_value and not self.closed:
            with self._refresh_lock:
                self._catch_up()
                self._read_chosen_value(dashboard)
        return None if v.picture is None else (v.key, v.picture)

    def export_trace(
        self, path: str | os.PathLike, keys: Iterable[Any] | None = None, ranks: Any = None
    ) -> dict[str, int]:
        """Write the events seen (the model's timeline: the last ``timeline_s``) as a
        Chrome / Perfetto trace to ``path``, only those of ``keys`` and ``ranks``
        when given (see :func:`labkv.events.export_trace`); returns the push and
        pull calls its spans stand for. Open it in https://ui.perfetto.dev.

        >>> mon.export_trace("run.json", keys=["w"])  # doctest: +SKIP
        {'push': 40, 'pull': 40}
        """
        self._catch_up()
        with self.model.lock:
            events = list(self.model.timeline)
        return export_trace(events, path, keys, ranks)

    def summary(self, events: int = 10) -> str:
        """Text of every non-empty section: per-key table, last ``events`` events,
        updater calls, fan-in, server load."""
        self._catch_up()
        return text_summary(self.model, self._placement, self._title(), events)

    def _title(self) -> str:
        return str(self.kv.type)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "watching"
        return f"<labkv Monitor {state} {self._title()}: {self.model.events_seen} events>"

    def _ipython_display_(self) -> None:
        from IPython.display import display

        try:
            widget = self.widget
        except ImportError as exc:  # no ipywidgets: the text, and what to install
            print(f"{self}\n\n{exc}")
            return
        _load_bokehjs()
        display(widget)
