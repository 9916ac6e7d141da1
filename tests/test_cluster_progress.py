"""``run``'s progress: the ranks' step loops as one line on stderr in a terminal,
and as whole lines, seldom, on a stderr that is no terminal (a log); and what the
long waits (servers starting, init, optimizer states) say while they last."""

from __future__ import annotations

import re
import time

import dask
import numpy as np
import pytest

import labkv
from labkv.cluster import run
from labkv.cluster._runtime import line, progress, waits


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
    monkeypatch.setattr(line, "_stderr_is_tty", lambda: tty)
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


def test_a_wait_says_what_it_waits_for_only_once_it_lasts_and_how_it_ended():
    shown = []
    with waits.announced("a short call", after_s=30.0, show=shown.append):
        pass
    assert shown == []
    with waits.announced("a long call", after_s=0.05, show=shown.append):
        time.sleep(0.3)
    assert shown[0] == "labkv: a long call ..."
    assert re.fullmatch(r"labkv: a long call: done in 0\.\d s", shown[1]), shown
    shown.clear()
    with pytest.raises(KeyError), waits.announced("a failing call", 0.0, shown.append):
        raise KeyError("w")
    assert re.fullmatch(r"labkv: a failing call: failed after 0\.\d s", shown[-1]), shown


def test_a_notice_never_comes_after_its_wait_ended():
    # the timer fires about when the block ends: its notice is shown before
    # the end's line or not at all
    for _ in range(200):
        shown = []
        with waits.announced("a call", after_s=0.001, show=shown.append):
            pass
        time.sleep(0.002)
        if shown:
            assert len(shown) == 2 and shown[0] == "labkv: a call ...", shown
            assert ": done in " in shown[1], shown


def _init_and_save(kv, path):
    kv.init(["a", "b"], [np.zeros(4), np.zeros(4)])
    kv.set_optimizer("sgd", learning_rate=0.1, momentum=0.9)
    kv.push("a", np.ones(4))
    kv.save_optimizer_states(path)
    kv.load_optimizer_states(path)
    return kv.rank


def test_the_caller_s_long_waits_show_on_stderr_and_a_rank_s_do_not(
    handle, monkeypatch, capfd, tmp_path
):
    monkeypatch.setattr(waits, "NOTICE_AFTER_S", 0.0)  # every wait is "long"
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2)
    _init_and_save(kv, str(tmp_path / "states"))
    kv.close()
    err = capfd.readouterr().err
    done = [line for line in err.splitlines() if ": done in " in line]
    for what in (
        "starting 2 servers of dist_sync on 2 workers",
        "initialising 2 keys (0.0 MiB) on 2 servers",
        "reading the optimizer states of 2 servers",
        "loading optimizer states into 2 servers",
    ):
        assert f"labkv: {what} ..." in err.splitlines(), (what, err)
        assert any(line.startswith(f"labkv: {what}: done in ") for line in done), (what, err)
    # a rank's store lives on a worker: nothing of its waits reaches the caller
    assert run(_init_and_save, 2, cluster=handle, args=(str(tmp_path / "r"),)) == [0, 1]
    assert "labkv: initialising" not in capfd.readouterr().err
    with dask.config.set({"labkv.progress": False}):
        kv = labkv.create("dist_sync", cluster=handle, num_servers=2)
        _init_and_save(kv, str(tmp_path / "off"))
        kv.close()
        assert run(_steps, 2, cluster=handle, args=(3,)) == [0, 1]
    assert "labkv:" not in capfd.readouterr().err and "run: step" not in err


def test_starting_the_embedded_cluster_and_an_upload_say_what_they_wait_for(
    monkeypatch, capfd, tmp_path
):
    from labkv.cluster import connect

    monkeypatch.setattr(waits, "NOTICE_AFTER_S", 0.0)
    module = tmp_path / "labkv_wait_mod.py"
    module.write_text("VALUE = 1\n")
    with connect(n_workers=1, set_as_default=False) as handle:
        handle.upload_module(module)
    err = capfd.readouterr().err.splitlines()
    for what in (
        "starting a local Dask cluster of 1 worker",
        "uploading labkv_wait_mod.py to the scheduler and workers",
    ):
        assert f"labkv: {what} ..." in err, (what, err)
        assert any(line.startswith(f"labkv: {what}: done in ") for line in err), (what, err)
