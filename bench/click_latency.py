"""The monitor's click latency in a real browser, against its goals.

    python bench/click_latency.py [--repeat 1]

Runs the two browser scenarios of tests/browser/test_browser_monitor.py that
time their clicks (JupyterLab and Debian's chromium through Playwright, the
recipe of tests/browser/_lab.py), each in a pytest temp folder of its own, and
prints what they measured (their ``numbers.json``):

- the 64 x 500 fan-in monitor (events delivered, no run): milliseconds from the
  click on "servers & rounds" to the grid shown, against the 1000 ms goal;
- the monitor of a real in-process 64-rank run: each tab's 3 clicks by the
  page's clock (the first also lays the tab out), the median against the
  300 ms goal and the slowest against 600 ms;
- and both pages' bytes per second while idle (the tests also assert that bound).

The tests check what must hold at any speed (every click draws its tab, the
grid names the missing rank, the idle page is quiet); how fast is measured
here, as ratios to the goals. Needs chromium (``CHROMIUM``) and playwright.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = {
    "fan-in grid": "test_a_64_rank_monitor_names_the_missing_rank_and_is_quiet_when_idle",
    "real run": "test_a_real_64_rank_run_responds_to_clicks_and_is_quiet_when_idle",
}
#: Goals: the fan-in grid's click; a tab's median click and its slowest.
GRID_GOAL_MS, MEDIAN_GOAL_MS, ANY_GOAL_MS = 1000, 300, 600


def measure(test: str) -> dict | None:
    """Run one browser test; its numbers.json (None when it skipped or failed)."""
    with tempfile.TemporaryDirectory() as base:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                f"tests/browser/test_browser_monitor.py::{test}",
                "-q",
                "-p",
                "no:cacheprovider",
                f"--basetemp={base}",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        found = sorted(Path(base).rglob("numbers.json"))
        if not found:
            tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
            print(f"  {test}: no numbers ({' / '.join(tail)})")
            return None
        return json.loads(found[0].read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    for _ in range(args.repeat):
        grid = measure(TESTS["fan-in grid"])
        if grid is not None:
            ms = grid["click_ms"]
            print(
                f"fan-in grid: click {ms:.0f} ms ({ms / GRID_GOAL_MS:.2f}x of {GRID_GOAL_MS} ms); "
                f"idle {grid['idle_bytes_per_s'] / 1e3:.1f} KB/s"
            )
        real = measure(TESTS["real run"])
        if real is not None:
            for tab, ms in real["click_ms"].items():
                median = statistics.median(ms)
                print(
                    f"real run, {tab:17s}: clicks {ms} ms; median {median:.0f} "
                    f"({median / MEDIAN_GOAL_MS:.2f}x of {MEDIAN_GOAL_MS}), slowest {max(ms)} "
                    f"({max(ms) / ANY_GOAL_MS:.2f}x of {ANY_GOAL_MS})"
                )
            print(f"real run: idle {real['idle_bytes_per_s'] / 1e3:.1f} KB/s; {real['run']}")


if __name__ == "__main__":
    main()
