"""Replication knows the server's parts by narrow interfaces only
(``labkv/cluster/_server/replication/ports.py``): no module of ``replication/``
imports another ``_server/`` module at run time, and every part a server hands
to replication has each member of its port, with the same parameters, on real
dist_sync, dist_async and dist_ssp servers."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

from labkv.cluster._server.replication import ports
from tests import _layout
from tests._inprocess import InProcessCluster

REPLICATION = "labkv.cluster._server.replication."


def _run_time_reaches(folder: Path | None = None) -> list[str]:
    """``module:line -> target`` for each import of a ``replication/`` module that
    runs (``TYPE_CHECKING`` blocks aside) and reaches ``_server/`` outside it."""
    found = []
    for module, path in _layout.modules().items():
        if not module.startswith(REPLICATION):
            continue
        if folder is not None:
            path = folder / path.name
        for line, target in _layout.imports(module, path, typing=False):
            if target.startswith("labkv.cluster._server.") and not target.startswith(REPLICATION):
                found.append(f"{module}:{line} -> {target}")
    return found


def test_no_replication_module_imports_a_server_part_at_run_time():
    assert _run_time_reaches() == []


def test_the_import_check_sees_a_server_part_imported_in_a_function(tmp_path):
    source = Path(ports.__file__).parent
    for path in source.glob("*.py"):
        (tmp_path / path.name).write_text(path.read_text())
    (tmp_path / "reads.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..actor import Server\n"  # type-only: allowed
        "def f():\n    from ..modes import SyncMode\n"
    )
    assert _run_time_reaches(tmp_path) == [
        "labkv.cluster._server.replication.reads:5 -> labkv.cluster._server.modes",
        "labkv.cluster._server.replication.reads:5 -> labkv.cluster._server.modes.SyncMode",
    ]


def _port_members(port: type) -> dict[str, object]:
    """The members a port declares: its methods, and its attributes by annotation."""
    members = {
        n: v
        for n, v in vars(port).items()
        if inspect.isfunction(v) and (not n.startswith("_") or n in ("__getitem__", "__contains__"))
    }
    members.update({n: None for n in getattr(port, "__annotations__", {})})
    return members


def _missing(part: object, port: type) -> list[str]:
    """What ``part`` lacks of ``port``: a member, or a method whose parameters differ."""
    wrong = []
    for name, declared in _port_members(port).items():
        if not hasattr(part, name):
            wrong.append(f"{type(part).__name__} has no {name}")
            continue
        if declared is None:
            continue
        got = list(inspect.signature(getattr(part, name)).parameters)
        want = list(inspect.signature(declared).parameters)[1:]  # without self
        if got != want:
            wrong.append(f"{type(part).__name__}.{name}{got} is not {port.__name__}'s {want}")
        if inspect.iscoroutinefunction(declared) != inspect.iscoroutinefunction(
            getattr(part, name)
        ):
            wrong.append(f"{type(part).__name__}.{name} is not async as {port.__name__} says")
    return wrong


def _parts(server) -> list[tuple[object, type]]:
    """Each part of ``server`` replication sees, with its port."""
    parts = [(server, ports.ServerPort)]
    for name, port in ports.ServerPort.__annotations__.items():
        port = getattr(ports, str(port).split(" |")[0], None)
        value = getattr(server, name)
        if getattr(port, "__module__", None) == ports.__name__ and value is not None:
            parts.append((value, port))
    return parts


@pytest.mark.parametrize("kind", ["dist_sync", "dist_async", "dist_ssp"])
def test_every_part_a_server_hands_to_replication_has_its_ports_members(kind):
    staleness = 1 if kind == "dist_ssp" else None
    with InProcessCluster(kind, num_servers=1, num_workers=2, staleness=staleness) as cluster:
        cluster.ranks[0].init("w", np.ones(2, np.float32))
        server = cluster.servers[0]
        parts = _parts(server)
        assert {port for _, port in parts} >= {ports.RoundsPort, ports.ModePort, ports.FencesPort}
        wrong = [w for part, port in parts for w in _missing(part, port)]
        wrong += _missing(server.rounds["w"], ports.RoundPort)
        assert wrong == []
        assert server.mode.sync is (kind == "dist_sync")


def test_the_member_check_sees_a_missing_member_and_other_parameters():
    class Rounds:
        joined = 0

        def __getitem__(self, other_name):
            return None

    wrong = _missing(Rounds(), ports.RoundsPort)
    assert "Rounds.__getitem__['other_name'] is not RoundsPort's ['key']" in wrong
    assert "Rounds has no snapshot" in wrong
