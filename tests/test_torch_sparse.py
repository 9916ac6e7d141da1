"""``labkv.torch`` with ``nn.Embedding(sparse=True)``: sparse gradients pushed as
row-sparse values (``labkv.torch._sparse_grads``), against torch's own SGD with sparse
gradients; 1, 2 and 3 ranks on dist_sync, each pulling its batch's rows before the
lookup (``labkv.torch._lookups``), against one process on the full batch; the bytes
the servers count grow with the rows touched; and what is refused, naming the option."""

from __future__ import annotations

import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import labkv  # noqa: E402
import labkv.sparse as sparse  # noqa: E402
import labkv.torch as lkt  # noqa: E402
from tests._inprocess import InProcessCluster  # noqa: E402
from tests._waiting import in_threads  # noqa: E402

try:  # the rank functions below travel to the Dask workers by value
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
except ImportError:  # pragma: no cover - comes with distributed
    pass

F = torch.nn.functional
ROWS, DIM, STEPS = 200, 4, 15


class _Model(torch.nn.Module):
    """A sparse embedding table and a dense head (both trained)."""

    def __init__(self, seed: int = 0, rows: int = ROWS, dim: int = DIM):
        super().__init__()
        self.emb = torch.nn.Embedding(rows, dim, sparse=True)
        self.head = torch.nn.Linear(dim, 1)
        g = torch.Generator().manual_seed(seed)  # not the global one: ranks run in threads
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)

    def forward(self, x):
        return self.head(self.emb(x).sum(dim=1))


def _data(n: int = 36, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, ROWS // 4, (n, 3), generator=g)  # rows repeat within a batch
    return x, torch.randn(n, 1, generator=g)


def _batches(steps: int = STEPS):
    """A new batch of 36 (shared by 1, 2 or 3 ranks) every step."""
    return [_data(seed=100 + t) for t in range(steps)]


def _shard(batch, rank: int, num_workers: int):
    n = len(batch[0]) // num_workers
    return tuple(t[rank * n : (rank + 1) * n] for t in batch)


def _train(model, opt, x, y, steps: int = STEPS) -> None:
    for _ in range(steps):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()


def _torch_sgd(momentum: float, steps: int = STEPS):
    model = _Model()
    _train(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum), *_data(), steps)
    return model


@torch.no_grad()
def _max_diff(a, b) -> float:
    return max(
        float((p - q).abs().max()) for p, q in zip(a.parameters(), b.parameters(), strict=True)
    )


# -- one rank, a local store: torch's own sparse SGD -------------------------------------------
@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("update_on_kvstore", [False, True])
def test_one_rank_equals_torchs_own_sgd_with_sparse_gradients(update_on_kvstore, momentum):
    expected = _torch_sgd(momentum)
    model = _Model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    opt = lkt.DistributedOptimizer(
        sgd, labkv.create("local"), model.named_parameters(), update_on_kvstore, sparse_params=model
    )
    # rows alone unless the servers' momentum moves every row (see labkv.torch._sparse_grads)
    lazy = momentum == 0 or not update_on_kvstore
    assert opt.sparse_pull == {"emb.weight": "rows" if lazy else "batch"}
    _train(model, opt, *_data())
    opt.pull_tables()  # 'batch': the rows not looked up since they changed
    # Coalescing sums a row's repeats before the step, torch adds them one by one
    # (and, on the servers, labkv's SGD is MXNet's formula): 3.6e-7 at most measured
    # on values of about 1, so 2e-6 (about 16 ulps).
    assert _max_diff(model, expected) < 2e-6
    assert _max_diff(model, _Model()) > 1e-2  # it did train


def test_pushes_are_the_coalesced_rows_on_the_gradients_device():
    model = _Model()
    kv = labkv.create("local")
    opt = lkt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), kv, model.named_parameters(), True,
        sparse_params=[model.emb.weight],
    )  # fmt: skip
    pushed = []
    push = kv.push
    kv.push = lambda key, value, priority=0: (pushed.append((key, value)), push(key, value))[1]
    x, y = _data()
    F.mse_loss(model(x), y).backward()
    grad = model.emb.weight.grad.coalesce()
    opt.step()
    (value,) = [v for k, v in pushed if k == "emb.weight"]
    assert isinstance(value, sparse.RowSparseArray) and value.shape == (ROWS, DIM)
    assert value.indices.tolist() == torch.unique(x).tolist()  # unique, sorted
    assert value.device == labkv.cpu(0)
    np.testing.assert_array_equal(value.data, grad.values().numpy())
    (dense,) = [v for k, v in pushed if k == "head.weight"]
    assert isinstance(dense, np.ndarray)
    assert "emb.weight" in kv._sparse and "head.weight" not in kv._sparse


def test_half_precision_sparse_gradients_travel_as_float32():
    model = _Model().to(torch.bfloat16)
    opt = lkt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), labkv.create(), model.named_parameters(),
        True, sparse_params=model,
    )  # fmt: skip
    before = model.emb.weight.detach().clone()
    x, y = _data()
    F.mse_loss(model(x), y.to(torch.bfloat16)).backward()
    opt.step()
    changed = (model.emb.weight != before).any(dim=1).nonzero().flatten()
    assert set(changed.tolist()) <= set(torch.unique(x).tolist()) and len(changed) > 0
    assert model.emb.weight.dtype == torch.bfloat16


# -- 1, 2 and 3 ranks on dist_sync -----------------------------------------------------------
def _reference(momentum: float, num_workers: int):
    """One process, plain torch, the full batch every step: each step's loss on each
    rank's shard (before the step), the final weights, and the model's outputs on
    the full first batch after training (a lookup outside any step)."""
    model = _Model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    losses = [[] for _ in range(num_workers)]
    for x, y in _batches():
        sgd.zero_grad()
        out = model(x)
        for r in range(num_workers):
            losses[r].append(F.mse_loss(*_shard((out, y), r, num_workers)).item())
        F.mse_loss(out, y).backward()
        sgd.step()
    with torch.no_grad():
        evaluated = model(_batches()[0][0]).numpy()
    return losses, [p.detach().numpy() for p in model.state_dict().values()], evaluated


def _rank(kv, momentum, update_on_kvstore=None):
    """This rank's share of every batch; rank 1's model starts elsewhere. Its losses,
    its weights (``state_dict()``: the whole tables), its outputs on a batch after
    training, and ``sparse_pull``."""
    torch.set_num_threads(1)
    model = _Model(seed=kv.rank)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    opt = lkt.DistributedOptimizer(
        sgd, kv, model.named_parameters(), update_on_kvstore, sparse_params=model
    )
    losses = []
    for batch in _batches():
        x, y = _shard(batch, kv.rank, kv.num_workers)
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    with torch.no_grad():
        evaluated = model(_batches()[0][0]).numpy()
    weights = [p.numpy().copy() for p in model.state_dict().values()]
    return losses, weights, evaluated, opt.sparse_pull


@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_every_ranks_loss_equals_one_process_on_its_share_of_the_batch(num_workers, momentum):
    losses, weights, evaluated = _reference(momentum, num_workers)
    with InProcessCluster("dist_sync", 2, num_workers, timeout=20.0) as c:
        fns = [lambda kv=kv: _rank(kv, momentum) for kv in c.ranks]
        results = in_threads(*fns, timeout=120)
    # one rank and SGD: the step pulls the rows pushed, all that changed; else each
    # lookup pulls its rows (a rank does not know the others' rows)
    how = "rows" if num_workers == 1 and momentum == 0 else "batch"
    for rank, (got_losses, got_weights, got_evaluated, pulled) in enumerate(results):
        assert pulled == {"emb.weight": how}
        # the ranks' shard means averaged against one mean of 36: float32 ulps
        np.testing.assert_allclose(got_losses, losses[rank], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got_evaluated, evaluated, rtol=1e-5, atol=2e-6)
        for got, want, same in zip(got_weights, weights, results[0][1], strict=True):
            np.testing.assert_array_equal(got, same)  # every rank keeps the same weights
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_two_ranks_on_a_real_cluster_equal_one_process_on_their_share(handle):
    from labkv.cluster import run

    losses, weights, evaluated = _reference(0.0, 2)
    results = run(_rank, num_workers=2, cluster=handle, args=(0.0,))
    for rank, (got_losses, got_weights, got_evaluated, pulled) in enumerate(results):
        assert pulled == {"emb.weight": "batch"}
        np.testing.assert_allclose(got_losses, losses[rank], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got_evaluated, evaluated, rtol=1e-5, atol=2e-6)
        for got, want in zip(got_weights, weights, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


# -- bytes on the wire ------------------------------------------------------------------------
TABLE = 10_000


def _step_bytes(kv, lookups, sparse_embedding: bool, by_module: bool = True) -> tuple[int, int]:
    """The servers' bytes in and out of one step of a table of TABLE x DIM whose
    forward looks up each of ``lookups`` (id tensors) in turn; ``sparse_params`` is
    the module, or (``by_module=False``) its weight alone."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(TABLE, DIM, sparse=sparse_embedding)
    name = f"emb{sparse_embedding}{by_module}"
    opt = lkt.DistributedOptimizer(
        torch.optim.SGD(emb.parameters(), lr=0.1), kv, [(name, emb.weight)], True,
        sparse_params=emb if by_module else [emb.weight],
    )  # fmt: skip
    kv.barrier()  # every rank's init and first pull are done
    before = [sum(s[k] for s in kv.server_load()) for k in ("bytes_in", "bytes_out")]
    kv.barrier()  # every rank has read its "before" (no other rank's step in it)
    sum(emb(ids).pow(2).sum() for ids in lookups).backward()
    opt.step()
    kv.barrier()  # every rank's step is done
    after = [sum(s[k] for s in kv.server_load()) for k in ("bytes_in", "bytes_out")]
    return after[0] - before[0], after[1] - before[1]


def test_bytes_pushed_and_pulled_grow_with_the_rows_touched_not_the_table():
    row = DIM * 4
    for touched in (10, 100, 1000):
        rows = torch.arange(0, TABLE, TABLE // touched)[:touched]
        with InProcessCluster("dist_sync", 2, 1, bigarray_bound=1000) as c:
            b_in, b_out = _step_bytes(c.ranks[0], [torch.cat([rows, rows])], True)
        # the rows and their numbers pushed, the numbers asked for; the rows pulled
        assert b_in == touched * (row + 8) + touched * 8
        assert b_out == touched * row
    with InProcessCluster("dist_sync", 2, 1, bigarray_bound=1000) as c:
        dense_in, dense_out = _step_bytes(c.ranks[0], [rows], False)
    assert dense_in == dense_out == TABLE * row  # a dense embedding moves its table


def _ids(rank: int) -> list[torch.Tensor]:
    """A rank's two lookups of one step: 60 and 40 ids drawn from the first 600
    rows (repeats within and across the lookups, and across the ranks)."""
    g = torch.Generator().manual_seed(rank)
    return [torch.randint(0, 600, (n,), generator=g) for n in (60, 40)]


@pytest.mark.parametrize("num_workers", [2, 3])
def test_with_several_ranks_a_step_moves_the_rows_its_lookups_touch(num_workers):
    row, table = DIM * 4, TABLE * DIM * 4
    with InProcessCluster("dist_sync", 2, num_workers, bigarray_bound=1000) as c:
        moved = in_threads(*[lambda kv=kv: _step_bytes(kv, _ids(kv.rank), True) for kv in c.ranks])
    # per rank, the rows its lookups touch (each pulled once, by the lookup that
    # first reads it); both pushed (with their numbers) and pulled (numbers in, rows out)
    touched = [len(torch.unique(torch.cat(_ids(r)))) for r in range(num_workers)]
    expected_in = sum(u * (row + 8) + u * 8 for u in touched)
    expected_out = sum(u * row for u in touched)
    assert moved == [(expected_in, expected_out)] * num_workers  # one window (barriers)
    per_rank = (expected_in + expected_out) / num_workers
    assert per_rank < 0.02 * 2 * table  # a dense step pushes and pulls the table


def test_parameters_given_without_their_module_pull_the_table_each_step():
    row = DIM * 4
    lookups = [torch.arange(0, TABLE, TABLE // 50)] * 2
    # a sparse table named by its weight alone (no lookup to hook), and a dense table
    for sparse_embedding, by_module, pushed in [
        (True, False, 50 * (row + 8)),
        (False, True, TABLE * row),
    ]:
        with InProcessCluster("dist_sync", 2, 2, bigarray_bound=1000) as c:
            moved = in_threads(
                *[
                    lambda kv=kv, s=sparse_embedding, m=by_module: _step_bytes(kv, lookups, s, m)
                    for kv in c.ranks
                ]
            )
        # one window for both ranks (barriers): both pushes in, both tables out
        assert moved == [(2 * pushed, 2 * TABLE * row)] * 2


# -- what is refused ------------------------------------------------------------------------
def _opt(kv, model=None, optimizer=None, **kw):
    model = model or _Model()
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.1)
    return lkt.DistributedOptimizer(
        optimizer, kv, model.named_parameters(), sparse_params=model, **kw
    )


def test_dist_stores_refuse_update_on_kvstore_false_and_none_picks_true():
    with InProcessCluster("dist_sync", 1, 1) as c:
        kv = c.ranks[0]
        with pytest.raises(ValueError, match="update_on_kvstore=False with sparse gradients") as e:
            _opt(kv, update_on_kvstore=False)
        assert "Cannot set update_on_kvstore=False on dist kvstore" in str(e.value)
        assert kv.keys() == []  # refused before anything changed
        assert _opt(kv).update_on_kvstore is True  # None: MXNet's rule
    assert _opt(labkv.create()).update_on_kvstore is False  # a local store: torch steps


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda m: {"optimizer": torch.optim.Adam(m.parameters())}, "torch's Adam refuses"),
        (
            lambda m: {"optimizer": torch.optim.SGD(m.parameters(), lr=0.1, weight_decay=1e-3)},
            "weight_decay=0.001 and the sparse parameters",
        ),
        (lambda m: {"compression": {"type": "2bit"}}, "row sparse storage type"),
    ],
    ids=["adam", "weight-decay", "compression"],
)
def test_what_sparse_gradients_cannot_do_is_refused_naming_the_option(make, match):
    model = _Model()
    kv = labkv.create()
    with pytest.raises(ValueError, match=match):
        _opt(kv, model, **make(model))
    assert kv.keys() == []


def test_weight_decay_on_the_dense_parameters_alone_is_taken():
    model = _Model()
    groups = [
        {"params": [model.emb.weight], "weight_decay": 0.0},
        {"params": list(model.head.parameters())},
    ]
    opt = _opt(labkv.create(), model, torch.optim.SGD(groups, lr=0.1, weight_decay=1e-3))
    _train(model, opt, *_data(), steps=2)


def test_a_sparse_gradient_without_sparse_params_and_a_dense_key_are_refused():
    model = _Model()
    kv = labkv.create()
    opt = lkt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), kv, model.named_parameters()
    )
    x, y = _data()
    with pytest.raises(TypeError, match="pass sparse_params=model"):
        F.mse_loss(model(x), y).backward()
    opt.remove_hooks()
    with pytest.raises(ValueError, match="is in the store as a dense value"):
        _opt(kv, model)
    with pytest.raises(ValueError, match="does not train"):
        lkt.DistributedOptimizer(
            torch.optim.SGD(model.head.parameters(), lr=0.1), labkv.create(), sparse_params=model
        )
