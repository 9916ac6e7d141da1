"""Dashboard widget state without a browser: trait values after real store calls."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

import labkv
from labkv.events import Event
from labkv.widgets import monitor
from labkv.widgets._throttle import Ticker
from labkv.widgets._views import TAB_TITLES
from tests._waiting import wait_until
from tests.test_widgets_model import HOSTILE, SHAPE, _round, run_tutorial

W = pytest.importorskip("ipywidgets")
pytest.importorskip("jupyter_bokeh")


def show(d, title: str) -> None:
    """Show a tab of the dashboard, as a click on it does (the monitor draws it then)."""
    d.tabs.selected_index = TAB_TITLES.index(title)


@pytest.fixture
def watched():
    kv = labkv.create("local")
    mon = monitor(kv, hz=20)
    yield kv, mon
    mon.close()


def test_dashboard_shows_the_tutorial(watched):
    kv, mon = watched
    root = mon.widget
    assert isinstance(root, W.VBox) and "labkv-monitor" in root._dom_classes
    run_tutorial(kv)
    mon.refresh()
    d = mon.dashboard
    # the header counts calls as the keys table does; the events per op are its tooltip
    assert "push 9 · pull 12 · updater 7 · 4 keys · " in d.header.value
    assert 'title="init 4 · pull 12 · push 9 · update 7">32 events</span>' in d.header.value
    assert "<td>3</td><td>2x3</td><td>3</td><td>6</td><td>1</td>" in d.keys.value
    show(d, "value & updates")
    assert d.trace.value.count("stored += input * 2") == 7
    assert d.value_caption.value.startswith("<span>key 3: 2x3 float32")
    assert "min 6 max 6 mean 6" in d.value_caption.value
    np.testing.assert_array_equal(d.plots.image_source.data["image"][0], np.full(SHAPE, 6.0))
    assert d.plots.image.visible and not d.plots.line.visible
    # the monitor's own reads of the value never count as pulls
    assert mon.model.keys[3].pulls == 6
    assert [label for label, _ in d.key_filter.options] == ["all keys", "3", "5", "7", "9"]


def test_filters_rerender_the_log(watched):
    kv, mon = watched
    _ = mon.widget
    kv.init(["a", "b"], [np.zeros(2), np.zeros(2)])
    kv.push(["a", "b"], [np.ones(2), np.ones(2)])
    kv.pull("b")
    mon.refresh()
    d = mon.dashboard
    show(d, "events")
    d.key_filter.value = "b"
    d.op_filter.value = "pull"
    mon.refresh()
    assert d.log.value.count("<tr>") == 2  # header + the one pull of b
    assert "<td>pull</td><td>b</td>" in d.log.value
    d.key_filter.value = None
    d.op_filter.value = None
    mon.refresh()
    assert d.log.value.count("<tr>") == 1 + 5


def test_value_view_follows_the_chosen_key_and_downsamples(watched):
    kv, mon = watched
    _ = mon.widget
    kv.init(["vec", "big"], [np.arange(10.0), np.ones((1000, 500))])
    mon.select("vec")
    d = mon.dashboard
    show(d, "value & updates")
    assert d.plots.line.visible and not d.plots.image.visible
    np.testing.assert_array_equal(d.plots.line_source.data["y"], np.arange(10.0))
    d.value_key.value = "big"
    kv.push("big", np.full((1000, 500), 3.0))
    mon.refresh()
    assert mon.value[0] == "big" and mon.value[1].shape == (91, 84)
    assert "1000x500 float64, shown 91x84" in d.value_caption.value
    assert "mean 3" in d.value_caption.value
    assert mon.model.keys["big"].pulls == 0


def test_updates_arrive_live_from_a_background_thread_at_bounded_rate(watched):
    kv, mon = watched
    _ = mon.widget
    d = mon.dashboard
    kv.init("k", np.zeros(3))
    header_writes = []
    d.header.observe(lambda change: header_writes.append(change["new"]), names="value")

    def pusher():
        for _ in range(2000):
            kv.push("k", np.ones(3))

    t0 = time.monotonic()
    thread = threading.Thread(target=pusher)
    thread.start()
    thread.join()
    assert wait_until(lambda: "<td>k</td><td>3</td><td>2000</td>" in d.keys.value, timeout=5.0)
    elapsed = time.monotonic() - t0
    # the 20 Hz ticker, not the 2000 pushes, paces the writes
    assert 1 <= len(header_writes) <= elapsed * 20 + 3


def _burn_cpu(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_costly_refreshes_are_spaced_to_their_cpu_share():
    # 20 ms of CPU per call: at 50 Hz alone that is ~25 calls a second; a 10% share
    # spaces them 0.2 s apart (a loaded machine only makes fewer calls).
    calls = []
    ticker = Ticker(lambda: (calls.append(time.monotonic()), _burn_cpu(0.02)), hz=50, cpu_share=0.1)
    ticker.start()
    time.sleep(1.2)
    ticker.stop()
    gaps = [b - a for a, b in zip(calls, calls[1:], strict=False)]
    assert 2 <= len(calls) <= 7 and min(gaps) >= 0.2
    cheap = Ticker(lambda: None, hz=50, cpu_share=0.1)  # cheap calls keep the full rate
    assert cheap.wait_after(0.0) == 0.02 and cheap.wait_after(5.0) == 1.0  # never under 1 Hz


@pytest.mark.parametrize("options", [{"hz": 0}, {"refresh_cpu": 0}, {"refresh_cpu": 1.5}])
def test_bad_refresh_options_are_refused_before_watching(options):
    kv = labkv.create("local")
    with pytest.raises(ValueError, match="hz|refresh_cpu"):
        monitor(kv, **options)
    assert not kv.events.active  # nothing subscribed


def test_dist_views_from_cluster_events_on_another_thread(watched):
    kv, mon = watched
    _ = mon.widget
    d = mon.dashboard
    show(d, "servers & rounds")
    assert d.plots.load_widget.layout.display == "none"  # no servers yet: no empty plot
    events = [_round("w", 0, 1, [0, 2], 3, t=time.time())]
    events += [
        Event(
            0,
            time.time(),
            "dist_sync",
            "load",
            None,
            server=s,
            extra={
                "bytes_in": 2048 * (s + 1),
                "bytes_out": 1024,
                "keys": 1,
                "bytes_held": 4096,
                "device": "cpu(0)",
            },
        )
        for s in (0, 1)
    ]
    thread = threading.Thread(target=kv.events.deliver_many, args=(events,))
    thread.start()
    thread.join()
    assert wait_until(lambda: "labkv-missing" in d.fanin.value, timeout=5.0)
    assert (
        '<td class="labkv-pushed">pushed</td><td class="labkv-missing">MISSING</td>'
        in d.fanin.value
    )
    assert "<td>1</td><td>cpu(0)</td><td>4.0 KiB</td><td>1.0 KiB</td>" in d.servers.value
    assert d.plots.load_source.data["label"] == [
        "server 0 in",
        "server 0 out",
        "server 1 in",
        "server 1 out",
    ]
    assert d.plots.load_widget.layout.display is None
    assert d.plots.load_fig.title.text == "bytes in and out, cumulative (KiB)"
    # the unit is the title's alone: no y label saying otherwise ("bytes" over KiB ticks)
    assert not d.plots.load_fig.yaxis[0].axis_label
    assert d.plots.load_source.data["ys"][2] == [4.0]  # 4096 bytes, in KiB
    # the legend sits beside the plot area, not over the lines
    assert d.plots.load_fig.legend[0] in d.plots.load_fig.right
    # the waiting time keeps counting in the line above the grid; the grid is not re-sent
    assert "1 of 1 keys waiting" in d.fanin_note.value
    assert "1 key wait for rank 1" in d.header.value  # the header says who, with no time
    assert "rank 1 missing on 1 key" in d.fanin_note.value
    grids, notes = [], []
    d.fanin.observe(grids.append, names="value")
    d.fanin_note.observe(notes.append, names="value")
    assert wait_until(lambda: len(notes) >= 2, timeout=5.0)
    assert grids == []


def test_hostile_key_is_text_in_every_widget(watched):
    kv, mon = watched
    _ = mon.widget
    kv.init(HOSTILE, np.zeros(3))
    kv.push(HOSTILE, np.ones(3))
    mon.refresh()
    d = mon.dashboard
    html = [d.keys.value, d.header.value]
    for title, widget in (("events", d.log), ("value & updates", d.value_caption)):
        show(d, title)
        html.append(widget.value)
    assert all("<img" not in h for h in html) and "labkv-log" in html[2]
    assert "&lt;img src=x onerror=alert(1)&gt;" in d.keys.value
    assert (HOSTILE, HOSTILE) in d.key_filter.options  # Dropdown labels render as text


def test_display_again_close_and_reattach():
    kv = labkv.create("local")
    mon = monitor(kv, hz=20)
    root = mon.widget
    assert mon.widget is root and mon._ticker.running
    kv.init("w", np.zeros(2))
    for _ in range(30):  # more than the bus details: the last picture counts them all
        kv.push("w", np.ones(2))
    mon.close()
    # The dashboard stays on the page with its last picture, marked closed.
    assert root.comm is not None and not mon._ticker.running and not kv.events.active
    d = mon.dashboard
    assert "(closed)" in d.header.value and "push 30" in d.header.value
    assert "<td>w</td><td>2</td><td>30</td>" in d.keys.value
    kv.push("w", np.ones(2))
    mon.close()  # idempotent
    assert "push 30" in d.header.value  # nothing seen after close
    kv2 = labkv.create("local")
    mon.attach(kv2)  # watching again: the same dashboard, live
    assert mon.widget is root and mon._ticker.running
    kv2.init("z", np.zeros(2))
    assert wait_until(lambda: "<td>z</td>" in mon.dashboard.keys.value, timeout=5.0)
    assert "(closed)" not in mon.dashboard.header.value
    mon.attach(labkv.create("local"))  # moving on clears the tables
    assert wait_until(lambda: "no keys yet" in mon.dashboard.keys.value, timeout=5.0)
    mon.close()


def test_bokehjs_is_loaded_before_the_widget_is_shown(monkeypatch):
    from labkv.widgets import _monitor

    shown = []
    monkeypatch.setattr(_monitor, "_bokehjs_loaded", False)
    monkeypatch.setattr("bokeh.io.output_notebook", lambda **kw: shown.append(("bokehjs", kw)))
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    mon = monitor(labkv.create("local"))
    mon._ipython_display_()
    mon._ipython_display_()
    assert [s[0] if isinstance(s, tuple) else s for s in shown] == [
        "bokehjs",
        mon.widget,
        mon.widget,
    ]
    mon.close()


def test_compact_layout_constant_value_and_caption(watched):
    kv, mon = watched
    root = mon.widget
    d = mon.dashboard
    assert root.children[1] is d.header and d.tabs in root.children
    assert d.tabs.titles == TAB_TITLES
    show(d, "value & updates")
    kv.init("c", np.full((2, 3), 10.0))
    assert wait_until(lambda: "min 10 max 10 mean 10" in d.value_caption.value, timeout=5.0)
    # a constant shows as the palette's middle colour, with its value on the colour bar
    plots = d.plots
    assert plots.color_bar.visible and plots.mapper.low < 10.0 < plots.mapper.high
    assert (plots.mapper.low + plots.mapper.high) / 2 == 10.0
    # the caption is two lines that do not wrap
    assert "</span> <br><span>min 10" in d.value_caption.value
    assert "push 0 · pull 0 · updater 0 · 1 key · " in d.header.value
    assert 'title="init 1">1 event</span>' in d.header.value


def test_timeline_shows_a_straggler_and_the_waits_for_it(watched):
    kv, mon = watched
    _ = mon.widget
    d = mon.dashboard
    t = time.time()
    events = [  # rank 0 pushes and pulls 4 times; rank 1 once; rank 0's pulls wait for it
        Event(i, t + 0.1 * i, "dist_ssp", op, "w", rank=0, extra={"start": t + 0.1 * i - 0.01})
        for i, op in enumerate(["push", "pull"] * 4)
    ]
    events.append(Event(9, t + 0.8, "dist_ssp", "push", "w", rank=1, extra={"start": t + 0.7}))
    events.append(
        Event(10, t + 0.8, "dist_ssp", "clock", "w", rank=0, server=0, extra={"waited_s": 0.5})
    )
    kv.events.deliver_many(events)
    show(d, "timeline")
    plots = d.plots
    bars = plots.timeline_source.data
    assert plots.timeline_fig.y_range.factors == [
        "server 0 · waits of rank 0",
        "rank 1 · calls",
        "rank 0 · calls",
    ]
    per_track = {track: bars["track"].count(track) for track in set(bars["track"])}
    assert per_track == {
        "rank 0 · calls": 8,
        "rank 1 · calls": 1,
        "server 0 · waits of rank 0": 1,
    }
    wait = bars["op"].index("clock")
    assert bars["right"][wait] - bars["left"][wait] == pytest.approx(0.5, abs=1e-3)
    assert bars["color"][wait] == "#d62728"
    assert "1 waits (red)" in plots.timeline_fig.title.text
    d.value_key.value = "w"  # the timeline follows the chosen key
    mon.refresh()
    assert "timeline of key w" in plots.timeline_fig.title.text


def _bundle(widget) -> str:
    """What a new view of a bokeh widget draws first: its document as the widget holds it."""
    from bokeh.core.json_encoder import serialize_json

    return serialize_json(widget.render_bundle)


def _json(text: str) -> str:
    """``text`` as it appears inside a JSON string."""
    return json.dumps(text)[1:-1]


def _sends(widget) -> list:
    """Record what ``widget`` sends to the page: patches and state (``render_bundle``)."""
    sent = []
    widget.send = lambda msg, buffers=None: sent.append(("patch", msg))
    widget.send_state = lambda key=None: sent.append(("state", key))
    return sent


def test_a_monitor_displayed_after_its_events_sends_the_timelines_title_and_tracks(watched):
    """Events first, the dashboard later: a bokeh view draws the widget's bundle, then
    the patches that reach it, so a plot drawn before the page had a view of it must be
    in the bundle (title and tracks, not only its bars), and a view that appears after
    later patches gets the bundle again. Nothing is sent again when nothing changed."""
    kv, mon = watched
    t = time.time()
    kv.events.deliver_many(
        [Event(i, t + 0.1 * i, "dist_sync", "push", "w", rank=i % 2) for i in range(4)]
    )
    _ = mon.widget
    d = mon.dashboard
    plots = d.plots
    widget = plots.timeline_widget
    assert "timeline: no events yet" in _bundle(widget)  # as first made
    show(d, "timeline")  # drawn while the page has no view of it
    title, tracks = plots.timeline_fig.title.text, plots.timeline_fig.y_range.factors
    assert "4 spans" in title and tracks == ["rank 1 · calls", "rank 0 · calls"]
    bundle = _bundle(widget)
    assert _json(title) in bundle and "no events yet" not in bundle
    assert all(_json(track) in bundle for track in tracks)
    widget.set_state({"_view_count": 1})  # the page shows it (as its comm message does)
    sent = _sends(widget)
    show(d, "keys")
    show(d, "timeline")  # shown again, nothing changed: nothing sent
    assert sent == []
    kv.events.deliver(Event(9, t + 1.0, "dist_sync", "push", "w", rank=2))
    mon.refresh()
    assert [kind for kind, _ in sent] and {kind for kind, _ in sent} == {"patch"}
    assert _json("rank 2 · calls") not in _bundle(widget)  # the view has it from the patches
    sent.clear()
    widget.set_state({"_view_count": 2})  # a second view: it starts from the bundle
    mon.refresh()
    assert any(kind == "state" for kind, _ in sent)
    assert _json("rank 2 · calls") in _bundle(widget)


def test_a_hidden_plot_gets_nothing_and_a_tick_of_the_clock_sends_nothing(watched):
    """A busy store with the keys tab shown: the hidden timeline, value and load plots
    are sent nothing; refreshes with no new events send nothing at all."""
    kv, mon = watched
    _ = mon.widget
    d = mon.dashboard
    plots = d.plots
    for w in (plots.timeline_widget, plots.value_widget, plots.load_widget):
        w.set_state({"_view_count": 1})
    sent = {w: _sends(w) for w in (plots.timeline_widget, plots.value_widget, plots.load_widget)}
    kv.init("w", np.zeros(3))
    t = time.time()
    for i in range(50):
        kv.push("w", np.ones(3))
        kv.events.deliver(_round("w", 0, i, [0], 2, t=t))
        kv.events.deliver(
            Event(0, t, "dist_sync", "load", None, server=0, extra={"bytes_in": 8 * i})
        )
        mon.refresh()
    assert all(s == [] for s in sent.values()), {w.model_id: len(s) for w, s in sent.items()}
    assert "<td>w</td>" in d.keys.value
    html = [w for w in (d.header, d.keys, d.fanin, d.log, d.trace, d.servers, d.clocks)]
    before = [w.value for w in html]
    changes = []
    for w in html:
        w.observe(changes.append, names="value")
    for _ in range(3):  # only time passes
        time.sleep(0.05)
        mon.refresh()
    assert changes == [] and [w.value for w in html] == before
    show(d, "timeline")  # shown: drawn now, with patches only (the page has its view)
    assert sent[plots.timeline_widget] and {k for k, _ in sent[plots.timeline_widget]} == {"patch"}


def test_only_the_shown_tab_is_redrawn_and_a_closed_monitor_draws_every_tab(monkeypatch):
    kv = labkv.create("local")
    mon = monitor(kv, hz=20, hidden_tabs_s=3600)
    _ = mon.widget
    d = mon.dashboard
    peeks = []
    peek = kv.peek
    monkeypatch.setattr(kv, "peek", lambda key: (peeks.append(key), peek(key))[1])
    kv.init("w", np.zeros(3))
    kv.push("w", np.ones(3))
    mon.refresh()
    assert "<td>w</td>" in d.keys.value and "push 1" in d.header.value
    # hidden: the log and the value were neither drawn nor read
    assert d.log.value == "" and d.value_caption.value == "" and peeks == []
    show(d, "events")  # shown: drawn at once
    assert "<td>push</td><td>w</td>" in d.log.value
    kv.pull("w")
    mon.refresh()
    assert "<td>pull</td><td>w</td>" in d.log.value
    show(d, "keys")
    kv.push("w", np.full(3, 2.0))
    mon.refresh()
    assert "<td>w</td><td>3</td><td>2</td><td>1</td>" in d.keys.value
    assert d.log.value.count("<td>push</td>") == 1  # hidden again: not redrawn
    mon.close()  # the last picture: every tab
    assert d.log.value.count("<td>push</td>") == 2
    assert "key w: 3 float64" in d.value_caption.value and peeks == ["w"]
    assert d.trace.value and "(closed)" in d.header.value


def test_hidden_tabs_are_drawn_once_in_a_while(monkeypatch):
    # while a cell runs the kernel does not hear of a click on another tab: its
    # tables must already be recent when it is shown; its plots are drawn then
    kv = labkv.create("local")
    # 1.5 s: the first refresh comes well within it even on a loaded machine
    mon = monitor(kv, hz=20, hidden_tabs_s=1.5)
    _ = mon.widget
    d = mon.dashboard
    peeks = []
    peek = kv.peek
    monkeypatch.setattr(kv, "peek", lambda key: (peeks.append(key), peek(key))[1])
    kv.init("w", np.zeros(3))
    kv.push("w", np.ones(3))
    mon.refresh()
    assert d.log.value == ""  # hidden and drawn less than 1.5 s ago
    assert wait_until(lambda: "<td>push</td><td>w</td>" in d.log.value, timeout=10.0)
    assert d.value_caption.value == "" and peeks == []  # a plot's tab: drawn when shown
    assert d.tab == 0  # never shown
    show(d, "value & updates")
    assert "key w: 3 float64" in d.value_caption.value and peeks == ["w"]
    mon.close()


def test_a_part_shown_alone_follows_the_monitor_and_keeps_its_last_picture(monkeypatch):
    kv = labkv.create("local")
    mon = monitor(kv, hz=20)
    shown = []
    monkeypatch.setattr("IPython.display.display", shown.append)
    mon.show("fan-in")  # the dashboard itself is never displayed; its tab stays "keys"
    (part,) = shown
    d = mon.dashboard
    assert d.tab == TAB_TITLES.index("keys") and mon._ticker.running
    assert d.header in part.children and "labkv-part" in part._dom_classes
    assert "fan-in (dist_sync round)" in part.children[2].children[0].children[0].value
    assert "no dist_sync rounds" in d.fanin.value  # drawn at once
    kv.events.deliver(_round("w", 0, 1, [0, 2], 3, t=time.time()))
    # the refresh thread draws the part's hidden tab: the rank held back shows up
    assert wait_until(lambda: "labkv-missing" in d.fanin.value, timeout=5.0)
    mon.close()
    assert "(closed)" in d.header.value and "labkv-missing" in d.fanin.value
    assert part.comm is not None  # still on the page, with its last picture
    kv.events.deliver(_round("w", 0, 2, [0, 1, 2], 3, complete=True, t=time.time()))
    mon.refresh()
    assert "labkv-missing" in d.fanin.value  # nothing seen after close


def test_every_part_has_its_widgets_and_a_wrong_name_lists_them():
    mon = monitor(labkv.create("local"))
    with pytest.raises(ValueError, match="no part 'fanin' of the monitor; the parts are 'keys'.*"):
        mon.view("fanin")
    assert mon.dashboard is None  # refused before anything was built
    d = mon.dashboard
    for name, widgets in [
        ("keys", ["keys"]),
        ("updates", ["trace_note", "trace"]),
        ("fan-in", ["fanin_note", "fanin"]),
        ("clocks", ["clocks"]),
        ("servers", ["servers"]),
        ("events", ["ops_legend", "log"]),
    ]:
        part = mon.view(name)
        d = mon.dashboard
        pane = part.children[2].children[0]  # the part's section
        assert [w for w in pane.children[1:] if isinstance(w, W.HTML)] == [
            getattr(d, attr) for attr in widgets
        ], name
    assert d.kept == set(range(len(TAB_TITLES))) - {TAB_TITLES.index("timeline")}
    mon.kv.init("w", np.zeros(2))
    mon.refresh()  # the parts' tabs are drawn though the page shows only "keys"
    assert "<td>init</td><td>w</td>" in d.log.value
    mon.close()


def test_close_never_raises_and_says_what_it_could_not_read(monkeypatch):
    kv = labkv.create("local")
    mon = monitor(kv, hz=20)
    _ = mon.widget
    kv.init("w", np.zeros(2))

    unsubscribe = kv.events.unsubscribe

    def gone(*args):  # as a closed cluster store's bus: it drops the subscriber, then raises
        if args:
            unsubscribe(*args)
        raise RuntimeError("the store local-1 is closed")

    monkeypatch.setattr(kv.events, "flush", gone)  # what the monitor reads last
    monkeypatch.setattr(kv.events, "unsubscribe", gone)
    mon.close()
    d = mon.dashboard
    assert (
        "dist" not in d.header.value and "(closed; store closed): push 0 · pull 0" in d.header.value
    )
    assert "<td>w</td>" in d.keys.value and not mon._ticker.running and not kv.events.active
    mon.close()  # idempotent, still no error
    monkeypatch.undo()
    mon.attach(kv)  # watching again: the note is gone
    assert wait_until(lambda: "(closed" not in d.header.value, timeout=5.0)
    mon.close()
    assert "(closed): " in d.header.value


def test_a_monitor_without_ipywidgets_names_the_extra_to_install(monkeypatch, capsys):
    import sys

    kv = labkv.create("local")
    mon = monitor(kv)
    try:
        kv.init("w", np.zeros(2))
        monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import ipywidgets fails
        with pytest.raises(ImportError, match=r"pip install 'labkv\[lab\]'"):
            _ = mon.widget
        assert mon.dashboard is None
        mon._ipython_display_()  # what a notebook cell that shows it calls
        shown = capsys.readouterr().out
        assert "labkv[lab]" in shown and str(mon).splitlines()[0] in shown
    finally:
        mon.close()


def test_a_timeline_of_many_ranks_folds_its_tracks_and_says_what_its_ring_holds():
    kv = labkv.create("local")
    mon = monitor(kv, hz=20, timeline_size=300)
    _ = mon.widget
    d = mon.dashboard
    t = time.time()
    events = [  # 64 ranks' pulls over 0.3 s (rank 17's take longest), one server's receipts
        Event(
            i,
            t + 0.001 * i,
            "dist_sync",
            "pull",
            "w",
            rank=i % 64,
            extra={"start": t + 0.001 * i - (0.2 if i % 64 == 17 else 0.01)},
        )
        for i in range(320)
    ] + [Event(400, t + 0.3, "dist_sync", "push", "w", rank=0, server=0)]
    kv.events.deliver_many(events)
    show(d, "timeline")
    fig = d.plots.timeline_fig
    tracks = fig.y_range.factors
    assert len(tracks) <= 16 and "rank 17 · calls" in tracks and "server 0 · receipts" in tracks
    assert any(track.endswith("other ranks · calls") for track in tracks)
    assert set(d.plots.timeline_source.data["track"]) <= set(tracks)
    # the ring keeps the last 300 events, 0.28 s of them: the title says so, not "last 5 s"
    assert "last 0.28 s (all kept)" in fig.title.text and "65 tracks in" in fig.title.text
    mon.close()
