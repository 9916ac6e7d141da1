"""One line of status, shown where the caller looks and updated in place: in a
notebook an HTML line (one ``display`` updated by its id), in a terminal a line
on stderr rewritten with ``\\r`` (and ended with a newline), and on a stderr that
is no terminal (a log file, CI) whole lines, so a log has no carriage returns.

Used by ``run``'s progress and by the long waits' notices (:mod:`.waits`).

>>> shown = []
>>> line = Line(show=shown.append)
>>> line.write("upload: 1 of 3 nodes"); line.write("upload: done"); line.end()
>>> shown
['upload: 1 of 3 nodes', 'upload: done']
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["Line"]


def _in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    try:
        ip = shell.get_ipython()
    except Exception:
        return False
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        return False


class Line:
    """A line shown in place (``show``: a callable that takes each text instead).
    ``logs`` is True where each write is a new line of a log: a caller that
    writes often should write less there."""

    def __init__(self, show: Callable[[str], None] | None = None) -> None:
        self._display: Any = None
        self._width = 0
        self.written = False
        if show is not None:
            self._show, self.logs = show, False
        elif _in_notebook():
            self._show, self.logs = self._to_notebook, False
        elif _stderr_is_tty():
            self._show, self.logs = self._to_terminal, False
        else:
            self._show, self.logs = self._to_log, True

    def write(self, text: str) -> None:
        """Show ``text`` in place of the line's last."""
        self.written = True
        self._show(text)

    def end(self) -> None:
        """The line stays as last written; a terminal's gets its newline."""
        if self.written and self._show == self._to_terminal:
            sys.stderr.write("\n")
            sys.stderr.flush()

    def _to_terminal(self, text: str) -> None:
        # spaces over what a longer last text left
        sys.stderr.write("\r" + text.ljust(self._width))
        sys.stderr.flush()
        self._width = len(text)

    def _to_log(self, text: str) -> None:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def _to_notebook(self, text: str) -> None:
        from html import escape

        from IPython.display import HTML, display

        html = HTML(f"<code>{escape(text)}</code>")
        if self._display is None:
            self._display = display(html, display_id=True)
        else:
            self._display.update(html)
