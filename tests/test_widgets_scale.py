"""The dashboard's views at many keys and ranks (issue 31): the keys table and the
fan-in a page at a time with exact totals, a busy store's log grouped, a keys x
ranks heat map drawn only while its tab is shown, and the timeline keeping the
last seconds of events rather than a count of them."""

from __future__ import annotations

import time

import numpy as np
import pytest

import labkv
from labkv.events import Event
from labkv.widgets import MonitorModel, monitor
from labkv.widgets._eventlog import GROUP_SPAN, log_view
from labkv.widgets._heatmap import MISSING, PUSHED, round_matrix
from labkv.widgets._render.format import fmt_bytes
from labkv.widgets._render.tables import KEY_ROWS
from tests.test_widgets_model import _round
from tests.test_widgets_views import show

pytest.importorskip("ipywidgets")
pytest.importorskip("jupyter_bokeh")

WORKERS, KEYS, LATE, HELD = 64, 500, 17, 42


@pytest.fixture
def watched():
    kv = labkv.create("local")
    mon = monitor(kv, hz=20)
    yield kv, mon
    mon.close()


def _rows(html: str) -> list[str]:
    """The first cell of every body row of an HTML table."""
    return [cell.split("</td>")[0] for cell in html.split("<tr><td>")[1:]]


def test_past_a_page_of_keys_the_busiest_come_first_and_the_totals_are_exact(watched):
    kv, mon = watched
    _ = mon.widget
    d = mon.dashboard
    n = KEY_ROWS * 2 + 5
    kv.init(list(range(n)), [np.zeros(2)] * n)
    for key in range(n):
        for _ in range(key % 7):
            kv.push(key, np.ones(2))
    mon.refresh()
    first = _rows(d.keys.value)
    assert len(first) == KEY_ROWS
    busiest = sorted(range(n), key=lambda k: (-(k % 7), k))
    assert first == [str(k) for k in busiest[:KEY_ROWS]]
    pushes = sum(k % 7 for k in range(n))
    caption = d.keys_pager.label.value
    assert f"keys 1-{KEY_ROWS} of {n}, the busiest first" in caption
    assert f"{pushes} pushes, 0 pulls, {fmt_bytes(pushes * 16)} pushed" in caption
    assert d.keys_pages.layout.display is None and d.keys_pager.prev.disabled
    for page in (1, 2):
        d.keys_pager.next.click()
        mon.refresh()
        shown = _rows(d.keys.value)
        assert shown == [str(k) for k in busiest[page * KEY_ROWS : (page + 1) * KEY_ROWS]]
    assert len(shown) == 5 and d.keys_pager.next.disabled
    d.keys_pager.next.click()  # past the last page: it stays there
    mon.refresh()
    assert _rows(d.keys.value) == shown and d.keys_pager.page == 2
    # every key is counted, shown or not
    assert sum(s.pushes for s in mon.model.keys.values()) == pushes


def test_a_small_store_shows_every_key_and_no_pager(watched):
    kv, mon = watched
    _ = mon.widget
    kv.init(["a", "b"], [np.zeros(2), np.zeros(2)])
    mon.refresh()
    d = mon.dashboard
    assert _rows(d.keys.value) == ["a", "b"] and d.keys_pages.layout.display == "none"


def _rounds_64(t: float) -> list[Event]:
    """A round of KEYS keys over WORKERS ranks; rank LATE missing on HELD keys."""
    events = []
    for key in range(KEYS):
        late = key % 12 == 0 and key < 12 * HELD
        pushed = [r for r in range(WORKERS) if r != LATE or not late]
        events.append(_round(key, 0, 3, pushed, WORKERS, complete=not late, t=t - key / 1e4))
    return events


def test_the_fanin_pages_through_the_waiting_keys(watched):
    kv, mon = watched
    _ = mon.widget
    d = mon.dashboard
    show(d, "servers & rounds")
    kv.events.deliver_many(_rounds_64(time.time()))
    mon.refresh()
    page1 = _rows(d.fanin.value)
    assert len(page1) == 20 and all(int(k) % 12 == 0 for k in page1)
    assert d.fanin_pages.layout.display is None
    assert "page 1 of 25" in d.fanin_pager.label.value
    d.fanin_pager.next.click()
    d.fanin_pager.next.click()
    mon.refresh()
    page3 = _rows(d.fanin.value)
    assert "keys 41-60 of 500 shown (page 3 of 25)" in d.fanin.value
    # the 42 waiting keys come first: two of them on page 3, then complete ones
    assert [int(k) % 12 == 0 for k in page3[:3]] == [True, True, False]
    assert not set(page1) & set(page3)


def test_a_busy_stores_log_is_grouped_with_exact_calls():
    model = MonitorModel()
    t = 1000.0
    for i in range(400):  # 400 events in 0.2 s, from 4 ranks and 2 servers
        server = None if i % 3 else i % 2
        model.on_event(
            Event(
                i,
                t + i / 2000,
                "dist_sync",
                "push",
                i % 50,
                rank=i % 4,
                server=server,
                nbytes=8,
                count=1 + i % 5,
            )
        )
    model.flush()
    headers, rows, caption = log_view(model, limit=30)
    assert caption.startswith("400 events of the last 0.2 s, grouped")
    assert {(r[0], r[1]) for r in rows} == {
        ("push", "ranks"),
        ("push", "server 0"),
        ("push", "server 1"),
    }
    calls = dict(zip(headers, zip(*rows, strict=True), strict=True))["calls"]
    assert sum(map(int, calls)) == sum(1 + i % 5 for i in range(400))
    # at the pace of a person, the newest events one by one
    slow = MonitorModel()
    for i in range(40):
        slow.on_event(Event(i, t + i * GROUP_SPAN / 10, "s", "pull", "w"))
    slow.flush()
    headers, rows, caption = log_view(slow, limit=30)
    assert caption == "" and len(rows) == 30 and headers[0] == "time"


def test_the_heat_map_is_keys_by_ranks_and_drawn_only_while_shown(watched):
    kv, mon = watched
    _ = mon.widget
    d = mon.dashboard
    kv.events.deliver_many(_rounds_64(time.time()))
    mon.refresh()  # the keys tab is shown: no picture sent
    heat = d.plots.heatmap
    assert heat.source.data["image"][0].shape == (1, 1)
    show(d, "servers & rounds")
    mon.refresh()
    picture = heat.source.data["image"][0]
    assert picture.shape == (KEYS, WORKERS) and picture.dtype == np.uint8
    assert picture.nbytes == 32_000
    assert (picture == MISSING).sum() == HELD and set(np.nonzero(picture == MISSING)[1]) == {LATE}
    assert (picture[:HELD] == PUSHED).sum() == HELD * (WORKERS - 1)  # waiting first
    assert not picture[HELD:].any()  # the others complete
    assert "500 keys x 64 ranks: 42 waiting, 42 cells missing" in heat.fig.title.text
    # the axes span the picture: rank 0 to 64 across, key rows from 500 (bottom) to 0 (top)
    assert (heat.fig.x_range.start, heat.fig.x_range.end) == (0, WORKERS)
    assert (heat.fig.y_range.start, heat.fig.y_range.end) == (KEYS, 0)
    assert d.plots.heat_widget.layout.display is None
    sent = d.plots.heat_widget.patches
    mon.refresh()
    assert d.plots.heat_widget.patches == sent  # unchanged: nothing sent again
    # every round completes: no grey box, the line above the grid says so
    kv.events.deliver_many(
        [_round(k, 0, 4, range(WORKERS), WORKERS, complete=True) for k in range(KEYS)]
    )
    mon.refresh()
    assert d.plots.heat_widget.layout.display == "none"
    assert f"every round complete ({KEYS} keys)" in d.fanin_note.value
    kv.events.deliver_many(_rounds_64(time.time()))  # a round waits again: the picture is back
    mon.refresh()
    assert d.plots.heat_widget.layout.display is None


def test_round_matrix_marks_a_sliced_keys_missing_ranks():
    model = MonitorModel()
    model.on_event(_round("w", 0, 1, [0, 1], 3))
    model.on_event(_round("w", 1, 1, [0], 3))  # the other slice lacks rank 1's push
    model.flush()
    picture, keys, waiting = round_matrix(model)
    assert picture.tolist() == [[PUSHED, MISSING, MISSING]] and keys == ["w"] and waiting == 1


def test_the_timeline_keeps_the_last_seconds_and_says_what_it_shows(watched):
    kv, mon = watched
    model = MonitorModel(timeline_s=10.0, timeline_size=100_000)
    for i in range(3000):  # 30 s of events, 100 a second
        model.on_event(Event(i, 1000.0 + i / 100, "s", "push", i % 5, extra={"start": 0.0}))
    model.flush()
    times = [e.time for e in model.timeline]
    assert min(times) >= 1000.0 + 29.99 - 10.0 and len(times) == 1001
    assert model.held_s() == 10.0
    assert sum(s.pushes for s in model.keys.values()) == 3000  # counts keep every event
    small = MonitorModel(timeline_s=10.0, timeline_size=200)  # the count bound cuts it short
    for i in range(3000):
        small.on_event(Event(i, 1000.0 + i / 100, "s", "push", i % 5))
    small.flush()
    assert small.held_s() == pytest.approx(1.99)
    _ = mon.widget
    d = mon.dashboard
    mon.model.timeline_s = 2.0
    for i in range(500):
        kv.events.deliver(
            Event(i, time.time() - 4 + i / 100, "s", "push", "w", extra={"start": 0.0})
        )
    show(d, "timeline")
    mon.refresh()
    assert "last 2 s (all kept)" in d.plots.timeline_fig.title.text


def test_a_busy_timeline_draws_at_most_its_bars_the_waits_kept_and_says_so(watched):
    from labkv.widgets._timeline import MAX_BARS

    kv, mon = watched
    _ = mon.widget
    d = mon.dashboard
    t = time.time()
    n = MAX_BARS * 2
    for i in range(n):
        kv.events.deliver(
            Event(i, t - 4 + i / n, "s", "push", i % 50, rank=i % 4, extra={"start": 0.0})
        )
    old_wait = Event(0, t - 3.9, "s", "clock", "w", rank=1, server=0, extra={"waited_s": 0.4})
    kv.events.deliver(old_wait)  # older than the spans drawn, but a wait: kept
    show(d, "timeline")
    mon.refresh()
    source = d.plots.timeline_source.data
    assert len(source["op"]) == MAX_BARS and list(source["op"]).count("clock") == 1
    assert f"{MAX_BARS} of {n + 1} spans" in d.plots.timeline_fig.title.text
    assert max(source["right"]) == 0.0  # the newest span is drawn
