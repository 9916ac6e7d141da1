"""Reading labkv's dashboard pages as a viewer does: Bokeh documents over the
scheduler's websocket, and the plots list over plain HTTP."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def plots(dashboard_link: str) -> dict[str, str]:
    """The scheduler's ``/individual-plots.json`` (what dask-labextension lists)."""
    base = dashboard_link.rsplit("/", 1)[0]
    with urllib.request.urlopen(base + "/individual-plots.json", timeout=30) as answer:
        return json.loads(answer.read())


def open_page(dashboard_link: str, path: str) -> Any:
    """A viewer's session of the page at ``path`` (close it when done)."""
    from bokeh.client import pull_session

    base = dashboard_link.rsplit("/", 1)[0]
    return pull_session(url=base + path)


def page_text(session: Any) -> str:
    """Every Div's text and every plot's title of a page's document, as the
    server last sent them."""
    from bokeh.models import Div, Plot

    document = session.document
    texts = [div.text for div in document.select({"type": Div})]
    texts += [plot.title.text for plot in document.select({"type": Plot}) if plot.title]
    return "\n".join(texts)


def read_page(dashboard_link: str, path: str) -> str:
    """:func:`page_text` of a fresh session of the page."""
    session = open_page(dashboard_link, path)
    try:
        return page_text(session)
    finally:
        session.close()
