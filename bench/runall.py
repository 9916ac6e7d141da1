"""How long each course notebook's "Run All" takes, against its goals.

    python bench/runall.py [--repeat 1] [01 05b ...]

Runs every notebook (or those whose name starts with one of the arguments)
top to bottom in a fresh kernel with nbclient, as tests/test_notebooks.py
does (its exercise checks untouched), and prints for each: the seconds from
the first cell to the last (the best of ``--repeat``), the time its first
cell announces ("Run All" takes about N s on 2 cores) and the course's goal
(a minute per notebook), each as a ratio. The tests check only that every
notebook runs and what it shows, at any speed; this is where the speed goal
is measured. On a busy machine run it beside the same load for a baseline:
the ratios, not the seconds, are what compare.

The browser's "Run All" (tests/browser/test_browser_course.py, which writes each
notebook's seconds to ``artifacts/screenshots/<notebook>.json``) also draws the
outputs; ``--browser-reports DIR`` prints those seconds against the same goals
instead of running the notebooks here.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9]*.ipynb"))
#: The course's goal for one notebook's Run All on 2 cores.
GOAL_S = 60.0
ANNOUNCED = re.compile(r'Run All"? takes about (\d+) s')


def announced(path: Path) -> float | None:
    """The seconds the notebook's first cell says Run All takes."""
    nb = nbformat.read(path, as_version=4)
    found = ANNOUNCED.search(nb.cells[0].source) if nb.cells else None
    return float(found.group(1)) if found else None


def run_all(path: Path) -> float:
    """Seconds to run the notebook top to bottom in a new kernel (kernel start excluded)."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=600,  # per cell: only stops a hang
        kernel_name="python3",
        startup_timeout=120,
        allow_errors=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    with client.setup_kernel():
        start = time.perf_counter()
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
        return time.perf_counter() - start


def line(name: str, seconds: float, said: float | None) -> str:
    ratio = f"{seconds / said:5.2f}x of its {said:.0f} s" if said else "(no time announced)"
    return (
        f"{name:42s} {seconds:7.1f} s  {ratio}  {seconds / GOAL_S:5.2f}x of the {GOAL_S:.0f} s goal"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("only", nargs="*", help="notebook name prefixes")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--browser-reports", type=Path, default=None)
    args = parser.parse_args()
    chosen = [p for p in NOTEBOOKS if not args.only or p.stem.startswith(tuple(args.only))]
    over = 0
    for path in chosen:
        if args.browser_reports is not None:
            report = args.browser_reports / f"{path.stem}.json"
            if not report.exists():
                print(f"{path.stem:42s} no report in {args.browser_reports}")
                continue
            seconds = json.loads(report.read_text())["seconds"]
        else:
            seconds = min(run_all(path) for _ in range(args.repeat))
        over += seconds > GOAL_S
        print(line(path.stem, seconds, announced(path)), flush=True)
    print(f"{over} of {len(chosen)} notebooks over the {GOAL_S:.0f} s goal")
    sys.exit(0)


if __name__ == "__main__":
    main()
