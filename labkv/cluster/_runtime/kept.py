"""State a rank keeps in its process for another rank's replacement: what the
servers do not hold but every rank holds alike (a torch optimizer's weights and
state with ``update_on_kvstore=False``, see :mod:`labkv.torch._resume`), kept as
of the start of the rank's current step, and taken by a replacement from a live
rank at its resume step (``run(..., on_rank_loss="replace")``).

A rank keeps its last two steps' states: a replacement asks for its resume step,
and no live rank can be past its start (a dist_sync round of that step waits for
the lost rank's push), nor more than one step behind it. The replacement looks in
its own process first (ranks in threads, as the in-process tests run them), then
on every worker of the Dask cluster it runs on, until one holds the step or its
wait runs out.

>>> keep("run-a", rank=1, number=3, state={"w": 1})
>>> taken("run-a", number=3, rank=0)
{'w': 1}
>>> taken("run-a", number=4, rank=0) is None
True
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .._errors import ClusterError

_KEPT: dict[tuple[str, int], dict[int, Any]] = {}  # (run, rank) -> step number -> state
_LOCK = threading.Lock()
_STEPS_KEPT = 2
_ASK_S = 5.0  # the longest one look at the workers may take


def keep(run: str, rank: int, number: int, state: Any) -> None:
    """Rank ``rank`` of run ``run`` holds ``state`` as of the start of step ``number``
    (the other runs' states in this process go: a process runs one run's ranks)."""
    with _LOCK:
        for other in [k for k in _KEPT if k[0] != run]:
            del _KEPT[other]
        held = _KEPT.setdefault((run, rank), {})
        held[number] = state
        for old in sorted(held)[:-_STEPS_KEPT]:
            del held[old]


def taken(run: str, number: int, rank: int) -> Any | None:
    """The state another rank than ``rank`` keeps in this process for step
    ``number`` of run ``run`` (None: none here)."""
    with _LOCK:
        for (r, other), held in _KEPT.items():
            if r == run and other != rank and number in held:
                return held[number]
    return None


def steps_held(run: str) -> dict[int, list[int]]:
    """Per rank of run ``run`` kept in this process, the steps it holds."""
    with _LOCK:
        return {rank: sorted(held) for (r, rank), held in _KEPT.items() if r == run}


def _on_this_worker(run: str, number: int, rank: int) -> tuple[Any | None, dict[int, list[int]]]:
    return taken(run, number, rank), steps_held(run)


def take(run: str, number: int, rank: int, timeout: float, what: str) -> Any:
    """The state of step ``number`` another rank of run ``run`` keeps, for rank
    ``rank``'s replacement: from this process, else from the Dask workers (when
    this runs on one), waiting up to ``timeout`` seconds for a live rank to
    reach the step; ``what`` names the state in the error."""
    deadline = time.monotonic() + timeout
    pause = 0.01
    while True:
        state = taken(run, number, rank)
        if state is not None:
            return state
        left = max(0.1, deadline - time.monotonic())
        state, seen = _from_workers(run, number, rank, min(left, _ASK_S))
        if state is not None:
            return state
        seen = {**steps_held(run), **seen}
        seen.pop(rank, None)
        if time.monotonic() >= deadline:
            held = ", ".join(f"rank {r} holds steps {s}" for r, s in sorted(seen.items()))
            raise ClusterError(
                f"rank {rank}'s replacement needs {what} as of step {number}, which only the "
                f"ranks hold, and no live rank reached that step within {timeout:g} s "
                f"({held or 'no rank keeps any'})"
            )
        time.sleep(pause)
        pause = min(2 * pause, 0.25)


def _from_workers(
    run: str, number: int, rank: int, timeout: float
) -> tuple[Any | None, dict[int, list[int]]]:
    """Ask every worker of the Dask cluster this process is a worker of, for at
    most ``timeout`` seconds (a frozen worker does not answer ``client.run``:
    its thread is left behind, the wait goes on without it)."""
    try:
        from distributed import get_client, get_worker

        get_worker()
    except (ImportError, ValueError):  # not on a Dask worker: only this process's ranks
        return None, {}
    client, answer = get_client(), {}

    def ask() -> None:
        answer.update(client.run(_on_this_worker, run, number, rank, on_error="return"))

    asking = threading.Thread(target=ask, name="labkv-kept-state", daemon=True)
    asking.start()
    asking.join(timeout)
    state, seen = None, {}
    for reply in list(answer.values()):
        if isinstance(reply, BaseException):  # a worker leaving: the others answer
            continue
        found, held = reply
        seen.update(held)
        if found is not None and state is None:
            state = found
    return state, seen
