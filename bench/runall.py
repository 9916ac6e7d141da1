"""How long each course notebook's "Run All" takes, and how much memory, against its goals.

    python bench/runall.py [--repeat 1] [--memory] [--hogs 4] [01 05b ...]

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

``--memory`` also samples, every 0.2 s, the memory of the notebook's kernel and
of every process below it (the embedded cluster's nannies and workers, a
``dask scheduler`` / ``dask worker`` the notebook starts, the ranks' processes)
and prints the peak of their sum against Binder's budget for one notebook
(1 GiB of its 2 GiB: JupyterLab and the rest keep the other). The sum is of
each process's PSS (``/proc/PID/smaps_rollup``): pages shared between the
processes (numpy's and Python's libraries) are counted once in all, as a
container's memory limit counts them, where RSS would count them in each.

``--hogs N`` is the course's acceptance check on a busy laptop: N CPU-bound
processes (``while True: pass``, each started with ``setsid`` so that the
kernel's own session does not shield it; two per core is the check) run beside
every notebook. Each run then also reports whether it ran to the end (the cell
and error where it did not) and how many outputs went to stderr (Dask's logs
must stay out of the cells); the exit status is 1 if any run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
from _hogs import Hogs

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9]*.ipynb"))
#: The course's goal for one notebook's Run All on 2 cores.
GOAL_S = 60.0
#: Binder gives a notebook 2 GiB for everything; one notebook's share.
MEMORY_GOAL_MIB = 1024.0
ANNOUNCED = re.compile(r'Run All"? takes about (\d+) s')


def announced(path: Path) -> float | None:
    """The seconds the notebook's first cell says Run All takes."""
    nb = nbformat.read(path, as_version=4)
    found = ANNOUNCED.search(nb.cells[0].source) if nb.cells else None
    return float(found.group(1)) if found else None


def _children() -> dict[int, list[int]]:
    below: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        below.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return below


def tree_pss_mib(pid: int) -> float:
    """The PSS of ``pid`` and every process below it, in MiB."""
    below, todo, total_kib = _children(), [pid], 0
    while todo:
        process = todo.pop()
        todo += below.get(process, [])
        try:
            rollup = Path(f"/proc/{process}/smaps_rollup").read_text()
        except OSError:
            continue
        total_kib += int(re.search(r"^Pss:\s+(\d+) kB", rollup, re.M).group(1))
    return total_kib / 1024


class PeakMemory:
    """The peak of :func:`tree_pss_mib` of ``pid``, sampled on a thread."""

    def __init__(self, pid: int, every: float = 0.2) -> None:
        self.pid, self.every, self.peak = pid, every, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, tree_pss_mib(self.pid))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak


@dataclass
class Run:
    """One Run All: its seconds, peak MiB (with ``memory``), the error that stopped
    it (None: it ran to the end) and how many outputs went to stderr."""

    seconds: float
    peak: float | None
    error: str | None
    stderr: int


def run_all(path: Path, memory: bool = False) -> Run:
    """Run the notebook top to bottom in a new kernel (kernel start excluded)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=600,  # per cell: only stops a hang
        kernel_name="python3",
        startup_timeout=120,
        allow_errors=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    error = None
    with client.setup_kernel():
        sampler = PeakMemory(client.km.provisioner.pid) if memory else None
        start = time.perf_counter()
        try:
            for index, cell in enumerate(nb.cells):
                try:
                    client.execute_cell(cell, index)
                except CellExecutionError as exc:
                    error = f"cell {index}: {exc.ename}: {exc.evalue}"[:300]
                    break
            seconds = time.perf_counter() - start
        finally:
            peak = sampler.stop() if sampler is not None else None
    stderr = sum(
        o.get("output_type") == "stream" and o.get("name") == "stderr"
        for c in nb.cells
        if c.cell_type == "code" and "raises-exception" not in c.metadata.get("tags", [])
        for o in c.outputs
    )
    return Run(seconds, peak, error, stderr)


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
    parser.add_argument("--memory", action="store_true", help="also the peak memory")
    parser.add_argument("--hogs", type=int, default=0, help="CPU-bound processes beside")
    args = parser.parse_args()
    chosen = [p for p in NOTEBOOKS if not args.only or p.stem.startswith(tuple(args.only))]
    over = heavy = failed = noisy = runs_made = 0
    if args.hogs:
        print(f"{args.hogs} CPU hogs beside every notebook ({os.cpu_count()} cores)", flush=True)
    with Hogs(args.hogs):
        for path in chosen:
            peak = None
            if args.browser_reports is not None:
                report = args.browser_reports / f"{path.stem}.json"
                if not report.exists():
                    print(f"{path.stem:42s} no report in {args.browser_reports}")
                    continue
                seconds = json.loads(report.read_text())["seconds"]
            else:
                runs = [run_all(path, args.memory) for _ in range(args.repeat)]
                runs_made += len(runs)
                for run in runs:
                    failed += run.error is not None
                    noisy += run.stderr > 0
                    if run.error is not None or run.stderr:
                        print(
                            f"{path.stem:42s} stopped at {run.error}; {run.stderr} stderr outputs"
                        )
                seconds = min(run.seconds for run in runs)
                if args.memory:
                    peak = max(run.peak for run in runs)
            over += seconds > GOAL_S
            text = line(path.stem, seconds, announced(path))
            if peak is not None:
                heavy += peak > MEMORY_GOAL_MIB
                text += f"  peak {peak:5.0f} MiB {peak / MEMORY_GOAL_MIB:5.2f}x of {MEMORY_GOAL_MIB:.0f}"
            print(text, flush=True)
    print(f"{over} of {len(chosen)} notebooks over the {GOAL_S:.0f} s goal")
    if args.memory:
        print(f"{heavy} of {len(chosen)} notebooks over the {MEMORY_GOAL_MIB:.0f} MiB goal")
    if runs_made:
        print(f"{failed} of {runs_made} runs stopped by an error, {noisy} wrote to stderr")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
