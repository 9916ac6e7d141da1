"""binder/ installs into a fresh virtual environment, and the notebooks run from there."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

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
    assert (binder / "start").read_text().rstrip().endswith('exec "$@"')
    assert not (ROOT / ".binder").exists()  # repo2docker refuses both folders


@pytest.mark.slow
def test_binder_environment_installs_and_runs_the_notebooks(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "-r", "binder/requirements.txt"],
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
