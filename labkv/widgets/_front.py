"""The front end of a :class:`~labkv.widgets.Monitor`: its dashboard, built on
first use, and the parts of it shown alone (:meth:`FrontEnd.show`,
:meth:`FrontEnd.view`). ipywidgets and bokeh are imported only here, when a
monitor is displayed."""

from __future__ import annotations

from typing import Any

__all__ = ["FrontEnd", "require_widgets"]

#: What to install for the dashboard (ipywidgets, bokeh and jupyter_bokeh).
INSTALL_HINT = "pip install 'labkv[lab]'"


def require_widgets() -> None:
    """Raise an ImportError naming the extra to install when ipywidgets is missing.

    >>> require_widgets()  # ipywidgets comes with labkv[lab]
    """
    try:
        import ipywidgets  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"the monitor's dashboard needs ipywidgets ({exc}): {INSTALL_HINT} installs "
            "it with bokeh and jupyter_bokeh; print(monitor) shows the text summary meanwhile"
        ) from exc


class FrontEnd:
    """The :class:`~labkv.widgets.Monitor` methods that build and show its
    dashboard. They use the monitor's ``_dashboard`` (``None`` until built),
    ``_value``, ``_rows``, ``_ticker``, ``_refresh_lock``, ``closed`` and
    ``refresh``."""

    @property
    def dashboard(self) -> Any:
        """The dashboard's widgets once :attr:`widget` was built (else ``None``): a
        :class:`~labkv.widgets._views.Dashboard` whose ``header``, ``keys``, ``log``,
        ``trace``, ``fanin``, ``clocks``, ``servers`` and ``value_caption`` hold the
        HTML the page shows, ``tabs`` the tab it shows, ``key_filter``, ``op_filter``
        and ``value_key`` the choices. Only the shown tab is redrawn at each refresh.

        >>> import labkv
        >>> from labkv.widgets import Monitor
        >>> Monitor(labkv.create()).dashboard is None
        True
        """
        return self._dashboard

    @property
    def widget(self) -> Any:
        """The dashboard's root ipywidget (built on first use; starts the refresh thread)."""
        if self._dashboard is None:
            require_widgets()
            from ._views import Dashboard, ValueState

            with self._refresh_lock:
                self._value = ValueState()
                self._dashboard = Dashboard(rows=self._rows)
                self._dashboard.tabs.observe(self._tab_shown, names="selected_index")
            self.refresh()
        if not self.closed:
            self._ticker.start()
        return self._dashboard.root

    def _tab_shown(self, _change: Any) -> None:
        # Draw the tab now shown: a refresh skipped its plots while it was hidden,
        # and sends again a plot the page may lack (see _plots.BokehWidget).
        self.refresh()

    def show(self, part: str) -> None:
        """Display one part of the dashboard in this cell, under its one-line
        header: ``"keys"``, ``"updates"`` (updater calls), ``"fan-in"`` (dist_sync
        rounds), ``"clocks"`` (dist_ssp), ``"servers"`` (server load table) or
        ``"events"``. It shows the dashboard's own widgets, so it keeps updating
        with the monitor and keeps its last picture after :meth:`close`. An
        unknown name raises ``ValueError`` naming the parts.

        >>> import labkv
        >>> from labkv.widgets import Monitor
        >>> mon = Monitor(labkv.create("dist_sync", num_servers=2))  # doctest: +SKIP
        >>> mon.show("fan-in")  # the grid, where a round waits  # doctest: +SKIP
        >>> Monitor(labkv.create()).show("fanin")
        Traceback (most recent call last):
        ...
        ValueError: no part 'fanin' of the monitor; the parts are 'keys', 'updates', 'fan-in', 'clocks', 'servers', 'events'
        """
        from IPython.display import display

        display(self.view(part))

    def view(self, part: str) -> Any:
        """The widget :meth:`show` displays (a new one each call, for a layout of
        one's own); from now on the part's tab is drawn at every refresh.

        >>> import labkv, numpy as np
        >>> from labkv.widgets import Monitor
        >>> mon = Monitor(labkv.create(), hz=20)
        >>> part = mon.view("keys")
        >>> part.children[1] is mon.dashboard.header
        True
        >>> mon.kv.init("w", np.zeros(2)); mon.refresh()
        >>> "<td>w</td>" in mon.dashboard.keys.value
        True
        >>> mon.close()
        """
        from ._parts import check_part

        check_part(part)
        _ = self.widget  # builds the dashboard (and starts the refresh thread) if need be
        with self._refresh_lock:
            view = self._dashboard.part(part)
        self.refresh()
        return view
