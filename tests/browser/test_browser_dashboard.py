"""labkv's dashboard page in a real browser (Debian's chromium through
Playwright): two tabs of the page read the store's key and a round's rank.
Run alone with ``pytest -m browser``."""

from __future__ import annotations

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
