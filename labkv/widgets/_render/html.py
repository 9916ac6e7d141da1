"""HTML rendering of the monitor's sections: every string is escaped here.

This is the one place text from events (key names, op names, anything a
server sent) turns into markup, so escaping it here makes every view safe.

>>> table_html(["key"], [["<img src=x onerror=alert(1)>"]], "labkv-keys")
'<table class="labkv-table labkv-keys"><thead><tr><th>key</th></tr></thead><tbody><tr><td>&lt;img src=x onerror=alert(1)&gt;</td></tr></tbody></table>'
"""

from __future__ import annotations

from html import escape

__all__ = ["STYLE", "esc", "table_html"]

#: Cell classes by content, so MISSING ranks stand out in the fan-in grid.
_CELL_CLASS = {"MISSING": "labkv-missing", "pushed": "labkv-pushed"}

STYLE = """<style>
.labkv-table { border-collapse: collapse; font: 12px monospace; }
.labkv-table th, .labkv-table td { border: 1px solid #ccc; padding: 1px 6px; text-align: left; white-space: nowrap; }
.labkv-table th { background: #f0f0f0; }
.labkv-missing { background: #f8c8c8; font-weight: bold; }
.labkv-pushed { background: #c8f0c8; }
.labkv-empty { color: #888; font: 12px sans-serif; }
.labkv-value-caption span, .labkv-header { white-space: nowrap; }
.labkv-legend, .labkv-legend .widget-html-content { color: #666; font: 11px/1.3 sans-serif; white-space: normal; height: auto; margin-top: 0; margin-bottom: 0; }
/* Nothing runs past the panel's edge: an event's value (a failover's replicas, a round's
   ranks), a key's last change, placement (s0[0:32000] s1[...]) and rows per call (with
   their headers) and an updater call's cells wrap at their spaces, the sections holding
   those tables shrink for it, and a section that does not fit beside another goes below
   it (scrolling in the pane). */
.labkv-log td:last-child { white-space: normal; overflow-wrap: anywhere; min-width: 16em; }
.labkv-keys td:nth-child(n+12), .labkv-keys th:nth-child(n+12), .labkv-trace td { white-space: normal; }
.widget-box:has(> .labkv-log-view, > .labkv-keys-view, > .labkv-trace-view) { flex-shrink: 1 !important; min-width: 0; }
.labkv-row { flex-wrap: wrap; }
</style>"""


def esc(value: object) -> str:
    """``str(value)``, HTML-escaped (quotes too)."""
    return escape(str(value), quote=True)


def table_html(
    headers: list[str],
    rows: list[list[str]],
    css: str,
    empty: str = "",
    cache: dict[tuple[str, ...], str] | None = None,
) -> str:
    """A table with the CSS class ``css``; ``empty`` (escaped) when there are no rows.

    With ``cache`` (a dict the caller keeps between calls), a row drawn last
    time is reused instead of escaped again; the dict then holds this call's
    rows only, so it stays as small as the table.
    """
    if not rows and empty:
        return f'<div class="labkv-empty {esc(css)}">{esc(empty)}</div>'
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    if cache is None:
        body = "".join(map(_row_html, rows))
    else:
        keys = [tuple(row) for row in rows]
        drawn = [cache.get(cells) or _row_html(cells) for cells in keys]
        cache.clear()
        cache.update(zip(keys, drawn, strict=True))
        body = "".join(drawn)
    return (
        f'<table class="labkv-table {esc(css)}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table>"
    )


def _row_html(row: list[str] | tuple[str, ...]) -> str:
    return (
        "<tr>"
        + "".join(
            f'<td class="{_CELL_CLASS[c]}">{esc(c)}</td>'
            if c in _CELL_CLASS
            else f"<td>{esc(c)}</td>"
            for c in row
        )
        + "</tr>"
    )
