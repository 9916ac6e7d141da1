"""``labkv.torch``'s per-lookup pulls (``labkv.torch._lookups``): an
``nn.EmbeddingBag`` with offsets, per-sample weights that need the table for their
gradient and a padding row, called twice in one step, against one process; pulls
that carry their ``kv.steps`` step; what is refused, and what gets the whole table."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import labkv  # noqa: E402
import labkv.torch as lkt  # noqa: E402
from tests._inprocess import InProcessCluster  # noqa: E402
from tests._waiting import in_threads  # noqa: E402

F = torch.nn.functional
ROWS, DIM, BAG, BATCH, STEPS = 300, 4, 3, 36, 12


class _Bags(torch.nn.Module):
    """Two fields looked up in one bag table (called twice a step), summed with
    per-sample weights that a trained gate makes (their gradient reads the table),
    row 0 the padding; a dense head."""

    def __init__(self, seed: int = 0):
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(ROWS, DIM, mode="sum", sparse=True, padding_idx=0)
        self.gate = torch.nn.Parameter(torch.zeros(1))
        self.head = torch.nn.Linear(2 * DIM, 1)
        g = torch.Generator().manual_seed(seed)  # not the global one: ranks run in threads
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            self.bag.weight[0] = 0.0

    def _weights(self, ids):
        return torch.sigmoid(self.gate * ids.reshape(-1) / ROWS)

    def forward(self, a, b):
        n = len(a)
        offsets = torch.arange(0, n * BAG, BAG)
        first = self.bag(a.reshape(-1), offsets, per_sample_weights=self._weights(a))
        second = self.bag(input=b.reshape(-1), offsets=offsets, per_sample_weights=self._weights(b))
        return self.head(torch.cat([first, second], dim=1))


def _batch(t: int):
    g = torch.Generator().manual_seed(100 + t)
    a = torch.randint(0, ROWS // 3, (BATCH, BAG), generator=g)
    b = torch.randint(ROWS // 6, ROWS // 2, (BATCH, BAG), generator=g)  # overlaps a's rows
    a[:, -1] = 0  # padding
    return a, b, torch.randn(BATCH, 1, generator=g)


def _shard(batch, rank: int, num_workers: int):
    n = BATCH // num_workers
    return tuple(t[rank * n : (rank + 1) * n] for t in batch)


def _reference(num_workers: int):
    """Plain torch, the whole batch: each step's loss on each rank's share."""
    model = _Bags()
    sgd = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5)
    losses = [[] for _ in range(num_workers)]
    for t in range(STEPS):
        a, b, y = _batch(t)
        sgd.zero_grad()
        out = model(a, b)
        for r in range(num_workers):
            losses[r].append(F.mse_loss(*_shard((out, y), r, num_workers)).item())
        F.mse_loss(out, y).backward()
        sgd.step()
    return losses, model.bag.weight.detach().numpy()


def _bag_rank(kv):
    torch.set_num_threads(1)
    model = _Bags(seed=kv.rank)
    sgd = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5)
    opt = lkt.DistributedOptimizer(sgd, kv, model.named_parameters(), sparse_params=model)
    losses = []
    for t in range(STEPS):
        a, b, y = _shard(_batch(t), kv.rank, kv.num_workers)
        opt.zero_grad()
        loss = F.mse_loss(model(a, b), y)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    opt.pull_tables()
    return losses, model.bag.weight.detach().numpy().copy(), opt.sparse_pull


@pytest.mark.parametrize("num_workers", [2, 3])
def test_an_embedding_bag_called_twice_a_step_gives_one_process_losses(num_workers):
    losses, table = _reference(num_workers)
    with InProcessCluster("dist_sync", 2, num_workers, timeout=20.0) as c:
        results = in_threads(*[lambda kv=kv: _bag_rank(kv) for kv in c.ranks], timeout=120)
    for rank, (got, got_table, pulled) in enumerate(results):
        assert pulled == {"bag.weight": "batch"}
        np.testing.assert_allclose(got, losses[rank], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got_table, table, rtol=1e-5, atol=2e-6)
        assert not got_table[0].any()  # the padding row stays as it was


# -- what each lookup pulls -------------------------------------------------------------------
class _Table(torch.nn.Module):
    def __init__(self, **options):
        super().__init__()
        self.emb = torch.nn.Embedding(ROWS, DIM, sparse=True, **options)

    def forward(self, ids):
        return self.emb(ids).sum()


def _two_rank_opt(kv, model, **kw):
    sgd = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    return lkt.DistributedOptimizer(sgd, kv, model.named_parameters(), sparse_params=model, **kw)


def _recording_pulls(kv) -> list[tuple[list[int], int | None]]:
    """Each ``row_sparse_pull`` the store reads rows for: (rows, the step it carries)."""
    seen = []
    read = kv._pull_rows

    def recorded(items):
        step = getattr(getattr(kv, "_steps", None), "current", None)  # a dist store's
        seen.append(([int(r) for _, rows in items for r in rows], step))
        return read(items)

    kv._pull_rows = recorded
    return seen


def test_lookups_in_a_step_loop_pull_their_rows_once_carrying_the_step():
    with InProcessCluster("dist_sync", 1, 1) as c:
        kv, model = c.ranks[0], _Table()
        opt = _two_rank_opt(kv, model)
        assert opt.sparse_pull == {"emb.weight": "batch"}  # momentum moves every row
        seen = _recording_pulls(kv)
        for step in kv.steps(2):
            opt.zero_grad()
            base = 10 * step.index
            loss = model(torch.tensor([base + 3, base + 1, base + 3])) + model(
                torch.tensor([[base + 1], [base + 5]])  # a second call: row base + 1 again
            )
            loss.backward()
            opt.step()
        with torch.no_grad():
            model(torch.tensor([7], dtype=torch.int32))  # outside the loop
    assert seen == [([1, 3], 0), ([5], 0), ([11, 13], 1), ([15], 1), ([7], 2)]


def test_a_lookup_between_the_push_and_step_of_rows_not_read_yet_is_refused():
    kv, model = labkv.create("local"), _Table()
    opt = _two_rank_opt(kv, model, update_on_kvstore=True)
    with pytest.raises(IndexError, match=r"'emb.weight' out of range \[0, 300\): got 300"):
        model(torch.tensor([1, ROWS]))
    model(torch.tensor([1, 2])).backward()  # pushed: the store has applied the step
    before = model.emb.weight.detach().clone()
    with pytest.raises(RuntimeError, match=r"'emb.weight' after this rank pushed .* row 3"):
        model(torch.tensor([2, 3]))
    assert torch.equal(model.emb.weight, before)  # nothing pulled
    with pytest.raises(RuntimeError, match="call step\\(\\) first"):
        model.state_dict()
    with torch.no_grad():  # the rows read before the push: as one process reads them
        assert model(torch.tensor([1, 2])).item() == before[[1, 2]].sum().item()
    opt.step()
    model(torch.tensor([2, 3]))  # a new step: any rows
    np.testing.assert_array_equal(model.state_dict()["emb.weight"], kv.pull("emb.weight"))


def test_state_dict_pull_tables_and_remove_hooks_give_the_whole_table():
    kv, model = labkv.create("local"), _Table()
    opt = _two_rank_opt(kv, model, update_on_kvstore=True)
    for _ in range(2):  # momentum: the second step moves rows 1 and 2, which no lookup read
        opt.zero_grad()
        model(torch.tensor([1, 2])).backward()
        opt.step()
    stored = kv.pull("emb.weight")
    assert not np.array_equal(model.emb.weight.detach().numpy(), stored)
    np.testing.assert_array_equal(model.state_dict()["emb.weight"].numpy(), stored)
    kv.push(
        "emb.weight",
        labkv.sparse.row_sparse_array((np.ones((1, DIM), np.float32), [4]), shape=(ROWS, DIM)),
    )
    opt.pull_tables()
    np.testing.assert_array_equal(model.emb.weight.detach().numpy(), kv.pull("emb.weight"))
    kv.push(
        "emb.weight",
        labkv.sparse.row_sparse_array((np.ones((1, DIM), np.float32), [5]), shape=(ROWS, DIM)),
    )
    opt.remove_hooks()
    np.testing.assert_array_equal(model.emb.weight.detach().numpy(), kv.pull("emb.weight"))
    seen = _recording_pulls(kv)
    model(torch.tensor([6]))
    model.state_dict()
    assert seen == []  # no hooks left


def test_a_copy_of_the_model_pulls_nothing_and_the_original_goes_on():
    kv, model = labkv.create("local"), _Table()
    _two_rank_opt(kv, model, update_on_kvstore=True)
    seen = _recording_pulls(kv)
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        twin(torch.tensor([1, 2]))
        twin.state_dict()
    assert seen == []
    model(torch.tensor([1, 2]))
    assert seen == [([1, 2], None)]


# -- which tables, and what is refused ---------------------------------------------------------
def test_max_norm_is_refused_where_the_servers_step_and_taken_where_torch_does():
    kv = labkv.create("local")
    with pytest.raises(ValueError, match="max_norm=1.0 .* the servers holding the weights"):
        _two_rank_opt(kv, _Table(max_norm=1.0), update_on_kvstore=True)
    assert kv.keys() == []  # refused before anything changed
    opt = _two_rank_opt(kv, _Table(max_norm=1.0), update_on_kvstore=False)
    assert opt.sparse_pull == {"emb.weight": "rows"}  # torch steps the table it renormalised


class _Tied(torch.nn.Module):
    """A sparse embedding whose weight the output layer reads too."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(ROWS, DIM, sparse=True)
        self.out = torch.nn.Linear(DIM, ROWS, bias=False)
        self.out.weight = self.emb.weight


def test_a_weight_another_module_reads_and_parameters_alone_pull_the_table():
    kv = labkv.create("local")
    tied = _Tied()
    assert _two_rank_opt(kv, tied, update_on_kvstore=True).sparse_pull == {"emb.weight": "table"}
    kv, plain = labkv.create("local"), torch.nn.Embedding(ROWS, DIM, sparse=True)
    sgd = torch.optim.SGD(plain.parameters(), lr=0.5, momentum=0.9)
    opt = lkt.DistributedOptimizer(
        sgd, kv, [("t", plain.weight)], True, sparse_params=[plain.weight]
    )
    assert opt.sparse_pull == {"t": "table"}
