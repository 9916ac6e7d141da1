"""``run``'s progress: the ranks' step loops as one line on stderr in a terminal."""

from __future__ import annotations

import numpy as np

from labkv.cluster import run


def _steps(kv, n):
    kv.init("w", np.zeros(2))
    for _ in kv.steps(n):
        kv.push("w", np.ones(2))
        kv.pull("w")
    return kv.rank


def _no_loop(kv):
    kv.init("w", np.zeros(2))
    return kv.rank


def test_a_runs_steps_show_as_one_line_in_a_terminal_and_not_with_progress_off(handle, capfd):
    assert run(_steps, 2, cluster=handle, args=(12,)) == [0, 1]
    err = capfd.readouterr().err
    assert "run: step 12 of 12, 2 ranks" in err and err.endswith("\n")
    assert run(_steps, 2, cluster=handle, args=(12,), progress=False) == [0, 1]
    assert run(_no_loop, 2, cluster=handle) == [0, 1]
    assert "run: step" not in capfd.readouterr().err
