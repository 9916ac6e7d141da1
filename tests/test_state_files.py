"""Hostile and malformed optimizer-state files: each is refused with a
ValueError naming the file and what is wrong (never numpy's ``allow_pickle``
hint, never a raw Python error), and the store is left as it was, on the
local store and a distributed one alike; an unused huge member is not read."""

from __future__ import annotations

import io
import json
import resource
import zipfile

import numpy as np
import pytest

import labkv
from labkv._optim.statefile import FORMAT

SHAPE = (3,)


def _store(kind: str, handle=None):
    kv = labkv.create(kind) if handle is None else labkv.create(kind, cluster=handle, num_servers=2)
    kv.init("w", np.zeros(SHAPE, np.float32))
    kv.init("b", np.zeros(SHAPE, np.float32))
    kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.1, momentum=0.9))
    kv.push(["w", "b"], [np.ones(SHAPE, np.float32), np.full(SHAPE, 2.0, np.float32)])
    return kv


def _npy(array: np.ndarray, allow_pickle: bool = False) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array(out, array, allow_pickle=allow_pickle)
    return out.getvalue()


def _write(path, meta, arrays: dict, raw: dict | None = None) -> None:
    """An npz as labkv writes one, with ``meta`` (an object, or raw JSON text)."""
    text = meta if isinstance(meta, str) else json.dumps(meta)
    blob = np.frombuffer(text.encode(), dtype=np.uint8)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("__meta__.npy", _npy(blob))
        for name, array in arrays.items():
            z.writestr(f"{name}.npy", _npy(array))
        for name, data in (raw or {}).items():
            z.writestr(name, data)


def _good():
    meta = {
        "format": FORMAT,
        "keys": [
            {"key": ["str", "w"], "count": 1, "n": 1},
            {"key": ["str", "b"], "count": 1, "n": 1},
        ],
        "optimizer": None,
        "num_update": 1,
    }
    state = np.full(SHAPE, 0.5, np.float32)
    return meta, {"s0_0": state, "s1_0": state}


def _with(change):
    meta, arrays = _good()
    change(meta, arrays)
    return meta, arrays


def _set(path, value):
    def change(meta, arrays):
        *parents, last = path
        target = meta
        for p in parents:
            target = target[p]
        target[last] = value

    return change


HOSTILE = {
    "keys not a list": _with(_set(["keys"], {"w": 1})),
    "an entry not an object": _with(_set(["keys", 0], ["str", "w"])),
    "an entry without n": _with(lambda m, a: m["keys"][0].pop("n")),
    "a key of no kind": _with(_set(["keys", 0, "key"], ["float", 1.5])),
    "a key it does not have": _with(_set(["keys", 0, "key"], ["str", "nope"])),
    "a key twice": _with(_set(["keys", 1, "key"], ["str", "w"])),
    "a negative count": _with(_set(["keys", 0, "count"], -1)),
    "a count as text": _with(_set(["keys", 0, "count"], "1")),
    "num_update missing": _with(lambda m, a: m.pop("num_update")),
    "two states for a one-state SGD key": _with(
        lambda m, a: (m["keys"][0].update(n=2), a.update(s0_1=a["s0_0"]))
    ),
    "Adam settings over SGD states": _with(
        _set(["optimizer"], labkv.optimizers.Adam(learning_rate=0.1).to_config())
    ),
    "settings of no optimizer": _with(_set(["optimizer"], {"name": "nope", "params": 3})),
    "a state of another shape": _with(lambda m, a: a.update(s0_0=np.zeros(4, np.float32))),
    "a complex state": _with(lambda m, a: a.update(s0_0=np.zeros(SHAPE, np.complex64))),
    "an int state": _with(lambda m, a: a.update(s0_0=np.zeros(SHAPE, np.int32))),
    "a bool state": _with(lambda m, a: a.update(s0_0=np.zeros(SHAPE, bool))),
    "a datetime state": _with(lambda m, a: a.update(s0_0=np.zeros(SHAPE, "datetime64[s]"))),
    "a missing state": _with(lambda m, a: a.pop("s1_0")),
    "another format": _with(_set(["format"], "labkv-optimizer-states/99")),
}


def _hostile_files(tmp_path):
    for name, (meta, arrays) in HOSTILE.items():
        path = tmp_path / name.replace(" ", "_")
        _write(path, meta, arrays)
        yield name, path
    path = tmp_path / "random_bytes"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    yield "random bytes", path
    path = tmp_path / "empty"
    path.write_bytes(b"")
    yield "an empty file", path
    meta, arrays = _good()
    path = tmp_path / "not_json"
    _write(path, "{not json", arrays)
    yield "metadata that is not JSON", path
    path = tmp_path / "deep"
    _write(path, "[" * 100_000 + "]" * 100_000, arrays)
    yield "metadata nested 100,000 deep", path
    path = tmp_path / "list_meta"
    _write(path, "[1, 2]", arrays)
    yield "metadata that is a list", path
    path = tmp_path / "no_meta"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("s0_0.npy", _npy(arrays["s0_0"]))
    yield "no metadata", path
    path = tmp_path / "pickled"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("__meta__.npy", _npy(np.array([{"format": FORMAT}], dtype=object), True))
    yield "pickled metadata", path
    # A state member whose header says 3 floats but which unpacks to 64 MiB.
    path = tmp_path / "bloated"
    bloated = _npy(arrays["s0_0"]) + b"\0" * (64 << 20)
    _write(path, meta, {"s1_0": arrays["s1_0"]}, raw={"s0_0.npy": bloated})
    yield "a state member bigger than its header", path


def _states(kv, path) -> tuple:
    kv.save_optimizer_states(path)
    meta, arrays = labkv._optim.statefile.load(path)
    return json.dumps(meta, sort_keys=True), {k: v.tobytes() for k, v in arrays.items()}


def test_every_hostile_file_is_refused_by_name_and_changes_nothing(tmp_path, handle):
    stores = {"local": _store("local"), "dist_sync": _store("dist_sync", handle)}
    try:
        before = {kind: _states(kv, tmp_path / f"before-{kind}") for kind, kv in stores.items()}
        messages = {}
        for name, path in _hostile_files(tmp_path):
            said = {}
            for kind, kv in stores.items():
                with pytest.raises(ValueError) as info:
                    kv.load_optimizer_states(path)
                said[kind] = str(info.value)
                assert _states(kv, tmp_path / f"after-{kind}") == before[kind], (name, kind)
            message = said["local"]
            assert said["dist_sync"] == message, name  # both stores refuse alike
            assert repr(str(path)) in message, (name, message)
            assert "allow_pickle" not in message, (name, message)
            messages[name] = message.replace(str(path), "<file>")
        assert len(set(messages.values())) == len(messages), messages  # each says what
    finally:
        stores["dist_sync"].close()


def test_a_good_file_still_loads_and_an_unused_huge_member_is_not_read(tmp_path):
    kv = _store("local")
    meta, arrays = _good()
    path = tmp_path / "with_junk"
    # 256 MiB of zeros deflate to about 256 KiB: a small file, a huge member.
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        text = json.dumps(meta).encode()
        z.writestr("__meta__.npy", _npy(np.frombuffer(text, dtype=np.uint8)))
        for name, array in arrays.items():
            z.writestr(f"{name}.npy", _npy(array))
        with z.open("junk.npy", "w", force_zip64=True) as junk:
            chunk = b"\0" * (1 << 20)
            for _ in range(256):
                junk.write(chunk)
    assert path.stat().st_size < 4 << 20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kv.load_optimizer_states(path)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 64 << 10  # KiB: < 64 MiB
    weight = kv.pull("w")
    kv.push("w", np.ones(SHAPE, np.float32))  # MXNet's SGD: mom = 0.9 mom - 0.1 grad; w += mom
    np.testing.assert_allclose(kv.pull("w"), weight + (0.9 * 0.5 - 0.1), rtol=1e-6)
