"""labkv's version and wire protocol: the protocol number changes whenever the
wire does, so that processes of different labkv versions never half-understand
each other (the cluster check compares the numbers, see ``labkv.cluster._runtime.compat``)."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import labkv
import labkv.cluster
from labkv.cluster._options import StoreSpec
from labkv.cluster._protocol import entries as _entries
from labkv.cluster._protocol import messages as _wire
from labkv.cluster._protocol.methods import METHODS
from labkv.cluster._server.actor import Server
from labkv.cluster._transport import stream as _stream
from labkv.events._round_records import RoundColumns

ROOT = Path(__file__).resolve().parents[1]

#: The wire's fingerprint for each protocol number. When the wire changes, give
#: labkv.PROTOCOL a new number and record its fingerprint here.
FINGERPRINTS = {
    2: "d2047b40c956718b",
    3: "ef30d086681bc611",
    4: "765b8da54d5cf94f",
    5: "e3bc54c106a79781",
    6: "8978215a5e2212da",
    7: "310d030c85ff7453",
    8: "71e6a4b525d0a363",
    9: "761260a209d6974a",
    10: "35aea683e9566371",
    11: "b6263b41502e442e",
    12: "c48c6515a706754d",
    13: "fc62c34a86f2025a",
    14: "88fb4d6a429f8066",
}


def _snapshots() -> list[type]:
    """Every ``...Snapshot`` dataclass of the cluster package (what a primary
    sends a new replica), found by walking the package."""
    found = []
    for info in pkgutil.walk_packages(labkv.cluster.__path__, "labkv.cluster."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            mine = isinstance(obj, type) and obj.__module__ == module.__name__
            if mine and name.endswith("Snapshot") and dataclasses.is_dataclass(obj):
                found.append(obj)
    return sorted(found, key=lambda c: f"{c.__module__}.{c.__qualname__}")


def wire_description() -> str:
    """What the processes of a store send each other: every message type's
    fields, every log-entry note's, every snapshot a new replica is seeded
    from, and every server method a rank or a peer calls, with its parameters;
    each with the module it is pickled under; the columns of the round
    records servers stream to the notebook; the kinds of a stream's messages;
    and where each server method's calls go."""
    lines = []
    for kind, module in (("message", _wire), ("note", _entries)):
        for name, obj in sorted(vars(module).items()):
            if isinstance(obj, type) and issubclass(obj, tuple) and hasattr(obj, "_fields"):
                lines.append(f"{kind} {obj.__module__}.{name}{obj._fields}")
    for snapshot in _snapshots():
        fields = [f.name for f in dataclasses.fields(snapshot)]
        lines.append(f"snapshot {snapshot.__module__}.{snapshot.__qualname__}{fields}")
    lines.append(f"spec {StoreSpec.__module__} {sorted(StoreSpec.__dataclass_fields__)}")
    # the events servers and ranks stream to the notebook: a record of many keys' rounds
    lines.append(f"event round_columns {list(RoundColumns.__slots__)}")
    # what a message on a stream is: a request, a reply of some kind, or a notice
    kinds = {n: getattr(_stream, n) for n in ("REQUEST", "RESULT", "ERROR", "GONE", "NOTICE")}
    lines.append(f"stream kinds {kinds}")
    for name, method in sorted(inspect.getmembers(Server, inspect.isfunction)):
        if not name.startswith("_"):
            lines.append(f"server {name}{list(inspect.signature(method).parameters)}")
    # where each call goes: in-process, as a frame, to every replica, ...
    lines.extend(f"route {row!r}" for _, row in sorted(METHODS.items()))
    return "\n".join(lines)


def test_the_protocol_number_changes_with_the_wire():
    fingerprint = hashlib.sha256(wire_description().encode()).hexdigest()[:16]
    assert FINGERPRINTS.get(labkv.PROTOCOL) == fingerprint, (
        f"the wire is now {fingerprint}, recorded for protocol {labkv.PROTOCOL} as "
        f"{FINGERPRINTS.get(labkv.PROTOCOL)}: if the wire changed, give labkv.PROTOCOL a new "
        f"number and record {{{labkv.PROTOCOL + 1}: {fingerprint!r}}} in FINGERPRINTS"
    )


def test_the_wire_description_sees_messages_and_server_methods():
    described = wire_description()
    assert (
        "message labkv.cluster._protocol.messages.Push(" in described
        and "server push['self', 'msg']" in described
    )
    assert "server init[" in described and "spec labkv.cluster._options [" in described
    assert "note labkv.cluster._protocol.entries.Clock('rank',)" in described
    assert "snapshot labkv.cluster._server.replication.seed.ServerSnapshot[" in described
    assert "route Method(name='streaming', local=False, message=False, broadcast=True," in described


def test_the_package_version_is_the_one_labkv_reports():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and 'path = "labkv/_version.py"' in pyproject
    assert re.fullmatch(r"\d+\.\d+\.\d+", labkv.__version__)
    from importlib.metadata import version

    assert version("labkv") == labkv.__version__


def test_the_changelog_names_every_protocol_and_this_version():
    """A protocol bump breaks mixed clusters: the changelog says so for each one."""
    text = (Path(__file__).resolve().parents[1] / "CHANGELOG.md").read_text()
    for protocol in FINGERPRINTS:
        assert f"(protocol {protocol})" in text, f"CHANGELOG.md does not name protocol {protocol}"
    assert f"## {labkv.__version__} (protocol {labkv.PROTOCOL})" in text


def test_labkv_ships_its_type_hints():
    assert (Path(labkv.__file__).parent / "py.typed").exists()
