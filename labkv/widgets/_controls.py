"""The small widgets the dashboard is built of: an HTML view, a titled section,
a scrolling pane, a trait writer that sends only what changed, and the
prev / next pager of a view with more rows than it shows.

Imported only with the dashboard (it needs ipywidgets).
"""

from __future__ import annotations

from typing import Any

import ipywidgets as W

from ._render.html import esc

__all__ = ["PANE_HEIGHT", "Pager", "html_view", "pane", "section", "set_traits"]

PANE_HEIGHT = "360px"


def set_traits(widget: W.Widget, **traits: Any) -> bool:
    """Write the traits that differ, as one message; returns whether anything was sent."""
    changed = {k: v for k, v in traits.items() if getattr(widget, k) != v}
    if not changed:
        return False
    with widget.hold_sync():
        for name, value in changed.items():
            setattr(widget, name, value)
    return True


def html_view(css: str) -> W.HTML:
    """An empty HTML widget with the CSS class ``css``."""
    widget = W.HTML()
    widget.add_class(css)
    return widget


def section(title: str, *children: W.Widget) -> W.VBox:
    """``children`` under a bold ``title``."""
    # flex none: a wide table beside a section scrolls the pane, never squeezes the plot
    layout = W.Layout(margin="4px 8px", flex="none")
    return W.VBox([W.HTML(f"<b>{esc(title)}</b>"), *children], layout=layout)


def pane(child: W.Widget) -> W.Box:
    """``child`` at most :data:`PANE_HEIGHT` tall, scrolling inside."""
    return W.Box([child], layout=W.Layout(max_height=PANE_HEIGHT, overflow="auto"))


class Pager:
    """Prev / next over the pages of one view; hidden while there is one page.
    A click only turns :attr:`page` and marks the pager ``dirty`` (the kernel's
    thread): the refresh thread draws the page and calls :meth:`show`.

    >>> pager = Pager("labkv-keys-pages")
    >>> pager.turn(1); pager.page, pager.dirty
    (1, True)
    >>> pager.show(1, 3, "keys 51-100 of 150"); pager.dirty, pager.next.disabled
    (False, False)
    >>> pager.show(2, 3, ""); pager.next.disabled, pager.box.layout.display
    (True, None)
    >>> pager.show(0, 1, ""); pager.box.layout.display
    'none'
    """

    def __init__(self, css: str) -> None:
        self.page = 0
        self.dirty = False
        small = W.Layout(width="36px")
        self.prev = W.Button(description="◀", tooltip="previous page", layout=small)
        self.next = W.Button(description="▶", tooltip="next page", layout=small)
        self.label = html_view("labkv-page")
        self.box = W.HBox([self.prev, self.next, self.label], layout=W.Layout(display="none"))
        self.box.add_class(css)
        self.prev.on_click(lambda _: self.turn(-1))
        self.next.on_click(lambda _: self.turn(1))

    def turn(self, step: int) -> None:
        """Go ``step`` pages on (the drawing keeps the page within those there are)."""
        self.page = max(0, self.page + step)
        self.dirty = True

    def show(self, page: int, pages: int, caption: str) -> None:
        """What was drawn: page ``page`` of ``pages``, and what it shows."""
        self.page, self.dirty = page, False
        set_traits(self.prev, disabled=page == 0)
        set_traits(self.next, disabled=page >= pages - 1)
        set_traits(self.label, value=f'<span class="labkv-empty">{esc(caption)}</span>')
        set_traits(self.box.layout, display=None if pages > 1 else "none")
