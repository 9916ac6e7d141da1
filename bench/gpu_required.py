"""Fail a GPU check whose GPU tests did not all run.

    python bench/gpu_required.py REPORT.xml

``REPORT.xml`` is pytest's ``--junitxml`` report of ``pytest -m gpu tests/test_gpu.py``.
pytest exits 0 when tests are skipped, so a GPU machine without Dask (the cluster
tests skip) or without a working CuPy (all skip) would pass silently. This exits 1,
naming the tests, when none ran or any was skipped, except for the reasons in
``ALLOWED`` (a check that needs two GPUs, on a machine with one).
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

ALLOWED = ("needs two GPUs",)


def problems(report: str) -> list[str]:
    """What makes the run not count as a GPU check (empty: it counts)."""
    cases = ET.parse(report).getroot().iter("testcase")
    ran, found = 0, []
    for case in cases:
        skipped = case.find("skipped")
        name = f"{case.get('classname')}::{case.get('name')}"
        if skipped is None:
            ran += 1 if case.find("failure") is None and case.find("error") is None else 0
        elif not any(reason in (skipped.get("message") or "") for reason in ALLOWED):
            found.append(f"skipped {name}: {skipped.get('message')}")
    if ran == 0:
        found.insert(0, "no GPU test passed")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    found = problems(argv[0])
    for line in found:
        print(f"gpu_required: {line}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
