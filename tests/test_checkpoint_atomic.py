"""A checkpoint is written atomically: a save that fails (a full disk, here a
file size limit) or is killed midway leaves the previous file as it was, and
the temporary a killed save left is removed by the next save of that name
(never the one a live save is writing)."""

from __future__ import annotations

import random
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import labkv

resource = pytest.importorskip("resource")

SAVER = textwrap.dedent(
    """
    import resource, signal, sys
    import numpy as np
    import labkv

    path, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    kv = labkv.create("local")
    kv.init("w", np.zeros(n, np.float32))
    kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.1, momentum=0.9))
    kv.push("w", np.ones(n, np.float32))
    if mode == "limit":  # a disk that takes only 64 KiB more
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
        try:
            kv.save_optimizer_states(path)
        except OSError as exc:
            print("refused", exc.errno, flush=True)
    else:  # save again and again until killed
        print("ready", flush=True)
        while True:
            kv.push("w", np.ones(n, np.float32))
            kv.save_optimizer_states(path)
    """
)


def _good_checkpoint(path) -> bytes:
    kv = labkv.create("local")
    kv.init("w", np.zeros(4, np.float32))
    kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.1, momentum=0.9))
    kv.push("w", np.full(4, 2.0, np.float32))
    kv.save_optimizer_states(path)
    return path.read_bytes()


def _loads(path) -> bool:
    kv = labkv.create("local")
    kv.init("w", np.zeros(4, np.float32))
    kv.set_optimizer(labkv.optimizers.SGD(learning_rate=0.1, momentum=0.9))
    kv.load_optimizer_states(path)
    return True


def test_a_save_that_fails_for_want_of_space_keeps_the_last_checkpoint(tmp_path):
    path = tmp_path / "states"
    before = _good_checkpoint(path)
    done = subprocess.run(
        [sys.executable, "-c", SAVER, str(path), "limit", str(1 << 16)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.startswith("refused"), done.stdout + done.stderr
    assert path.read_bytes() == before and _loads(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["states"]  # no temporary left


@pytest.mark.slow
def test_a_save_killed_midway_leaves_a_loadable_checkpoint(tmp_path):
    path = tmp_path / "states"
    _good_checkpoint(path)
    rng = random.Random(7)
    for _ in range(10):
        saver = subprocess.Popen(
            [sys.executable, "-c", SAVER, str(path), "loop", str(4 << 20)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert saver.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.05, 0.6))
        finally:
            saver.kill()
            saver.wait(timeout=30)
            saver.stdout.close()
        meta, arrays = labkv._optim.statefile.load(path)
        sizes = {a.size for a in arrays.values()}
        assert sizes in ({4}, {4 << 20}), sizes  # the old file or a whole new one


def _kill_midway(path, n: int) -> None:
    """Start a process that saves ``path`` in a loop and SIGKILL it while a
    save's temporary is on disk (the loop is mostly saving)."""
    saver = subprocess.Popen(
        [sys.executable, "-c", SAVER, str(path), "loop", str(n)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert saver.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 120  # stops a hang only
        while not _temporaries(path) and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        saver.kill()
        saver.wait(timeout=30)
        saver.stdout.close()


def _temporaries(path) -> list[str]:
    pattern = re.compile(rf"\.{re.escape(path.name)}\.[0-9a-f]{{12}}\.tmp")
    return sorted(p.name for p in path.parent.iterdir() if pattern.fullmatch(p.name))


@pytest.mark.slow
def test_the_temporaries_of_killed_saves_are_removed_by_the_next_save(tmp_path):
    path = tmp_path / "states"
    _good_checkpoint(path)
    kept = [tmp_path / ".states.notours.tmp", tmp_path / ".other.0123456789ab.tmp"]
    for other in kept:  # not this name's saves' temporaries: never removed
        other.write_bytes(b"x")
    left = []
    for _ in range(6):
        _kill_midway(path, 2 << 20)
        left.append(len(_temporaries(path)))
    # Each killed save left its temporary, and the next run's first save removed
    # the one before: never more than one at a time.
    assert left == [1] * 6, left
    assert _loads(path)
    _good_checkpoint(path)
    assert _temporaries(path) == [] and _loads(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["states", *(p.name for p in kept)])


HOLDER = textwrap.dedent(
    """
    import sys
    from labkv._optim.statefile import atomic_write

    with atomic_write(sys.argv[1]) as f:
        f.write(b"live")
        print("writing", flush=True)
        sys.stdin.readline()  # until told to finish
    print("done", flush=True)
    """
)


def test_a_save_keeps_the_temporary_that_a_live_save_is_writing(tmp_path):
    path = tmp_path / "states"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "writing"
        live = _temporaries(path)
        assert len(live) == 1
        _good_checkpoint(path)  # another save of the same name meanwhile
        assert _temporaries(path) == live
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "done"
    finally:
        holder.kill()
        holder.wait(timeout=30)
        holder.stdin.close()
        holder.stdout.close()
    assert path.read_bytes() == b"live"  # the live save finished, last
    assert _temporaries(path) == []
