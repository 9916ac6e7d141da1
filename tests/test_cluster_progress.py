"""``run``'s progress: the ranks' step loops as one line on stderr in a terminal,
and as whole lines, seldom, on a stderr that is no terminal (a log)."""

from __future__ import annotations

import numpy as np

from labkv.cluster import run
from labkv.cluster._runtime import progress


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


def _report_steps(monkeypatch, tty: bool) -> progress.Progress:
    monkeypatch.setattr(progress, "_stderr_is_tty", lambda: tty)
    shown = progress.Progress(None, "t", ranks=2)
    for number in range(1, 21):
        shown.heard((0.0, [0, number, 20]))
        shown.heard((0.0, [1, number, 20]))
        shown._drawn = 0.0  # as if each report came after the last draw's interval
    shown.client = None  # close's unsubscribe then fails, as with a gone scheduler
    shown.close()
    return shown


def test_a_log_gets_whole_lines_seldom_and_the_last_step_and_a_terminal_gets_one_line(
    monkeypatch, capsys
):
    _report_steps(monkeypatch, tty=False)
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert lines[-1] == "run: step 20 of 20, 2 ranks (slowest rank 0)"
    assert len(lines) == 2  # the first report, then the end: 19 more came within 10 s
    _report_steps(monkeypatch, tty=True)
    err = capsys.readouterr().err
    assert err.count("\r") >= 19 and err.count("\n") == 1
    assert err.endswith("\rrun: step 20 of 20, 2 ranks (slowest rank 0)\n")
