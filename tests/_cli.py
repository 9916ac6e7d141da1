"""Dask CLI processes for the tests: a ``dask scheduler`` and ``dask worker``
processes on 127.0.0.1, from this environment or from another one
(:func:`bare_python`: a venv with this environment's packages but not labkv,
and without the packages named)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path


class Procs:
    """CLI processes in their own sessions, stopped by PID (never by name)."""

    def __init__(self, logdir: Path):
        self.logdir, self.procs = logdir, []

    def start(
        self, name: str, args: list[str], env: dict | None = None, cwd: Path | None = None
    ) -> None:
        log = open(self.logdir / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        self.procs.append(
            subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                cwd=cwd,
            )
        )

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)  # the group our own child leads
                p.wait(timeout=5)


def scheduler_address(path: Path, timeout: float = 60) -> str:
    """The address a scheduler wrote to its ``--scheduler-file``."""
    end = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > end:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.05)
    time.sleep(0.05)  # the file is written in one go, but give it a moment
    return json.loads(path.read_text())["address"]


def start_scheduler(
    procs: Procs, tmp: Path, python: str = sys.executable, env: dict | None = None, extra=()
) -> str:
    """A ``dask scheduler`` from ``python``'s environment; its address."""
    sf = tmp / "scheduler.json"
    procs.start(
        "scheduler",
        [python, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0"]
        + ["--no-dashboard", "--scheduler-file", str(sf), *extra],
        env=env,
        cwd=tmp,
    )
    return scheduler_address(sf)


def start_worker(
    procs: Procs,
    name: str,
    address: str,
    tmp: Path,
    python: str = sys.executable,
    env: dict | None = None,
    nworkers: int = 1,
    extra=(),
) -> None:
    """``nworkers`` single-threaded ``dask worker`` processes from ``python``'s environment."""
    procs.start(
        name,
        [python, "-m", "dask", "worker", address, "--host", "127.0.0.1"]
        + ["--nworkers", str(nworkers), "--nthreads", "1", "--no-dashboard"]
        + ["--memory-limit", "1GiB", "--local-directory", str(tmp / name)]
        + ["--death-timeout", "30", *extra],
        env=env,
        cwd=tmp,
    )


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without PYTHONPATH (which would bring labkv)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(extra)
    return env


def bare_python(root: Path, without: tuple[str, ...] = ()) -> str:
    """The python of a new venv under ``root`` with this environment's packages
    but not labkv (its editable install is a ``.pth`` file, which only a site
    directory's processing would read), nor the top-level packages ``without``
    (e.g. ``("torch",)``): the packages are reached through a directory of links
    to this environment's, less those."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = str(root / "venv" / "bin" / "python")
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    ours = Path(sysconfig.get_paths()["purelib"])
    deps = ours
    if without:
        deps = root / "deps"
        deps.mkdir()
        for entry in ours.iterdir():
            if entry.name.split(".")[0].split("-")[0] not in without:
                (deps / entry.name).symlink_to(entry)
    Path(purelib, "deps.pth").write_text(f"{deps}\n")
    imports = ", ".join(["dask", "distributed", "numpy"])
    absent = "; ".join(f"assert importlib.util.find_spec({n!r}) is None" for n in without)
    probe = subprocess.run(
        [python, "-c", f"import importlib.util, {imports}; {absent or 'pass'}; import labkv"],
        cwd=root,
        env=clean_env(),
        capture_output=True,
        text=True,
    )
    assert "No module named 'labkv'" in probe.stderr, probe.stderr
    return python
