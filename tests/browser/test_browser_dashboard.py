"""labkv's dashboard page in a real browser (Debian's chromium through
Playwright): two tabs of the page read the store's key and a round's rank, and
dask-labextension in JupyterLab lists labkv's pages and shows one as a pane.
Run alone with ``pytest -m browser``."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import numpy as np
import pytest

import labkv
import labkv.dashboard
from labkv.cluster import connect
from tests.browser._lab import CHROME_ARGS, CHROMIUM, require_browser

pytestmark = pytest.mark.browser


def test_two_tabs_of_the_rounds_page_show_the_key_and_its_rank(tmp_path):
    require_browser()
    from playwright.sync_api import sync_playwright

    with connect(n_workers=2, memory_limit="1GiB", set_as_default=False) as handle:
        kv = labkv.create("dist_sync", cluster=handle, num_servers=2)
        with labkv.dashboard.watch(kv) as watched:
            kv.init("browser.weight", np.zeros(8, np.float32))
            for _ in range(3):
                kv.push("browser.weight", np.ones(8, np.float32))
            kv.pull("browser.weight", out=np.zeros(8, np.float32))
            url = watched.urls[0]  # /individual-labkv-rounds
            with sync_playwright() as pw:
                browser = pw.chromium.launch(
                    executable_path=CHROMIUM, args=CHROME_ARGS, headless=True
                )
                try:
                    tabs = [browser.new_page(viewport={"width": 1200, "height": 700})]
                    tabs.append(browser.new_page(viewport={"width": 1200, "height": 700}))
                    for tab in tabs:
                        tab.goto(url, wait_until="domcontentloaded")
                    seen = []
                    for tab in tabs:
                        # Bokeh renders into shadow roots; Playwright's locators pierce them
                        tab.get_by_text("browser.weight").first.wait_for(timeout=60_000)
                        tab.get_by_text("rank 0", exact=True).first.wait_for(timeout=60_000)
                        header = tab.locator(".labkv-header").first.inner_text()
                        seen.append(header)
                    assert "push 3 · pull 1" in seen[0] and seen[0] == seen[1]
                    tabs[0].screenshot(path=str(tmp_path / "dashboard_rounds.png"))
                finally:
                    browser.close()
        kv.close()


# The Dask sidebar's dashboard buttons, as dask-labextension draws them from the
# scheduler's /individual-plots.json (its server extension fetches the list).
SIDEBAR = "dask-dashboard-launcher"
BUTTONS = ".dask-DashboardListing-item"


def test_dask_labextension_lists_labkv_panes_and_one_shows_the_key(tmp_path):
    """JupyterLab with dask-labextension, given the embedded cluster's dashboard
    address in its settings: the Dask sidebar lists labkv's pages, and the pane a
    click opens (an iframe proxied by the extension) reads the store's key and rank."""
    require_browser()
    from playwright.sync_api import sync_playwright

    from tests.browser._lab import start_lab, stop_lab

    with connect(n_workers=2, memory_limit="1GiB", set_as_default=False) as handle:
        dashboard = handle.dashboard_link.rsplit("/", 1)[0]  # http://127.0.0.1:PORT
        settings = tmp_path / ".settings" / "dask-labextension" / "plugin.jupyterlab-settings"
        settings.parent.mkdir(parents=True)
        settings.write_text(json.dumps({"defaultURL": dashboard, "hideClusterManager": True}))
        kv = labkv.create("dist_sync", cluster=handle, num_servers=2)
        with labkv.dashboard.watch(kv):
            kv.init("pane.weight", np.zeros(8, np.float32))
            for _ in range(2):
                kv.push("pane.weight", np.ones(8, np.float32))
            kv.pull("pane.weight", out=np.zeros(8, np.float32))
            token = secrets.token_hex(16)
            proc, base = start_lab(tmp_path, token)
            try:
                with sync_playwright() as pw:
                    browser = pw.chromium.launch(
                        executable_path=CHROMIUM, args=CHROME_ARGS, headless=True
                    )
                    try:
                        page = browser.new_page(viewport={"width": 1400, "height": 900})
                        page.goto(f"{base}/lab?token={token}", wait_until="domcontentloaded")
                        # the sidebar's tab, as a user opens it (activating the widget
                        # before the shell restored its layout is undone by the restore)
                        page.locator(f"li[data-id='{SIDEBAR}']").click(timeout=120_000)
                        rounds = page.locator(BUTTONS, has_text="Labkv Rounds")
                        rounds.first.wait_for(timeout=60_000)
                        names = page.locator(
                            BUTTONS
                        ).all_text_contents()  # CSS shows them in capitals
                        listed = sorted(n.strip() for n in names if "Labkv" in n)
                        assert listed == [
                            "Labkv Keys",
                            "Labkv Rounds",
                            "Labkv Servers",
                            "Labkv Timeline",
                        ], names
                        rounds.first.click()
                        pane = page.frame_locator("iframe[src*='individual-labkv-rounds']")
                        pane.get_by_text("pane.weight").first.wait_for(timeout=60_000)
                        pane.get_by_text("rank 0", exact=True).first.wait_for(timeout=60_000)
                        header = pane.locator(".labkv-header").first.inner_text()
                        assert "push 2 · pull 1" in header, header
                        shots = Path(os.environ.get("LABKV_ARTIFACTS", "artifacts")) / "screenshots"
                        shots.mkdir(parents=True, exist_ok=True)
                        page.screenshot(path=str(shots / "labextension_pane.png"))
                    finally:
                        browser.close()
            finally:
                stop_lab(proc)
        kv.close()
