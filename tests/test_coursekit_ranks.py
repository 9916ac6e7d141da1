"""notebooks/coursekit.py's ``spawn_ranks`` (notebook 12): results in rank order, and a
failed or hung rank named in the error, the others stopped, nothing left running."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("cloudpickle")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "notebooks"))

from coursekit import RankFailed, spawn_ranks  # noqa: E402

# The rank functions are defined inside the tests: cloudpickle sends them by value, as it
# sends those a notebook defines.
pytestmark = pytest.mark.slow


def failure(fn, **options) -> str:
    """The message of the RankFailed that ``spawn_ranks(fn, 2, **options)`` raises; the
    ranks' files it keeps for inspection are removed."""
    with pytest.raises(RankFailed) as failed:
        spawn_ranks(fn, 2, **options)
    message = str(failed.value)
    shutil.rmtree(re.search(r"\(every rank's files: (.+)\)$", message).group(1))
    return message


def test_results_come_back_in_rank_order_after_a_collective():
    def add_ranks(rank, world, offset):
        import torch
        import torch.distributed as dist

        x = torch.tensor([float(rank + offset)])
        dist.all_reduce(x)
        return rank, world, float(x)

    assert spawn_ranks(add_ranks, 2, (10,)) == [(0, 2, 21.0), (1, 2, 21.0)]


def test_a_rank_that_raises_is_named_first_and_the_other_is_stopped():
    def rank_1_fails(rank, world):
        import torch.distributed as dist

        if rank == 1:
            raise ValueError("rank 1's own mistake")
        dist.barrier()  # waits for rank 1, which never comes

    message = failure(rank_1_fails, timeout=60)
    assert message.splitlines()[0] == "rank 1 raised ValueError: rank 1's own mistake", message
    assert "then rank 0" in message


def test_a_rank_that_dies_is_named_with_its_signal():
    def rank_0_aborts(rank, world):
        if rank == 0:
            os.abort()
        return rank

    message = failure(rank_0_aborts, timeout=60)
    assert message.startswith("rank 0 ended with signal SIGABRT"), message


def test_ranks_that_do_not_exit_are_killed_at_the_timeout():
    def hang(rank, world):
        import time

        time.sleep(600)

    lines = failure(hang, timeout=3).splitlines()
    assert lines[:2] == [
        "rank 0 did not exit within 3 s: killed",
        "then rank 1 did not exit within 3 s: killed",
    ], lines
