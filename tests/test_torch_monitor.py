"""The monitor shows a torch run like any other: its keys are the parameters'
names, with every push, pull and optimizer step counted."""

from __future__ import annotations

import pytest

import labkv
from labkv.widgets import monitor

torch = pytest.importorskip("torch")
lkt = pytest.importorskip("labkv.torch")

STEPS = 3


def _train(kv, update_on_kvstore):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    opt = lkt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        kv,
        named_parameters=model.named_parameters(),
        update_on_kvstore=update_on_kvstore,
    )
    x = torch.randn(8, 4)
    for _ in range(STEPS):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    return dict(model.named_parameters())


@pytest.mark.parametrize("update_on_kvstore", [False, True])
def test_a_torch_run_is_watched_by_parameter_name(update_on_kvstore):
    kv = labkv.create("local")
    mon = monitor(kv)
    params = _train(kv, update_on_kvstore)
    mon.refresh()
    assert sorted(mon.model.keys) == sorted(params)
    for name, p in params.items():
        stats = mon.model.keys[name]
        assert (stats.inits, stats.pushes) == (1, STEPS), name
        assert stats.updates == (STEPS if update_on_kvstore else 0), name
        # The initial pull gives every rank rank 0's values, then one pull per step.
        assert stats.pulls == 1 + STEPS, name
        assert (stats.bytes_in, stats.bytes_out) == (
            p.numel() * 4 * STEPS,
            p.numel() * 4 * (1 + STEPS),
        )
        if update_on_kvstore:  # the store holds the weights the parameter holds
            assert stats.value["norm"] == pytest.approx(float(p.detach().norm()), rel=1e-6)
    assert mon.model.counts["push"] == STEPS * len(params)
    mon.close()
