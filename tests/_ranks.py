"""Rank functions shared by the cluster tests (``run(fn, ...)``): the workers
import them from here, as the repository is on their path."""

from __future__ import annotations

import time

import numpy as np


def push_and_pull_for(kv, seconds: float, pause: float = 0.0) -> None:
    """Push ones to ``"w"`` (initialised here) and pull it, for ``seconds``."""
    kv.init("w", np.zeros(4, np.float32))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        kv.push("w", np.ones(4, np.float32))
        kv.pull("w")
        if pause:
            time.sleep(pause)
