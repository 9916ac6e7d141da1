"""labkv's pane in the Dask dashboard: pages listed and served by a real
scheduler (the embedded LocalCluster, a CLI scheduler with the preload), fed
by a watched store, read by viewers as Bokeh documents."""

from __future__ import annotations

import pickle
import threading
import time

import numpy as np
import pytest

import labkv
import labkv.dashboard
from labkv.cluster import connect, run
from labkv.cluster._event_relay import pack_batch
from labkv.dashboard import PATHS
from labkv.dashboard._plugin import INFO_TOPIC, MAX_PENDING, MAX_STORES, LabkvDashboard
from tests._cli import Procs, start_scheduler, start_worker
from tests._dashboard import open_page, page_text, plots, read_page
from tests._waiting import wait_until

pytest.importorskip("bokeh")

TITLES = {
    "Individual Labkv Rounds": "/individual-labkv-rounds",
    "Individual Labkv Servers": "/individual-labkv-servers",
    "Individual Labkv Keys": "/individual-labkv-keys",
    "Individual Labkv Timeline": "/individual-labkv-timeline",
}


@pytest.fixture(scope="module")
def handle():
    """An embedded cluster as ``connect()`` makes it, dashboard included (the
    session's shared cluster runs without one)."""
    with connect(n_workers=2, memory_limit="1GiB", set_as_default=False) as embedded:
        yield embedded


def _lagging_rank(kv, delay):
    if kv.rank == 1:
        time.sleep(delay)
    kv.push("layer0.weight", np.ones(16, dtype=np.float32))
    return kv.pull("layer0.weight")


def _shows(link: str, path: str, *texts: str, timeout: float = 60.0) -> str:
    """The page's text once it shows every one of ``texts``."""
    seen = {"text": ""}

    def shown() -> bool:
        seen["text"] = read_page(link, path)
        return all(t in seen["text"] for t in texts)

    assert wait_until(shown, timeout=timeout, poll=0.5), (texts, seen["text"][-2000:])
    return seen["text"]


def test_embedded_cluster_lists_and_serves_the_pages_and_names_the_missing_rank(handle):
    link = handle.dashboard_link
    listed = plots(link)
    assert {t: listed.get(t) for t in TITLES} == TITLES
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2)
    watched = labkv.dashboard.watch(kv)
    try:
        assert watched.listed and watched.urls[0] == link.rsplit("/", 1)[0] + PATHS[0]
        kv.init("layer0.weight", np.zeros(16, dtype=np.float32))
        done: dict = {}
        lagging = threading.Thread(
            target=lambda: done.setdefault("r", run(_lagging_rank, 2, kvstore=kv, args=(8.0,)))
        )
        lagging.start()
        try:
            # while rank 1 sleeps, rank 0's push waits: the page names rank 1
            text = _shows(link, "/individual-labkv-rounds", "layer0.weight", "MISSING")
            assert "rank 1 missing on 1 key" in text and "rank 0" in text
        finally:
            lagging.join(timeout=120)
        np.testing.assert_array_equal(done["r"][0], np.full(16, 2.0))
        _shows(link, "/individual-labkv-rounds", "every round complete")
        keys = _shows(link, "/individual-labkv-keys", "layer0.weight")
        assert "dist_sync" in keys and "servers 2" in keys
        servers = _shows(link, "/individual-labkv-servers", "cpu(0)")
        assert "bytes held" in servers
        assert "spans" in _shows(link, "/individual-labkv-timeline", kv.store_id)
    finally:
        watched.close()
        kv.close()


def test_two_viewers_see_the_same_numbers_and_leave_nothing_behind(handle):
    link = handle.dashboard_link
    kv = labkv.create("dist_sync", cluster=handle, num_servers=1)
    with labkv.dashboard.watch(kv):
        kv.init("shared", np.zeros(4))
        for _ in range(7):
            kv.push("shared", np.ones(4))
        kv.pull("shared", out=np.zeros(4))
        text = _shows(link, "/individual-labkv-keys", "shared", "push 7 · pull 1")
        first = open_page(link, "/individual-labkv-keys")
        second = open_page(link, "/individual-labkv-keys")
        try:
            assert page_text(first) == page_text(second) == text
            assert handle.client.run_on_scheduler(_viewers) >= 2
        finally:
            first.close()
            second.close()
    kv.close()
    # a closed tab's session (and its periodic callback) ends with it
    assert wait_until(lambda: handle.client.run_on_scheduler(_viewers) == 0, timeout=30)


def _viewers(dask_scheduler=None):
    return dask_scheduler.plugins["labkv-dashboard"].viewers


def test_watching_a_local_store_is_refused():
    with pytest.raises(ValueError, match="cluster store"):
        labkv.dashboard.watch(labkv.create("local"))


def test_the_plugin_keeps_bounded_queues_and_few_stores():
    plugin = LabkvDashboard()
    batch = pack_batch(
        [{"seq": 0, "time": 1.0, "store": "s", "op": "push", "key": "w", "server": 0, "nbytes": 8}]
    )
    for _ in range(MAX_PENDING * 3):
        plugin.log_event("labkv-events-s", batch)
    board = plugin.boards["s"]
    assert len(board.pending) < MAX_PENDING  # folded as they piled up, with nobody looking
    board.fold()
    assert board.model.keys["w"].pushes == MAX_PENDING * 3  # exact all the same
    for i in range(MAX_STORES + 3):
        plugin.log_event(INFO_TOPIC, pickle.dumps({"store": f"t{i}", "type": "dist_sync"}))
    assert len(plugin.boards) == MAX_STORES and f"t{MAX_STORES + 2}" in plugin.boards
    plugin.log_event("some-other-topic", {"x": 1})  # Dask's own topics pass by
    assert "other-topic" not in plugin.boards


def test_a_page_is_drawn_once_per_change_whatever_the_viewers():
    plugin = LabkvDashboard()
    drawn = []

    def draw(board):
        drawn.append(board.info.get("placement"))
        return f"drawn {len(drawn)}"

    board = plugin.board("s")
    assert [board.render("keys", draw) for _ in range(4)] == ["drawn 1"] * 4  # four viewers
    for placement in ({"w": "s0"}, {"w": "s1"}):  # new placement, same keys
        plugin.log_event(INFO_TOPIC, pickle.dumps({"store": "s", "placement": placement}))
        board.render("keys", draw)
    assert drawn == [None, {"w": "s0"}, {"w": "s1"}]


@pytest.mark.slow
def test_cli_scheduler_with_the_preload_serves_the_pages(tmp_path):
    procs = Procs(tmp_path)
    try:
        address = start_scheduler(
            procs,
            tmp_path,
            extra=["--dashboard", "--dashboard-address", "127.0.0.1:0"]
            + ["--preload", "labkv.dashboard"],
        )
        start_worker(procs, "w", address, tmp_path, nworkers=2)
        with connect(address, n_workers=2, set_as_default=False) as cli:
            link = cli.dashboard_link
            assert {t: plots(link).get(t) for t in TITLES} == TITLES
            kv = labkv.create("dist_sync", cluster=cli, num_servers=2)
            with labkv.dashboard.watch(kv) as watched:
                assert watched.listed
                kv.init("cli.key", np.zeros(3))
                kv.push("cli.key", np.ones(3))
                text = _shows(link, "/individual-labkv-rounds", "cli.key", "rank 0")
                assert "pushed" in text
            kv.close()
    finally:
        procs.stop()


def test_a_scheduler_without_the_preload_gets_the_plugin_and_says_how_to_list_pages(tmp_path):
    procs = Procs(tmp_path)
    try:
        address = start_scheduler(
            procs, tmp_path, extra=["--dashboard", "--dashboard-address", "127.0.0.1:0"]
        )
        with connect(address, set_as_default=False) as bare:
            assert "Individual Labkv Rounds" not in plots(bare.dashboard_link)
            with pytest.warns(UserWarning, match="--preload labkv.dashboard"):
                assert labkv.dashboard.install(bare) is False
            assert bare.client.run_on_scheduler(_viewers) == 0  # the plugin folds all the same
    finally:
        procs.stop()


def test_the_handles_html_links_the_dashboard_and_labkvs_pages(handle):
    html = handle._repr_html_()
    assert handle.dashboard_link in html
    assert all(url in html for url in labkv.dashboard.urls(handle))


def test_a_store_only_the_dashboard_watches_sends_this_process_none_of_its_servers_events(
    handle,
):
    """The servers stream to the scheduler, whose pages show their rounds; the
    notebook hears none of it until a subscriber that wants the servers' events
    (a monitor) comes, and stops hearing when it leaves."""
    link = handle.dashboard_link
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2)
    mine: list = []
    with labkv.dashboard.watch(kv), kv.events.subscribe(mine.append, local_only=True):
        kv.init(["a", "b"], [np.zeros(4), np.zeros(4)])
        for _ in range(3):
            kv.push(["a", "b"], [np.ones(4), np.ones(4)])
        kv.pull("a", out=np.zeros(4))
        # the servers' rounds reached the scheduler
        _shows(link, "/individual-labkv-rounds", "every round complete (2 keys)")
        kv.events.flush()
        assert mine and all(e.server is None for e in mine), [e for e in mine if e.server]
        assert not kv._streaming.hearing
        heard: list = []
        with kv.events.subscribe(heard.append):  # a monitor: wants the servers' events
            assert kv._streaming.hearing
            kv.push("a", np.ones(4))
            kv.pull("a", out=np.zeros(4))
            assert wait_until(lambda: any(e.server is not None for e in heard), timeout=30)
        assert not kv._streaming.hearing
    kv.close()
