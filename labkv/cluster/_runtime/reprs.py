"""A cluster handle as a notebook shows it: ``ClusterHandle._repr_html_``.

Its address, kind (embedded or attached), dashboard link (and labkv's pages
on it, :mod:`labkv.dashboard`), and one row per node (the scheduler and each
worker) with the labkv, wire protocol and numpy it runs and the verdict of
labkv's check (:mod:`.compat`), asked of the nodes as the repr is drawn (at
most :data:`~.compat.CHECK_TIMEOUT_S`). Rendering never raises: a scheduler
that cannot be reached becomes a line that says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...widgets._render.html import STYLE, esc, table_html

if TYPE_CHECKING:
    from .connect import ClusterHandle

__all__ = ["handle_html", "node_rows"]


def node_rows(found: dict[str, dict[str, Any]]) -> list[list[str]]:
    """One row per node's probe result: node, labkv, protocol, numpy, check.

    >>> from labkv.cluster._runtime.compat import labkv_probe
    >>> node_rows({"scheduler": labkv_probe()})[0][-1]
    'ok'
    >>> node_rows({"tcp://w:1": {"labkv_error": "ModuleNotFoundError"}})[0][-1]
    'no labkv (ModuleNotFoundError)'
    """
    from .compat import mismatch

    rows = []
    for node, answer in found.items():
        verdict = answer.get("unanswered") or mismatch(answer) or "ok"
        rows.append(
            [
                node,
                str(answer.get("labkv", "-")),
                str(answer.get("protocol", "-")),
                str(answer.get("numpy", "-")),
                verdict,
            ]
        )
    return rows


def _link(url: str, text: str) -> str:
    return f'<a href="{esc(url)}" target="_blank">{esc(text)}</a>'


def handle_html(handle: ClusterHandle) -> str:
    """The HTML a notebook shows for ``handle``."""
    kind = "embedded LocalCluster" if handle.cluster is not None else "attached"
    if handle._closed:
        return STYLE + f"<div><b>labkv.cluster.ClusterHandle</b> {esc(kind)} · closed</div>"
    lines = []
    try:
        address = handle.address
        workers = handle.workers()
    except Exception as exc:
        return STYLE + (
            f"<div><b>labkv.cluster.ClusterHandle</b> {esc(kind)}: the scheduler "
            f"could not be reached ({esc(exc)})</div>"
        )
    lines.append(
        f"<div><b>labkv.cluster.ClusterHandle</b> {esc(kind)} · scheduler "
        f"<code>{esc(address)}</code> · {len(workers)} workers</div>"
    )
    link = handle.dashboard_link
    if link:
        from ...dashboard import urls

        pages = " · ".join(_link(u, u.rsplit("-", 1)[1]) for u in urls(handle))
        lines.append(f"<div>dashboard: {_link(link, link)} · labkv pages: {pages}</div>")
    else:
        lines.append("<div>no dashboard</div>")
    from .compat import probe

    try:
        found = probe(handle, workers)
    except Exception as exc:
        lines.append(f'<div class="labkv-empty">labkv\'s check not run: {esc(exc)}</div>')
    else:
        headers = ["node", "labkv", "protocol", "numpy", "check"]
        lines.append(table_html(headers, node_rows(found), "labkv-repr-nodes"))
    return STYLE + '<div class="labkv-repr">' + "".join(lines) + "</div>"
