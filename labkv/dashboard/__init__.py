"""labkv's pane in the Dask dashboard (and in dask-labextension).

Four Bokeh pages served by the scheduler, listed in its ``/individual-plots.json``
(so dask-labextension shows a button for each), that anyone who reaches the
dashboard can open, in as many tabs as they like:

- ``/individual-labkv-rounds``: who holds the dist_sync rounds up, over each
  key's round per rank (``pushed`` / ``MISSING``);
- ``/individual-labkv-servers``: per server its device, bytes in and out, keys
  and bytes held, and its replicas (primary first);
- ``/individual-labkv-keys``: the 40 busiest keys (calls, bytes, value
  summary, last change, placement);
- ``/individual-labkv-timeline``: the last 5 s of spans per rank and server.

A scheduler plugin (:class:`LabkvDashboard`) folds the events a watched store's
servers and ranks already send the scheduler, once, whatever the number of
viewers (see ``docs/dashboard.md``). Where it runs:

- the embedded cluster of :func:`labkv.cluster.connect` has it;
- a CLI scheduler: ``dask scheduler --preload labkv.dashboard`` (or Dask config
  ``distributed.scheduler.preload: [labkv.dashboard]``);
- a scheduler started without it: :func:`watch` adds the plugin, but its pages
  cannot be added any more, and :func:`watch` warns with what to do.

A store streams its events while something watches it: :func:`watch` (no
notebook widget needed) or :func:`labkv.widgets.monitor`.

>>> import labkv, labkv.dashboard  # doctest: +SKIP
>>> kv = labkv.create("dist_sync", num_servers=2)  # doctest: +SKIP
>>> w = labkv.dashboard.watch(kv)  # doctest: +SKIP
>>> w.urls[0]  # doctest: +SKIP
'http://127.0.0.1:8787/individual-labkv-rounds'
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Any

from ..cluster._transport.scheduler import forget_topic
from ._forward import Forward
from ._plugin import NAME, LabkvDashboard

__all__ = [
    "PATHS",
    "LabkvDashboard",
    "Watch",
    "dask_setup",
    "install",
    "register_pages",
    "watch",
]

logger = logging.getLogger("labkv.dashboard")

#: the pages' paths on the scheduler's dashboard
PATHS = (
    "/individual-labkv-rounds",
    "/individual-labkv-servers",
    "/individual-labkv-keys",
    "/individual-labkv-timeline",
)

HOW_TO = (
    "start the scheduler with `dask scheduler --preload labkv.dashboard` "
    "(or Dask config distributed.scheduler.preload: [labkv.dashboard])"
)


def register_pages() -> bool:
    """Add the pages to Dask's dashboard applications (each only if absent):
    every scheduler this process starts from now on serves and lists them.
    False (with a log record) when Dask's dashboard cannot be imported (bokeh
    missing or of a version Dask refuses).

    >>> register_pages()
    True
    >>> from distributed.dashboard.scheduler import applications
    >>> "/individual-labkv-rounds" in applications
    True
    """
    try:
        from distributed.dashboard.scheduler import applications

        from ._pages import PAGES
    except ImportError as exc:
        logger.info("labkv's dashboard pages are off: %s", exc)
        return False
    for path, page in PAGES.items():
        applications.setdefault(path, page)
    return True


def _install_on_scheduler(dask_scheduler: Any = None) -> dict[str, Any]:
    """Run on the scheduler: add the plugin unless there, and say whether its
    dashboard lists the pages."""
    if NAME not in dask_scheduler.plugins:
        dask_scheduler.add_plugin(LabkvDashboard(), name=NAME)
    listed = False
    app = getattr(dask_scheduler, "http_application", None)
    for tornado in getattr(app, "applications", []):
        paths = getattr(tornado, "app_paths", None)
        if paths is not None:
            listed = all(p in paths for p in PATHS)
            break  # Dask lists the first Bokeh application's pages only
    return {"listed": listed}


def dask_setup(scheduler: Any) -> None:
    """The preload hook (``dask scheduler --preload labkv.dashboard``): the
    pages were registered when this module was imported, before the scheduler
    built its dashboard; this adds the plugin that feeds them."""
    if NAME not in scheduler.plugins:
        scheduler.add_plugin(LabkvDashboard(), name=NAME)


def install(handle: Any) -> bool:
    """Make sure ``handle``'s scheduler runs the plugin (a no-op where it does);
    whether its dashboard lists the pages. False with a warning naming the fix
    when the scheduler was started without the preload, or lacks labkv."""
    try:
        state = handle.client.run_on_scheduler(_install_on_scheduler)
    except Exception as exc:  # labkv (or bokeh) missing on the scheduler
        warnings.warn(
            f"labkv's dashboard pane is not on {handle.address} ({exc!r}): {HOW_TO}, "
            "or connect(address, upload=True) to ship labkv there",
            stacklevel=2,
        )
        return False
    if not state["listed"]:
        warnings.warn(
            f"the scheduler at {handle.address} was started without labkv's pages; "
            f"its plugin now folds the events, but to see them {HOW_TO}",
            stacklevel=2,
        )
    return bool(state["listed"])


def urls(handle: Any) -> list[str]:
    """The pages' URLs on ``handle``'s dashboard ([] without a dashboard)."""
    link = handle.dashboard_link
    if not link:
        return []
    base = link.rsplit("/", 1)[0]
    return [base + path for path in PATHS]


class Watch:
    """A store streaming its events to the dashboard; :meth:`close` (or the end
    of a ``with`` block) stops it. ``urls``: the pages' addresses."""

    def __init__(self, kv: Any, forward: Forward, sub: Any, urls: list[str], listed: bool):
        self.kv, self._forward, self._sub, self.urls, self.listed = kv, forward, sub, urls, listed

    def close(self) -> None:
        """Stop streaming for the dashboard (idempotent; other watchers, a
        monitor, keep theirs). What the pages show stays on them."""
        sub, self._sub = self._sub, None
        if sub is None:
            return
        with contextlib.suppress(Exception):  # a closed store, a lost server
            sub.unsubscribe()
        self._forward.close()
        with contextlib.suppress(Exception):  # the scheduler may be gone
            self.kv.handle.client.run_on_scheduler(forget_topic, self._forward.topic)

    @property
    def closed(self) -> bool:
        return self._sub is None

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "watching"
        return f"<labkv.dashboard.Watch {state} {self.kv.store_id} {self.urls[:1]}>"


def watch(kv: Any) -> Watch:
    """Stream ``kv``'s events (a cluster store made in this process) to its
    scheduler's labkv pages, with the detail a monitor asks for, until
    :meth:`Watch.close`; no notebook widget needed. The ranks of
    ``run(fn, kvstore=kv)`` stream too while it is watched. Installs the
    plugin where it is missing (see :func:`install`).

    >>> labkv.dashboard.watch(labkv.create("local"))  # doctest: +SKIP
    Traceback (most recent call last):
    ValueError: ...
    """
    handle = getattr(kv, "handle", None)
    if handle is None or not hasattr(kv, "store_id"):
        raise ValueError(
            f"labkv.dashboard.watch takes a cluster store made in this process "
            f"(labkv.create('dist_sync', ...)), not {kv!r}: a local store's events "
            "never reach a scheduler (show labkv.widgets.monitor(kv) instead)"
        )
    from ..widgets._monitor import DETAIL_BURST, DETAIL_INTERVAL

    listed = install(handle)
    forward = Forward(kv)
    # local_only: the servers' and ranks' events go to the scheduler, which folds
    # them; this process need not hear them (a monitor that does asks for them)
    sub = kv.events.subscribe(
        forward, detail_interval=DETAIL_INTERVAL, detail_burst=DETAIL_BURST, local_only=True
    )
    forward.start()
    return Watch(kv, forward, sub, urls(handle), listed)


register_pages()
