"""``bench/gpu_check.sh`` fails when its GPU tests skip (pytest alone exits 0)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs pytest in subprocesses

ROOT = Path(__file__).parent.parent


def _pytest(tmp_path, *args):
    report = tmp_path / "report.xml"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"]
        + ["--no-header", *args],
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    return run.returncode, report


def _required(report):
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_required.py"), str(report)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_skipped_gpu_tests_fail_the_gpu_check(tmp_path):
    # Here (no CUDA GPU) every CUDA test skips, as the cluster ones do without Dask.
    code, report = _pytest(tmp_path, "-m", "gpu", "tests/test_gpu.py", "-k", "servers or scalar")
    assert code == 0  # what made the old check pass silently
    check = _required(report)
    assert check.returncode == 1
    assert "skipped tests.test_gpu::test_gpu_servers_sum_cupy_pushes_of_two_ranks" in check.stdout


def test_gpu_tests_that_ran_pass_the_gpu_check(tmp_path):
    code, report = _pytest(tmp_path, "tests/test_gpu.py", "-k", "standin and packing")
    assert code == 0
    check = _required(report)
    assert check.returncode == 0, check.stdout
