"""binder/ installs into a fresh virtual environment, and the notebooks run from there."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_WHEELS = "https://download.pytorch.org/whl/cpu"

RUN_NOTEBOOKS = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import nbformat
    from nbclient import NotebookClient

    for path in sorted(Path("notebooks").glob("[0-9]*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=120, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        print("ran", path.name, flush=True)
    """
)


def test_binder_files_follow_repo2docker_conventions():
    binder = ROOT / "binder"
    requirements = (binder / "requirements.txt").read_text()
    assert "-e .[lab]" in requirements
    # Binder has no GPU: torch from PyTorch's CPU wheel index, not PyPI's CUDA build.
    assert f"--extra-index-url {CPU_WHEELS}" in requirements.splitlines()
    assert re.search(r"^torch==[\d.]+\+cpu$", requirements, re.MULTILINE)
    assert (binder / "start").read_text().rstrip().endswith('exec "$@"')
    assert not (ROOT / ".binder").exists()  # repo2docker refuses both folders


@pytest.mark.slow
def test_binder_environment_installs_and_runs_the_notebooks(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # This machine reaches PyPI only, with the CPU torch wheel on its own disk: the CPU
    # index line is left out (pip would wait out its timeouts on it), the rest installs as is.
    requirements = tmp_path / "requirements.txt"
    lines = (ROOT / "binder" / "requirements.txt").read_text().splitlines()
    requirements.write_text("\n".join(line for line in lines if CPU_WHEELS not in line) + "\n")
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "-r", str(requirements)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    run = subprocess.run(
        [str(python), "-c", RUN_NOTEBOOKS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    ran = [line for line in run.stdout.splitlines() if line.startswith("ran ")]
    assert len(ran) == len(list((ROOT / "notebooks").glob("[0-9]*.ipynb")))


def test_embedded_workers_follow_the_containers_cpus_and_leave_memory_for_the_kernel(monkeypatch):
    import dask.system
    import distributed.system

    from labkv.cluster._runtime import connect as connecting

    monkeypatch.delenv("JUPYTERHUB_SERVICE_PREFIX", raising=False)
    monkeypatch.delenv("BINDER_LAUNCH_HOST", raising=False)
    monkeypatch.setattr(connecting.os, "cpu_count", lambda: 64)  # the host's cores
    for quota, workers in [(1, 2), (4, 4), (64, 8)]:
        monkeypatch.setattr(dask.system, "CPU_COUNT", quota)  # the container's CPU quota
        assert connecting._default_workers() == workers
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/someone/")  # Binder's hub
    assert connecting._default_workers() == 2

    monkeypatch.setattr(distributed.system, "MEMORY_LIMIT", 2 << 30)  # Binder's 2 GB
    started = {}

    class Started(Exception):
        pass

    def local_cluster(**options):
        started.update(options)
        raise Started

    monkeypatch.setattr(connecting, "_EmbeddedCluster", local_cluster)
    with pytest.raises(Started):
        connecting.connect()
    assert started["n_workers"] == 2 and started["memory_limit"] == (2 << 30) // 3
    with pytest.raises(Started):
        connecting.connect(n_workers=3, memory_limit="1GiB")  # the caller's choice wins
    assert started["n_workers"] == 3 and started["memory_limit"] == "1GiB"
