"""labkv.torch's CUDA path on a real GPU: torch CUDA tensors handed to the stores as
CuPy arrays through DLPack, checked end to end.

    python bench/torch_gpu.py                 # on cuda:0; skipped (exit 0) without CUDA
    python bench/torch_gpu.py --device cpu    # the same checks on the CPU (checks the script)

Checks, printing one line each and exiting 1 when any fails:

- an MLP moved with ``model.cuda()`` trains 20 steps of SGD with momentum and weight
  decay through ``DistributedOptimizer(update_on_kvstore=False)`` on a ``local`` store
  (values on the host) and on a ``device`` store (values on the GPU): its parameters
  and gradients stay on the GPU in their own memory (the same data pointers) and end
  bit-identical to plain torch on the same GPU (one rank: a gradient comes back as it
  went);
- with ``update_on_kvstore=True`` on the device store, the servers' SGD (labkv's, in
  CuPy on the GPU) with three param groups (lr, weight decay) ends within 1e-6 of plain
  torch, the CPU tests' tolerance (MXNet's momentum form rounds a few ulps apart);
- a bfloat16 parameter on the GPU ends a step as the float32 step rounded to bfloat16;
- with two GPUs, a model on cuda:1 trains while device 0 is current (torch exports a
  CUDA tensor only with its own device current: CuPy's from_dlpack makes it so).

Run by ``bench/gpu_check.sh``; not a test (the test suite never needs a GPU; there the
CUDA path runs on the CuPy stand-in, tests/test_torch.py).
"""

from __future__ import annotations

import argparse
import os
import sys

STEPS = 20


def _mlp(torch, device: str):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)]
    return torch.nn.Sequential(*layers).to(device)


def _sgd(torch, model, groups: bool):
    w0, b0, w2, b2 = model.parameters()
    params = [w0, b0, w2, b2]
    if groups:  # decay off for the biases, a slower last layer
        params = [
            {"params": [w0]},
            {"params": [b0, b2], "weight_decay": 0.0},
            {"params": [w2], "lr": 0.03},
        ]
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-2)


def _train(torch, device: str, kind: str | None, update_on_kvstore=False, groups=False):
    """The final parameters, whether they and their gradients stayed in their own
    memory on ``device``, and the store (None: plain torch)."""
    import labkv
    import labkv.torch as lkt

    model = _mlp(torch, device)
    opt, kv = _sgd(torch, model, groups), None
    if kind is not None:
        kv = labkv.create(kind)
        opt = lkt.DistributedOptimizer(opt, kv, model.named_parameters(), update_on_kvstore)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=g)
    y = ((x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()).to(device)
    x = x.to(device)
    params = list(model.parameters())
    pointers = [p.data_ptr() for p in params]
    grads = None
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=False)  # the gradients keep their memory
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        grads = grads or [p.grad.data_ptr() for p in params]
    where = torch.device(device)
    stayed = (
        all(p.device == where and p.grad.device == where for p in params)
        and [p.data_ptr() for p in params] == pointers
        and [p.grad.data_ptr() for p in params] == grads
    )
    return [p.detach().clone() for p in params], stayed, kv


def _max_diff(a, b) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda:0", help="cuda:0 (default) or cpu")
    args = parser.parse_args()
    # Plain torch and the wrapped run must not differ by a kernel's own nondeterminism.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    try:
        import torch
    except ImportError:
        print("== SKIPPED: torch is not installed (pip install torch, a CUDA build)")
        return 0
    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        why = "a CPU-only build" if torch.version.cuda is None else "no CUDA device visible"
        print(f"== SKIPPED: torch {torch.__version__} has no CUDA ({why}): nothing to check")
        return 0
    torch.use_deterministic_algorithms(True)
    failures = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            failures.append(what)
        print(f"{'ok  ' if ok else 'FAIL'} {what}")

    print(f"== torch {torch.__version__} on {device}")
    plain, _, _ = _train(torch, device, None)
    for kind in ("local", "device"):
        got, stayed, kv = _train(torch, device, kind)
        check(stayed, f"{kind} store: parameters and gradients stay in their memory on {device}")
        diff = _max_diff(plain, got)
        check(diff == 0, f"{kind} store, update_on_kvstore=False: plain torch's bits (diff {diff})")
        placed = kv.placement()["0.weight"][0]["device"]
        on_gpu = placed.startswith("gpu")
        print(f"   {kind} store keeps its values on {placed}")
        if kind == "device" and device.startswith("cuda"):
            check(on_gpu, f"device store keeps the values on the GPU ({placed})")

    plain_groups, _, _ = _train(torch, device, None, groups=True)
    got, stayed, _ = _train(torch, device, "device", update_on_kvstore=True, groups=True)
    diff = _max_diff(plain_groups, got)
    check(stayed, "update_on_kvstore=True: the servers' weights pulled into the parameters")
    check(diff < 1e-6, f"update_on_kvstore=True, 3 param groups: within 1e-6 of torch ({diff:.2g})")

    _bfloat16(torch, device, check)
    if device.startswith("cuda") and torch.cuda.device_count() >= 2:
        torch.cuda.set_device(0)
        other, _, _ = _train(torch, "cuda:1", None)
        got, stayed, _ = _train(torch, "cuda:1", "device")
        check(stayed and _max_diff(other, got) == 0, "a model on cuda:1 with device 0 current")
    elif device.startswith("cuda"):
        print("   one GPU: the cuda:1 check needs two (not run)")
    print(f"== {'FAILED: ' + '; '.join(failures) if failures else 'all passed'}")
    return 1 if failures else 0


def _bfloat16(torch, device: str, check) -> None:
    import labkv
    import labkv.torch as lkt

    w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0], dtype=torch.bfloat16, device=device))
    kv = labkv.create("device")
    opt = lkt.DistributedOptimizer(torch.optim.SGD([w], lr=0.01), kv, [("w", w)], True)
    (w.float() * torch.tensor([0.3, 0.7, -1.1], device=device)).sum().backward()
    expected = (w.detach().float() - 0.01 * w.grad.float()).to(torch.bfloat16)
    opt.step()
    ok = w.dtype == torch.bfloat16 and w.device == torch.device(device)
    check(ok and torch.equal(w.detach(), expected), f"a bfloat16 parameter on {device}")


if __name__ == "__main__":
    sys.exit(main())
