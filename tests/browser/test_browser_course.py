"""The course as a student meets it: every notebook, "Run All Cells" in JupyterLab
(real server, real kernels, Debian's chromium through Playwright).

One JupyterLab serves copies of ``notebooks/``, ``docs/`` and the README (rooted
as the README's command roots it); each notebook runs in its own kernel, which is
shut down before the next one starts. After Run All, for each notebook:

- every code cell ran, and no cell shows an error or stderr output, except cells
  tagged ``raises-exception`` (the ones a notebook means to show);
- where the notebook shows a monitor, it is still on the page with its keys
  table filled (ending a monitor leaves its last picture);
- JupyterLab's log console holds no warning or error (e.g. ``No such comm``);
- every exercise check (cells tagged ``check``) reports ``not yet``: nothing
  solved the exercise for the student;
- the monitor is compact (each of its tabs under 480 px) and its value plot is
  drawn when its tab is shown;
- a clocks panel shown on its own (``mon.show("clocks")``, notebook 05's dist_ssp
  run with a slow rank) has its rows, and the fast rank is the one that waited;
- notebook 05: the dist_ssp run's monitor, left open, draws its timeline tab, and the
  slow round's fan-in snapshot (rank 1 ``MISSING``) is printed;
- notebook 04: the server table of the S = 2 run, shown on its own, has both servers
  with the same final bytes in and out (the S = 1 run's has one server);
- notebook 08: the first monitor's events tab, its op filter set to ``failover``, shows
  the failover row whole: the server's replicas now, the surviving worker's address
  first (the one the notebook printed), not cut at the monitor's edge; set to ``pull``,
  it shows the training's one pull, none of the wait for the re-seed;
- in every monitor's servers & rounds tab, the rounds heat map is drawn while a round
  waits and hidden, the line above the grid saying every round is complete, once none
  does (no empty grey box);
- notebook 11: the keys table shows as many bytes pushed as pulled for each table
  (every push's rows are pulled again, and the pieces of both servers are counted).

Screenshots of each notebook's monitor (the keys tab, and each tab), of its page,
and a JSON report (cells, log entries, run time) go to ``artifacts/screenshots/``
(``LABKV_ARTIFACTS`` moves it), a CI artifact.
Locally the test skips without chromium or playwright; under ``CI`` it fails.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest

from tests.browser._lab import (
    CHROME_ARGS,
    CHROMIUM,
    KERNEL_IDLE,
    LOG_ENTRIES,
    RUN_ALL,
    require_browser,
    start_lab,
    stop_lab,
)

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9]*.ipynb"))
ARTIFACTS = Path(os.environ.get("LABKV_ARTIFACTS", REPO / "artifacts")) / "screenshots"
RUN_TIMEOUT_S = 240  # per notebook, only stops a hang; each takes 3-30 s here

# Run All is over when the kernel is idle, no cell waits, and the last code cell
# ran (or a cell failed, which stops Run All).
DONE = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext.session && w.sessionContext.session.kernel;
  if (!k || k.status !== 'idle') return false;
  const cells = w.content.widgets.filter(c => c.model.type === 'code');
  if (cells.some(c => c.model.executionState === 'running' || (c.promptNode && c.promptNode.textContent.includes('*')))) return false;
  const last = cells[cells.length - 1];
  const failed = cells.some(c => c.model.outputs.toJSON().some(o => o.output_type === 'error'));
  return failed || (last && last.model.executionCount !== null);
}"""

# Every code cell of the open notebook: tags, execution count and outputs.
CELLS = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  return w.content.widgets.map((c, i) => ({index: i, type: c.model.type,
    tags: c.model.getMetadata('tags') || [],
    count: c.model.type === 'code' ? c.model.executionCount : null,
    source: c.model.sharedModel.getSource().slice(0, 80),
    outputs: c.model.type === 'code' ? c.model.outputs.toJSON() : []}));
}"""

# The monitor on the page: shown, and its keys table's rows.
MONITOR = """() => {
  const roots = [...document.querySelectorAll('.labkv-monitor')];
  const shown = roots.filter(r => r.offsetParent !== null && r.getBoundingClientRect().height > 0);
  const keys = shown.length ? shown[0].querySelectorAll('.labkv-keys tbody tr').length : 0;
  const errors = document.querySelectorAll('.jupyter-widgets-error-widget').length;
  const clocks = [...document.querySelectorAll('.labkv-part .labkv-clocks tbody tr')]
      .map(tr => [...tr.children].map(td => td.textContent));
  return {roots: roots.length, shown: shown.length, keys, errors, clocks};
}"""


def _text(output: dict) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    if output.get("output_type") == "error":
        return f"{output.get('ename')}: {output.get('evalue')}"
    return str(output.get("data", {}).get("text/plain", ""))


def _shows_monitor(path: Path) -> bool:
    nb = nbformat.read(path, as_version=4)
    return any("monitor(" in c.source for c in nb.cells if c.cell_type == "code")


def _shows_clocks(path: Path) -> bool:
    nb = nbformat.read(path, as_version=4)
    return any('.show("clocks")' in c.source for c in nb.cells if c.cell_type == "code")


def _waited(cell: str) -> float:
    """A rank's total wait from its cell of the clocks panel ("25 · waited 0.42 s ...")."""
    found = re.search(r"waited ([0-9.]+) s", cell)
    return float(found.group(1)) if found else 0.0


def _readme_lab_options() -> tuple[str, ...]:
    """The options of the README's ``jupyter lab`` command (its set-up's first line)."""
    setup = (REPO / "README.md").read_text().split("## Set up", 1)[1]
    first = re.search(r"```bash\n(.*?)\n", setup).group(1)
    lab = first.split("&&")[-1].split()
    return tuple(arg for arg in lab if arg.startswith("--"))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """One JupyterLab over a copy of the repository's course, and one chromium."""
    require_browser()
    from playwright.sync_api import sync_playwright

    root = tmp_path_factory.mktemp("course")
    shutil.copytree(REPO / "notebooks", root / "notebooks", ignore=shutil.ignore_patterns(".*"))
    shutil.copytree(REPO / "docs", root / "docs")
    shutil.copy(REPO / "README.md", root / "README.md")
    token = secrets.token_hex(16)
    proc, base = start_lab(root, token, env={"LABKV_SMALL_DATA": "1"}, args=_readme_lab_options())
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROME_ARGS, headless=True)
            yield {"base": base, "token": token, "browser": browser, "root": root}
            browser.close()
    finally:
        stop_lab(proc)
        shutil.copy(root / "jupyter.log", ARTIFACTS / "jupyter.log")


#: how far the shown tab's content runs past the monitor's right edge (or the output
#: area's, if narrower), in px, and what does: each of its elements, scrolled into
#: view or not (a pane that scrolls sideways hides a table's last columns all the same)
_CUT = """root => {
  const outer = root.closest('.jp-OutputArea-output') || root;
  const right = Math.min(root.getBoundingClientRect().right, outer.getBoundingClientRect().right);
  const skip = [...root.querySelectorAll('.labkv-header, .labkv-legend, .lm-TabBar')];
  let past = 0, what = '';
  for (const el of root.querySelectorAll('*')) {
    if (!el.offsetWidth || !el.offsetHeight || skip.some(h => h.contains(el))) continue;
    const over = el.getBoundingClientRect().right - right;
    if (over > past) { past = over; what = el.tagName + '.' + String(el.className).slice(0, 80); }
  }
  return [Math.round(past), what];
}"""


#: the fan-in line of a monitor's shown tab and whether the rounds heat map is on screen
ROUNDS = """root => {
  const line = [...root.querySelectorAll('.labkv-fanin-note')].find(e => e.offsetWidth > 0);
  const heat = [...root.querySelectorAll('.labkv-heatmap')].some(
      e => e.offsetWidth > 0 && e.offsetHeight > 0);
  return {line: line ? line.textContent : null, heat};
}"""

#: the keys table of a monitor: each row's cells by the table's headers
KEY_ROWS = """root => {
  const table = root.querySelector('table.labkv-keys');
  if (!table) return [];
  const heads = [...table.querySelectorAll('thead th')].map(th => th.textContent.trim());
  return [...table.querySelectorAll('tbody tr')].map(tr => Object.fromEntries(
      [...tr.children].map((td, i) => [heads[i], td.textContent.trim()])));
}"""


def _visit_tabs(page, box, stem: str) -> list[dict]:
    """Show each tab of the monitor in turn (a screenshot of each), then the first
    again; per tab its title, height and how many plot canvases are drawn."""
    tabs = box.locator(".lm-TabBar-tab")
    seen = []
    for i in range(tabs.count()):
        tabs.nth(i).click()
        page.wait_for_timeout(600)
        canvases = box.locator("canvas").evaluate_all(
            "els => els.filter(e => e.offsetWidth > 0 && e.offsetHeight > 0).length"
        )
        title = tabs.nth(i).inner_text().strip()
        right = box.bounding_box()["x"] + box.bounding_box()["width"]
        # tables drawn past the monitor's right edge (their text cut there), in px
        past = box.locator("table").evaluate_all(
            "(els, right) => Math.max(0, ...els.filter(e => e.offsetWidth > 0)"
            ".map(e => e.getBoundingClientRect().right - right))",
            right,
        )
        seen.append(
            {
                "title": title,
                "height": box.bounding_box()["height"],
                "plots": canvases,
                "past": past,
                "cut": box.evaluate(_CUT),
                "rounds": box.evaluate(ROUNDS),
            }
        )
        box.screenshot(path=str(ARTIFACTS / f"{stem}-tab{i}.png"))
    if seen:
        tabs.nth(0).click()
        page.wait_for_timeout(300)
    return seen


def _ssp_timeline(page, stem: str) -> dict:
    """Notebook 05: open the timeline tab of the last monitor on the page (the dist_ssp
    run's, left open) and report its drawn plots and text (a screenshot of it too)."""
    box = page.locator(".labkv-monitor").last
    box.scroll_into_view_if_needed()
    box.locator(".lm-TabBar-tab", has_text="timeline").click()
    page.wait_for_timeout(1500)
    plots = box.locator("canvas").evaluate_all(
        "els => els.filter(e => e.offsetWidth > 0 && e.offsetHeight > 0).length"
    )
    box.screenshot(path=str(ARTIFACTS / f"{stem}-ssp-timeline.png"))
    # the outputs of the slow round (its printed fan-in), the race and its plots, for a look
    cells = (("while rank 1 slept", "fan-in"), ("final excess loss", "race"))
    for text, name in (*cells, ("show(row(*plots))", "race-plots")):
        out = page.locator(".jp-CodeCell", has_text=text).first.locator(".jp-Cell-outputWrapper")
        out.scroll_into_view_if_needed()
        page.wait_for_timeout(500)
        out.screenshot(path=str(ARTIFACTS / f"{stem}-{name}.png"))
    return {"plots": plots, "text": box.inner_text()[:1000]}


#: the server tables of the parts shown on their own (``mon.show("servers")``), in
#: page order: each table's rows, as the text of their cells
SERVER_PARTS = """() => [...document.querySelectorAll('.labkv-part table.labkv-servers')].map(
  t => [...t.querySelectorAll('tbody tr')].map(tr => [...tr.children].map(td => td.textContent)))"""

#: the event log's rows in a monitor: the text of each row and how far (px) its cells run
#: past the monitor's right edge, or past their own box (text cut off inside a cell)
LOG_ROWS = """(root) => {
  const right = root.getBoundingClientRect().right;
  return [...root.querySelectorAll('table.labkv-log tbody tr')].filter(tr => tr.offsetWidth > 0)
    .map(tr => ({text: tr.textContent, cells: [...tr.children].map(td => td.textContent),
                 past: Math.max(0, ...[...tr.children].map(td => Math.max(
                     td.getBoundingClientRect().right - right, td.scrollWidth - td.clientWidth)))}));
}"""


def _failover_rows(page, stem: str) -> dict:
    """Notebook 08: the first monitor's (the replicated run's) events tab, with its op
    filter set to ``failover`` where the tab has one; its log rows (a screenshot too)."""
    box = page.locator(".labkv-monitor").first
    box.scroll_into_view_if_needed()
    box.locator(".lm-TabBar-tab", has_text="events").click()
    page.wait_for_timeout(600)
    select = box.locator("select", has=page.locator("option", has_text="failover"))
    filtered = select.count() > 0
    if filtered:
        select.first.select_option(label="failover")
        page.wait_for_timeout(2000)  # the kernel redraws the log at its next refresh
    box.screenshot(path=str(ARTIFACTS / f"{stem}-failover.png"))
    rows = box.evaluate(LOG_ROWS)
    pulls = None
    has_pulls = select.first.locator("option", has_text="pull").count() > 0 if filtered else False
    if has_pulls:  # the pulls in the log: the training's, not the wait's for the re-seed
        select.first.select_option(label="pull")
        page.wait_for_timeout(2000)
        pulls = box.evaluate(LOG_ROWS)
        box.screenshot(path=str(ARTIFACTS / f"{stem}-pulls.png"))
    return {"filtered": filtered, "rows": rows, "pulls": pulls}


def _calls(rows: list[dict], op: str) -> int:
    """How many ``op`` calls the event log's rows hold (``pull ×3`` is three)."""
    found = [re.fullmatch(rf"{op}(?: ×(\d+))?", r["cells"][1].strip()) for r in rows]
    return sum(int(m.group(1) or 1) for m in found if m)


def _shut_down_kernels(base: str, token: str) -> None:
    """Shut every kernel of the server down (the notebook's cluster with it)."""
    url = f"{base}/api/sessions?token={token}"
    with urllib.request.urlopen(url, timeout=10) as r:
        sessions = json.load(r)
    for s in sessions:
        req = urllib.request.Request(
            f"{base}/api/sessions/{s['id']}?token={token}", method="DELETE"
        )
        urllib.request.urlopen(req, timeout=30).close()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def test_the_readme_command_opens_the_first_notebook_with_docs_at_hand(lab):
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        opener.open(f"{lab['base']}/?token={lab['token']}", timeout=10)
        location = None
    except urllib.error.HTTPError as redirect:
        location = redirect.headers["Location"]
    assert location and location.split("?")[0].endswith(
        f"/lab/tree/notebooks/{NOTEBOOKS[0].name}"
    ), location
    with urllib.request.urlopen(f"{lab['base']}/api/contents?token={lab['token']}") as r:
        names = {item["name"] for item in json.load(r)["content"]}
    assert {"README.md", "docs", "notebooks"} <= names, names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem.split("_")[0] for p in NOTEBOOKS])
def test_run_all_cells(lab, path):
    page = lab["browser"].new_page(viewport={"width": 1400, "height": 1400})
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    stem = path.stem
    try:
        # A workspace of its own: the default one would reopen (and start kernels
        # for) the notebooks of the tests before.
        page.goto(
            f"{lab['base']}/lab/workspaces/{stem.split('_')[0]}/tree/notebooks/{path.name}"
            f"?token={lab['token']}",
            wait_until="domcontentloaded",
        )
        page.wait_for_function(KERNEL_IDLE, timeout=90_000)
        start = time.monotonic()
        page.evaluate(RUN_ALL)
        page.wait_for_timeout(1000)
        page.wait_for_function(DONE, timeout=RUN_TIMEOUT_S * 1000, polling=250)
        seconds = time.monotonic() - start
        page.wait_for_timeout(1500)  # the monitors' last ticks and any late kernel message
        monitor = page.evaluate(MONITOR)
        if monitor["shown"]:
            box = page.locator(".labkv-monitor").first
            box.scroll_into_view_if_needed()
            page.wait_for_timeout(500)
            monitor["height"] = box.bounding_box()["height"]
            monitor["tabs"] = _visit_tabs(page, box, stem)
            monitor["key_rows"] = box.evaluate(KEY_ROWS)
            box.screenshot(path=str(ARTIFACTS / f"{stem}.png"))
        if stem.startswith("05_"):  # notebook 05: the SSP run's monitor (the last) is left open
            monitor["ssp_timeline"] = _ssp_timeline(page, stem)
        if stem.startswith("08_"):  # notebook 08: the failover in the first monitor's log
            monitor["failover"] = _failover_rows(page, stem)
        monitor["server_parts"] = page.evaluate(SERVER_PARTS)
        parts = page.locator(".labkv-part")  # the parts shown alone (mon.show), last pictures
        for i in range(parts.count()):
            parts.nth(i).scroll_into_view_if_needed()
            parts.nth(i).screenshot(path=str(ARTIFACTS / f"{stem}-part{i}.png"))
        page.screenshot(path=str(ARTIFACTS / f"{stem}-page.png"))
        page.wait_for_timeout(500)  # messages the scrolling made the views send
        cells = page.evaluate(CELLS)
        logs = page.evaluate(LOG_ENTRIES)
    finally:
        page.close()
        _shut_down_kernels(lab["base"], lab["token"])
    report = {"seconds": round(seconds, 1), "monitor": monitor, "logs": logs, "console": console}
    (ARTIFACTS / f"{stem}.json").write_text(json.dumps({**report, "cells": cells}, indent=1))

    code = [c for c in cells if c["type"] == "code"]
    not_run = [c["index"] for c in code if c["count"] is None]
    assert not not_run, f"cells {not_run} did not run (a cell before them failed?)"
    noise = [
        (c["index"], _text(o)[:300])
        for c in code
        if "raises-exception" not in c["tags"]
        for o in c["outputs"]
        if o["output_type"] == "error" or (o["output_type"] == "stream" and o["name"] == "stderr")
    ]
    assert not noise, f"error or stderr output in cells: {noise}"
    bad_logs = [e for e in logs if e["level"] in ("warning", "error", "critical")]
    assert not bad_logs, f"{len(bad_logs)} log console entries, first: {bad_logs[:3]}"
    # How long Run All takes is a speed goal, not a test: bench/runall.py measures it
    # (the seconds are also in this notebook's JSON report).
    if _shows_monitor(path):
        assert monitor["shown"] >= 1, f"no monitor on the page after Run All: {monitor}"
        assert monitor["keys"] >= 1, f"the monitor's keys table is empty: {monitor}"
        # compact: one line and the tabs, so it stays on screen while later cells run
        assert all(tab["height"] <= 480 for tab in monitor["tabs"]), monitor
        value_tab = next(t for t in monitor["tabs"] if t["title"].startswith("value"))
        assert value_tab["plots"] >= 1, f"the value plot is not drawn: {monitor}"
        timeline_tab = next(t for t in monitor["tabs"] if t["title"] == "timeline")
        assert timeline_tab["plots"] >= 1, f"the timeline is not drawn: {monitor}"
        events_tab = next(t for t in monitor["tabs"] if t["title"] == "events")
        assert events_tab["past"] <= 1, f"the event log is cut at the monitor's edge: {monitor}"
        # every tab's content fits in the monitor, or scrolls inside it (none cut at its edge)
        cut = {t["title"]: t["cut"] for t in monitor["tabs"] if t["cut"][0] > 1}
        assert not cut, f"tabs run past the monitor's right edge (px, element): {cut}"
        assert (ARTIFACTS / f"{stem}.png").stat().st_size > 5_000
        rounds = next(t for t in monitor["tabs"] if t["title"].startswith("servers"))["rounds"]
        if rounds["line"] and rounds["line"].startswith("every round complete"):
            assert not rounds["heat"], f"an all-grey heat map with no round waiting: {rounds}"
        elif rounds["line"] and "waiting" in rounds["line"]:
            assert rounds["heat"], f"rounds wait, and no heat map shows them: {rounds}"
    if _shows_clocks(path):  # a dist_ssp run with rank 1 slow on purpose, watched live
        assert monitor["clocks"], f"the clocks panel shown alone has no rows: {monitor}"
        row = monitor["clocks"][0]
        assert len(row) >= 6, row  # key, staleness, slowest, spread, then a cell per rank
        assert _waited(row[4]) > _waited(row[5]), f"the fast rank 0 should do the waiting: {row}"
    assert monitor["errors"] == 0, "a widget failed to render"
    if stem.startswith("05_"):  # what notebook 05's text promises after Run All
        timeline = monitor["ssp_timeline"]
        assert timeline["plots"] >= 1 and "no events yet" not in timeline["text"], (
            f"the SSP run's timeline is not drawn: {timeline}"
        )
        printed = "".join(
            _text(o) for c in code for o in c["outputs"] if o["output_type"] == "stream"
        )
        assert "MISSING" in printed, (
            "the slow round's fan-in snapshot (rank 1 MISSING) is not printed"
        )
    if stem.startswith("04_"):  # the S = 1 and S = 2 runs' server tables, last pictures
        tables = monitor["server_parts"]
        assert [len(rows) for rows in tables] == [1, 2], f"the S = 1 and S = 2 tables: {tables}"
        s2 = tables[1]
        assert s2[0][2:4] == s2[1][2:4] and s2[0][2] != "0 B", (
            f"the two servers of S = 2 should end with the same bytes in and out: {s2}"
        )
    if stem.startswith("08_"):  # the failover row, whole, with the worker it now runs on
        printed = "".join(
            _text(o) for c in code for o in c["outputs"] if o["output_type"] == "stream"
        )
        primary = re.search(r"the primary now: (\S+)", printed).group(1)
        rows = monitor["failover"]["rows"]
        row = next(
            (r for r in rows if "failover" in r["text"] and "replicas now" in r["text"]), None
        )
        assert row is not None, f"no failover row in the events tab: {monitor['failover']}"
        assert primary in row["text"], (primary, row)
        assert "(primary first)" in row["text"] and row["past"] <= 1, (
            f"the failover row is cut off: {row}"
        )
    if stem.startswith("08_"):  # the wait for the re-seed makes no call of its own
        pulls = monitor["failover"]["pulls"]
        assert monitor["failover"]["filtered"] and _calls(pulls or [], "pull") <= 1, (
            f"pulls other than the training's one in the event log: {pulls}"
        )
    if stem.startswith("11_"):  # the rows pushed are pulled again: the same bytes
        tables = {r.get("key"): r for r in monitor["key_rows"]}
        for key in ("users", "items"):
            row = tables[key]
            assert row["pushed"] == row["pulled"] and row["pushed"] != "0 B", row
    checks = [c for c in code if "check" in c["tags"]]
    assert checks, "no exercise check cell (tagged 'check')"
    for c in checks:
        out = "".join(_text(o) for o in c["outputs"])
        assert "not yet" in out and ": correct" not in out, (c["index"], out)
