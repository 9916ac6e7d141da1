"""A rank training PyTorch through ``labkv.torch`` is lost mid-run and replaced,
without Dask: real ``Server``s in this process, real ``DistStore`` ranks in
threads (as ``tests/test_cluster_elastic.py`` does for numpy loops). The run must
end bit-identical to an undisturbed one, every rank's parameters and torch
optimizer state, in both ``update_on_kvstore`` modes, with and without momentum,
wherever in a step the rank is lost; and a replay whose pushes differ is never
silent."""

from __future__ import annotations

import os
import signal
import threading
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import labkv.torch as lkt  # noqa: E402
from tests._inprocess import InProcessCluster  # noqa: E402
from tests._replacing import run_through_a_death  # noqa: E402
from tests._waiting import in_threads  # noqa: E402

STEPS = 6


_SEEDING = threading.Lock()  # torch's generator is one for every rank's thread


def _model():
    with _SEEDING:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


def train(kv, die=None, update_on_kvstore=True, momentum=0.9, nondeterministic=False):
    """A small MLP, each rank on its own batches drawn from ``step.rng``; ``die(kv,
    step, point)`` may end the rank at ``"forward"`` (nothing of the step pushed),
    at ``("pushed", name)`` (inside the backward pass, right after ``name``'s
    gradient was pushed), at ``"backward"`` (every gradient pushed, nothing pulled)
    or at ``"stepped"`` (after ``opt.step()``). Returns the parameters' and the
    torch optimizer state's bytes, and the rank's incarnation."""
    model = _model()
    opt = lkt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum),
        kv,
        named_parameters=model.named_parameters(),
        update_on_kvstore=update_on_kvstore,
    )
    for step in kv.steps(STEPS):
        x = torch.from_numpy(step.rng.standard_normal((8, 5)).astype(np.float32))
        y = torch.from_numpy(step.rng.standard_normal((8, 3)).astype(np.float32))
        if die:
            die(kv, step.number, "forward")
            for name, p in model.named_parameters():
                p.register_post_accumulate_grad_hook(
                    lambda _, name=name, n=step.number: die(kv, n, ("pushed", name))
                )
        opt.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        if nondeterministic and kv.incarnation:
            loss = loss * 1.001
        loss.backward()
        if die:
            for p in model.parameters():
                p._post_accumulate_grad_hooks.popitem()  # the die hook just added
            die(kv, step.number, "backward")
        opt.step()
        if die:
            die(kv, step.number, "stepped")
    kv.flush()
    params = {n: p.detach().numpy().tobytes() for n, p in model.named_parameters()}
    state = {
        i: {k: v.numpy().tobytes() if torch.is_tensor(v) else v for k, v in s.items()}
        for i, s in opt.state_dict()["state"].items()
    }
    return params, state, kv.incarnation


def _cluster(replicas):
    # replace_hold: a "replace" run's (the ranks then keep what only they hold)
    return InProcessCluster(
        "dist_sync", 2, 2, timeout=5.0, replicas=replicas, bigarray_bound=20, replace_hold=5.0
    )


def _undisturbed(replicas, fn=None, **kw):
    fn = fn or train
    with _cluster(replicas) as c:
        return in_threads(*[lambda kv=kv: fn(kv, **kw) for kv in c.ranks], timeout=60)


def _disturbed(replicas, lost, at, point, fn=None, **kw):
    """Rank ``lost`` dies at step ``at``, ``point`` (what it held back sent first);
    its replacement runs the same function (``fn``, default :func:`train`) on."""
    fn = fn or train
    with _cluster(replicas) as c:
        got, _ = run_through_a_death(c, fn, lost, at, point, timeout=60, **kw)
        return got, c.ranks[1 - lost].server_load()


POINTS = ["forward", ("pushed", "2.weight"), ("pushed", "0.weight"), "backward", "stepped"]


@pytest.mark.parametrize("momentum", [0.0, 0.9], ids=["sgd", "momentum"])
@pytest.mark.parametrize("update_on_kvstore", [True, False], ids=["on-store", "on-ranks"])
@pytest.mark.parametrize("lost", [0, 1])
@pytest.mark.parametrize("point", POINTS, ids=str)
def test_a_replaced_torch_rank_ends_the_run_bit_identical(point, lost, update_on_kvstore, momentum):
    kw = {"update_on_kvstore": update_on_kvstore, "momentum": momentum}
    want = _undisturbed(2, **kw)
    got, loads = _disturbed(2, lost, 3, point, **kw)
    for rank in (0, 1):
        assert got[rank][0] == want[rank][0], f"rank {rank}'s parameters differ"
        assert got[rank][1] == want[rank][1], f"rank {rank}'s torch optimizer state differs"
    assert sum(load["replay_mismatches"] for load in loads) == 0


@pytest.mark.parametrize("update_on_kvstore", [True, False], ids=["on-store", "on-ranks"])
def test_a_replayed_step_whose_gradients_differ_is_counted_even_after_its_rounds_completed(
    update_on_kvstore,
):
    """Rank 1 is lost in step 3's backward pass, after pushing the last layer's
    gradients (the first the backward pass makes); the live rank pushed its own, so those rounds completed before the
    replay. The replacement computes other gradients (its loss is scaled): each
    of its replayed pushes is a mismatch, found by the first push's digest."""
    kw = {"update_on_kvstore": update_on_kvstore, "nondeterministic": True}
    _, loads = _disturbed(1, 1, 3, ("pushed", "2.weight"), **kw)
    replayed = sum(load["replayed"] for load in loads)
    assert replayed >= 1
    assert sum(load["replay_mismatches"] for load in loads) == replayed


# -- on a real LocalCluster: a rank's worker SIGKILLed mid-step -------------------------


def _killed(kv, step, where, at=(1, 3, ("pushed", "2.weight"))):
    """Rank ``at[0]``'s first incarnation SIGKILLs its own worker at step ``at[1]``,
    point ``at[2]``, after sending what it held back."""
    if (kv.rank, kv.incarnation, step, where) == (at[0], 0, at[1], at[2]):
        kv.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def _run_on(handle, **kw):
    from labkv.cluster import run

    handle.client.wait_for_workers(3, timeout=60)
    with warnings.catch_warnings():  # a replay that pushed other bits fails the test
        warnings.filterwarnings("error", "the replacement of rank", RuntimeWarning)
        return run(
            train,
            num_workers=2,
            cluster=handle,
            timeout=60,
            num_servers=2,
            replicas=2,
            bigarray_bound=20,
            kwargs=kw,
            on_rank_loss="replace",
        )


@pytest.mark.slow  # a LocalCluster whose workers import torch, one killed per case
@pytest.mark.parametrize("update_on_kvstore", [True, False], ids=["on-store", "on-ranks"])
def test_a_torch_rank_whose_worker_is_killed_is_replaced_bit_identically_on_dask(
    update_on_kvstore,
):
    """3 workers for 2 ranks (one spare), replicas=2, SGD with momentum: rank 1's
    worker dies inside step 3's backward pass, after pushing the last layer's
    gradients; the run ends with every rank's parameters and torch optimizer
    state bit-identical to the undisturbed run's, and no replay mismatch."""
    from labkv.cluster import connect

    handle = connect(n_workers=3, dashboard_address=None, memory_limit="2GiB", set_as_default=False)
    try:
        want = _run_on(handle, update_on_kvstore=update_on_kvstore)
        got = _run_on(handle, update_on_kvstore=update_on_kvstore, die=_killed)
    finally:
        handle.close()
    assert [r[2] for r in got] == [0, 1]  # rank 1 was replaced once
    for rank in (0, 1):
        assert got[rank][0] == want[rank][0], f"rank {rank}'s parameters differ"
        assert got[rank][1] == want[rank][1], f"rank {rank}'s torch optimizer state differs"


def test_a_replacement_that_no_live_rank_can_give_its_step_s_state_names_what_each_holds():
    from labkv.cluster import ClusterError
    from labkv.cluster._runtime.kept import keep, take

    keep("run-x", rank=0, number=2, state={"params": []})
    keep("run-x", rank=0, number=3, state={"params": []})
    keep("run-x", rank=0, number=4, state={"params": []})  # only the last two are kept
    assert take("run-x", 4, rank=1, timeout=1.0, what="the state") == {"params": []}
    with pytest.raises(
        ClusterError, match=r"as of step 7.*within 0.2 s \(rank 0 holds steps \[3, 4\]\)"
    ):
        take("run-x", 7, rank=1, timeout=0.2, what="the state")
    with pytest.raises(ClusterError, match="no rank keeps any"):
        take("run-x", 4, rank=0, timeout=0.1, what="the state")  # its own copy is no help


def test_a_one_rank_replace_run_refuses_update_on_kvstore_false_and_changes_nothing():
    with InProcessCluster("dist_sync", 1, 1, timeout=5.0, replace_hold=5.0) as c:
        kv = c.ranks[0]
        model = _model()
        before = [p.detach().clone() for p in model.parameters()]
        with pytest.raises(ValueError, match="needs 2 or more ranks.*update_on_kvstore=True"):
            lkt.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=0.1), kv, update_on_kvstore=False
            )
        assert kv.keys() == []
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        assert kv._steps.hooks == []


class _Recommender(torch.nn.Module):
    """An embedding table (sparse gradients) and a dense head."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(50, 4, sparse=True)
        self.head = torch.nn.Linear(4, 1)

    def forward(self, ids):
        return self.head(self.table(ids)).squeeze(-1)


def train_table(kv, die=None):
    """The recommender, each step on ids and targets drawn from ``step.rng``,
    the servers stepping (a dist store refuses sparse gradients with
    update_on_kvstore=False, as MXNet does); ``die`` as in :func:`train`
    (``"forward"``, ``"backward"``, ``"stepped"``)."""
    with _SEEDING:
        torch.manual_seed(1)
        model = _Recommender()
    opt = lkt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5),
        kv,
        named_parameters=model.named_parameters(),
        sparse_params=model,
    )
    for step in kv.steps(STEPS):
        ids = torch.from_numpy(step.rng.integers(0, 50, 12))
        y = torch.from_numpy(step.rng.standard_normal(12).astype(np.float32))
        if die:
            die(kv, step.number, "forward")
        opt.zero_grad()
        (model(ids) - y).pow(2).mean().backward()
        if die:
            die(kv, step.number, "backward")
        opt.step()
        if die:
            die(kv, step.number, "stepped")
    kv.flush()
    params = {n: t.numpy().tobytes() for n, t in model.state_dict().items()}
    return params, {}, kv.incarnation


@pytest.mark.parametrize("point", ["forward", "backward", "stepped"])
def test_a_replaced_rank_training_an_embedding_table_ends_bit_identical(point):
    """Each lookup pulls its rows (as of the step's start): the replacement's
    lookups read what its lost incarnation's read."""
    want = _undisturbed(2, fn=train_table)
    got, loads = _disturbed(2, 1, 3, point, fn=train_table)
    assert [r[2] for r in got] == [0, 1]
    for rank in (0, 1):
        assert got[rank][0] == want[rank][0], f"rank {rank}'s table or head differs"
    assert sum(load["replay_mismatches"] for load in loads) == 0
