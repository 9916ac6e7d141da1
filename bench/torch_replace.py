"""PyTorch training through lost ranks: how often a replaced run ends
bit-identical to the undisturbed one, and how long a replacement takes.

    python bench/torch_replace.py [--runs=6] [--steps=30] [--kills=2]

A LocalCluster of 4 workers (2 ranks, 2 spares; nannies restart the killed
ones), ``dist_sync`` with 2 servers and ``replicas=2``, an MLP trained by a
``labkv.torch.DistributedOptimizer`` (SGD with momentum) inside ``kv.steps``.
For each ``update_on_kvstore`` mode, one undisturbed run, then ``--runs`` runs
in which ``--kills`` ranks' workers are SIGKILLed by the rank itself at random
(seeded) steps and points of a step (before the forward pass, inside the
backward pass after one layer's gradients were pushed, after it, after
``opt.step()``). Prints per run the kills, whether every rank's parameters and
torch optimizer state are the undisturbed run's bit for bit, the replay
mismatches, and the run's time against the undisturbed one's. A benchmark,
not a test: it prints, it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import labkv.torch as lkt  # noqa: E402
from labkv.cluster import connect, run  # noqa: E402

POINTS = ["forward", "pushed", "backward", "stepped"]


def train(kv, steps, kills=(), update_on_kvstore=True):
    """The MLP; each ``(rank, incarnation, step, point)`` of ``kills`` SIGKILLs
    that incarnation of the rank there (after sending what it held back)."""

    def maybe_die(step, point):
        if (kv.rank, kv.incarnation, step, point) in kills:
            kv.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    opt = lkt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        kv,
        named_parameters=model.named_parameters(),
        update_on_kvstore=update_on_kvstore,
    )
    last = model[2].weight
    for step in kv.steps(steps):
        x = torch.from_numpy(step.rng.standard_normal((64, 32)).astype(np.float32))
        y = torch.from_numpy(step.rng.standard_normal((64, 8)).astype(np.float32))
        maybe_die(step.number, "forward")
        handle = last.register_post_accumulate_grad_hook(
            lambda _, n=step.number: maybe_die(n, "pushed")
        )
        opt.zero_grad()
        (model(x) - y).pow(2).mean().backward()
        handle.remove()
        maybe_die(step.number, "backward")
        opt.step()
        maybe_die(step.number, "stepped")
    params = [p.detach().numpy().tobytes() for p in model.parameters()]
    state = [
        {k: v.numpy().tobytes() if torch.is_tensor(v) else v for k, v in s.items()}
        for s in opt.state_dict()["state"].values()
    ]
    loads = kv.server_load()
    return params, state, kv.incarnation, sum(x["replay_mismatches"] for x in loads)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--kills", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    handle = connect(n_workers=4, dashboard_address=None, memory_limit="2GiB", set_as_default=False)
    opts = dict(num_workers=2, cluster=handle, num_servers=2, replicas=2, timeout=60)
    try:
        for update_on_kvstore in (True, False):
            kw = {"steps": args.steps, "update_on_kvstore": update_on_kvstore}
            handle.client.wait_for_workers(4, timeout=120)
            began = time.monotonic()
            want = run(train, kwargs=kw, **opts)
            base = time.monotonic() - began
            print(f"update_on_kvstore={update_on_kvstore}: undisturbed run {base:.1f} s")
            for i in range(args.runs):
                kills, lost = [], [0, 0]
                for step in sorted(rng.sample(range(1, args.steps - 1), args.kills)):
                    rank = rng.randint(0, 1)
                    kills.append((rank, lost[rank], step, rng.choice(POINTS)))
                    lost[rank] += 1
                kills = tuple(kills)
                handle.client.wait_for_workers(4, timeout=120)
                began = time.monotonic()
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    got = run(train, kwargs={**kw, "kills": kills}, on_rank_loss="replace", **opts)
                took = time.monotonic() - began
                same = all(got[r][:2] == want[r][:2] for r in (0, 1))
                replaced = [got[r][2] for r in (0, 1)]
                warned = [str(w.message)[:60] for w in caught if "replacement" in str(w.message)]
                print(
                    f"  run {i}: kills {kills}: bit-identical {same}, incarnations {replaced}, "
                    f"replay mismatches {got[0][3]}, {took:.1f} s ({took / base:.1f}x), "
                    f"warnings {warned}"
                )
    finally:
        handle.close()


if __name__ == "__main__":
    main()
