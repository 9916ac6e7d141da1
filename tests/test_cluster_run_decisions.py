"""Each decision of ``run``'s watcher (``Run`` in ``_runtime/run.py``) alone,
without Dask: a fake handle whose live workers the test sets, fake rank
futures whose status the test sets, and a fake client that records what it
is asked to submit and cancel. A lost rank or server is named, a lost rank is
replaced or dropped, a finished rank's result is gathered, and a failure
aborts the servers, cancels the ranks and raises."""

from __future__ import annotations

import distributed
import pytest

import labkv.cluster._runtime.run as run_module
from labkv.cluster._errors import ClusterError, ServerLost
from labkv.cluster._options import StoreSpec
from labkv.cluster._runtime.run import RankTask, Run

A, B, C = "tcp://10.0.0.1:4001", "tcp://10.0.0.2:4002", "tcp://10.0.0.3:4003"


class FakeFuture:
    """A rank's future: its ``status`` set by the test; ``outcome`` is what
    ``result()`` returns, or raises when it is an exception."""

    def __init__(self, key: str, status: str = "pending", outcome=None):
        self.key, self.status, self.outcome = key, status, outcome
        self.callbacks: list = []

    def result(self, timeout=None):
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    def exception(self):
        return self.outcome if isinstance(self.outcome, BaseException) else None

    def add_done_callback(self, callback) -> None:
        self.callbacks.append(callback)


class FakeClient:
    """Records what is submitted, cancelled and subscribed to."""

    def __init__(self):
        self.status = "running"
        self.submitted: list[tuple[str, list[str]]] = []
        self.cancelled: list[list] = []
        self.topics: list[str] = []

    def submit(self, fn, *args, key, workers, allow_other_workers, pure):
        self.submitted.append((key, workers))
        return FakeFuture(key)

    def cancel(self, futures) -> None:
        self.cancelled.append(list(futures))

    def subscribe_topic(self, topic, handler) -> None:
        self.topics.append(topic)

    def unsubscribe_topic(self, topic) -> None:
        pass


class FakeHandle:
    """A cluster handle whose live workers are ``live``."""

    def __init__(self, live: list[str]):
        self.live, self.client, self.cluster = list(live), FakeClient(), None

    def workers(self) -> list[str]:
        return sorted(self.live)


def _run(live, rank_workers, server_addresses, on_rank_loss="fail", statuses=None):
    """A started run of ``len(rank_workers)`` ranks on servers at
    ``server_addresses`` (reached by no actor: an abort calls nothing), its
    ranks' futures pending (or of ``statuses``)."""
    handle = FakeHandle(live)
    run = Run(
        handle,
        RankTask(print, (), {}, len(rank_workers)),
        list(rank_workers),
        on_rank_loss=on_rank_loss,
        replace_timeout=1.0,
    )
    kind = "dist_async" if on_rank_loss == "shrink" else "dist_sync"
    run.spec = StoreSpec(kind, "store-1", len(server_addresses), list(server_addresses))
    run.futures = [
        FakeFuture(f"rank-{r}", status)
        for r, status in enumerate(statuses or ["pending"] * len(rank_workers))
    ]
    run.open_links()
    run.seen = set(live)
    return run


@pytest.fixture
def aborts(monkeypatch):
    """The reasons the servers were told to abort with, in order."""
    reasons = []
    monkeypatch.setattr(
        run_module, "_abort", lambda client, spec, servers, why: reasons.append(why)
    )
    return reasons


def test_a_rank_whose_worker_vanished_is_lost_with_the_server_it_hosted():
    run = _run([A, C], [A, B], [B, C])
    assert run.lost_workers() == (
        f"Dask worker(s) ['{B}'] died: ranks [1] lost; servers [0] lost with their "
        "keys' values and optimizer states"
    )


def test_no_lost_worker_is_no_reason_to_fail():
    run = _run([A, B, C], [A, B], [B, C])
    assert run.lost_workers() is None
    assert run.lost_servers({A, B, C}) == []


def test_a_finished_rank_is_not_lost_with_its_worker():
    run = _run([A], [A, B], [A])
    run.results[1] = "done"
    assert run.lost_workers() is None


def test_a_lost_rank_is_replaced_on_a_free_worker_and_its_old_task_cancelled():
    run = _run([A, C], [A, B], [A], on_rank_loss="replace")
    old = run.futures[1]
    assert run.lost_workers() is None
    assert run.rank_workers == [A, C]
    assert run.futures[1] is not old
    assert run.futures[1].key == f"labkv-rank-{run.group}-1-i1"
    assert run.handle.client.submitted == [(f"labkv-rank-{run.group}-1-i1", [C])]
    assert run.handle.client.cancelled == [[old]]
    assert run.handle.client.topics == [C]  # the watcher hears if the replacement's worker goes
    assert len(run.futures[1].callbacks) == 1
    assert run.replace.incarnations == {1: 1}
    assert run.handled(1, old)


def test_a_lost_server_fails_the_run_even_where_ranks_are_replaced():
    run = _run([A, C], [A, B], [B], on_rank_loss="replace")
    reason = run.lost_workers()
    assert reason == (
        f"Dask worker(s) ['{B}'] died: ranks [1] lost; servers [0] lost with their "
        "keys' values and optimizer states"
    )
    assert run.handle.client.submitted == []
    assert run.handle.client.cancelled == []


def test_a_shrinking_run_goes_on_without_a_lost_rank_whose_result_is_none():
    run = _run([A, C], [A, B], [A], on_rank_loss="shrink")
    old = run.futures[1]
    assert run.lost_workers() is None
    assert run.results == {1: None}
    assert run.futures[1] is old
    assert run.rank_workers == [A, B]
    assert run.replace.dropped == [1]
    assert run.handle.client.cancelled == [[old]]
    assert run.handle.client.submitted == []
    assert run.handled(1, old)


def test_losing_the_last_rank_of_a_shrinking_run_fails_it(aborts):
    run = _run([C], [A], [C], on_rank_loss="shrink")
    with pytest.raises(ClusterError, match="every rank was lost") as caught:
        run.check_workers()
    assert aborts == [str(caught.value)]
    assert run.handle.client.cancelled[-1] == run.futures


def test_handled_means_replaced_or_dropped():
    run = _run([A, B], [A, B], [A])
    failed = run.futures[0]
    assert not run.handled(0, failed)
    run.futures[0] = FakeFuture("rank-0-i1")
    assert run.handled(0, failed)
    assert not run.handled(1, run.futures[1])
    run.results[1] = None
    assert run.handled(1, run.futures[1])


def test_a_finished_rank_s_result_is_gathered_and_a_running_one_s_is_not():
    run = _run([A, B], [A, B], [A])
    run.futures[0].status, run.futures[0].outcome = "finished", [1.0, 2.0]
    run.gather_finished()
    assert run.results == {0: [1.0, 2.0]}
    run.futures[0].outcome = "gathered again"  # a result is gathered once
    run.gather_finished()
    assert run.results == {0: [1.0, 2.0]}


def test_a_result_lost_with_its_worker_is_not_gathered():
    run = _run([A], [A, B], [A])
    run.futures[1].status = "finished"
    run.futures[1].outcome = distributed.TimeoutError()  # never reaches this process
    run.gather_finished()
    assert run.results == {}


def test_failed_ranks_are_those_without_a_result_whose_task_failed():
    statuses = ["error", "error", "cancelled", "pending", "lost", "finished"]
    run = _run([A, B, C], [A, B, C, A, B, C], [A], statuses=statuses)
    run.results[0] = None
    assert run.failed_ranks() == [1, 2, 4]


def test_fail_aborts_the_servers_cancels_the_ranks_and_raises_the_reason(aborts):
    run = _run([A, B], [A, B], [A])
    with pytest.raises(ClusterError, match="^the reason$"):
        run.fail("the reason", None)
    assert aborts == ["the reason"]
    assert run.handle.client.cancelled == [run.futures]


def test_fail_with_a_cause_raises_the_cause(aborts):
    run = _run([A, B], [A, B], [A])
    cause = ValueError("the rank's own error")
    with pytest.raises(ValueError) as caught:
        run.fail("rank 1 failed", cause)
    assert caught.value is cause
    assert aborts == ["rank 1 failed"]
    assert run.handle.client.cancelled == [run.futures]


def test_a_failed_rank_on_a_live_worker_fails_the_run_with_its_error(aborts):
    cause = ZeroDivisionError("division by zero")
    run = _run([A, B], [A, B], [A], statuses=["pending", "error"])
    run.futures[1].outcome = cause
    with pytest.raises(ZeroDivisionError) as caught:
        run.rank_failed(1)
    assert caught.value is cause
    assert aborts == [f"rank 1 (on {B}) failed (error)"]


def test_a_failed_rank_whose_worker_died_names_the_worker(aborts):
    cause = RuntimeError("connection lost")
    run = _run([A], [A, B], [A], statuses=["pending", "error"])
    run.futures[1].outcome = cause
    with pytest.raises(ClusterError, match=r"ranks \[1\] lost; servers \[\] lost") as caught:
        run.rank_failed(1)
    assert caught.value.__cause__ is cause
    assert aborts == [str(caught.value)]


def test_a_rank_failed_by_a_lost_server_waits_for_the_worker_s_removal(aborts):
    run = _run([A, B], [A, B], [B], statuses=["pending", "error"])
    run.futures[1].outcome = ServerLost("server 0 lost")
    looks = []

    def workers():
        looks.append(len(looks))
        return [A] if len(looks) > 2 else [A, B]  # removed at the third look

    run.handle.workers = workers
    with pytest.raises(ClusterError, match=r"ranks \[1\] lost; servers \[0\] lost"):
        run.rank_failed(1)
    assert len(looks) == 3


def test_a_failed_rank_that_was_replaced_lets_the_run_go_on(aborts):
    run = _run([A, C], [A, B], [A], on_rank_loss="replace", statuses=["pending", "error"])
    run.futures[1].outcome = RuntimeError("worker killed")
    run.rank_failed(1)  # no error
    assert run.rank_workers == [A, C]
    assert aborts == []


def test_replicated_servers_are_healed_only_when_the_workers_changed(monkeypatch):
    healed = []

    def heal(handle, spec, links, reseeded, busy):
        healed.append(busy)
        return [1]

    monkeypatch.setattr(run_module, "heal", heal)
    run = _run([A, B, C], [A, B], [A, C])
    run.links = ["a replicated link"]
    assert run.lost_servers({A, B, C}) == []
    assert healed == []
    assert run.lost_servers({A, B}) == [1]
    assert healed == [(A, B)]
    assert run.seen == {A, B}
    assert run.lost_servers({A, B}) == []
    assert len(healed) == 1


def test_an_interrupted_run_stops_the_replacements_too(monkeypatch):
    stopped = []
    monkeypatch.setattr(run_module, "_stop_ranks", lambda *args: stopped.append(args))
    run = _run([A, C], [A, B], [A], on_rank_loss="replace")
    run.lost_workers()
    run.stop(KeyboardInterrupt())
    (handle, spec, servers, futures, workers, why) = stopped[0]
    assert futures == [*run.futures, run.futures[1]]
    assert workers == [A, C, C]
    assert why == "KeyboardInterrupt"


def test_release_cancels_the_run_s_servers_and_reseeded_replicas_unless_the_scheduler_is_gone():
    run = _run([A, B], [A, B], [A])
    run.to_release, run.reseeded = ["server-0"], ["replica-0"]
    run.release(ok=True)
    assert run.handle.client.cancelled == [["server-0"], ["replica-0"]]
    run.handle.client.status = "closed"
    run.release(ok=False)
    assert len(run.handle.client.cancelled) == 2


def test_the_watch_returns_the_results_in_rank_order():
    run = _run([A, B], [A, B], [A], statuses=["finished", "finished"])
    run.futures[0].outcome, run.futures[1].outcome = "zero", "one"
    assert run.watch() == ["zero", "one"]
    assert run.handle.client.topics == [A, B]
