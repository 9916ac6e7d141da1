"""The tutorial notebooks: each runs top to bottom in a real kernel, is committed without
outputs, and uses only documented public API; its exercises are not solved until the
student solves them, and each solution file solves its exercise."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import nbformat
import pytest

import labkv

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9]*.ipynb"))
SOLUTIONS = NOTEBOOKS[0].parent / "solutions"


def code_of(path: Path) -> str:
    """The notebook's code, with the solution files its exercises name (no magics)."""
    nb = nbformat.read(path, as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "code"]
    solutions = re.findall(r"%load (solutions/\S+\.py)", "\n".join(cells))
    cells += [(path.parent / s).read_text() for s in solutions]
    return "\n".join(cells)


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert not cell.outputs, f"cell {i} has outputs: strip them"
            assert cell.execution_count is None, f"cell {i} has an execution count"


def private_imports(tree: ast.AST) -> list[str]:
    """What the code imports from labkv that is not public: a private module
    (``labkv.widgets._render.tables``), a private name, or a name that its module's
    ``__all__`` does not list (``from labkv.cluster import DistStore`` is fine,
    ``from labkv.shard import Shard`` is not)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[0] == "labkv" and any(p.startswith("_") for p in parts):
                found.append(module)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "labkv":
            public = getattr(importlib.import_module(node.module), "__all__", [])
            found += [f"{node.module}.{a.name}" for a in node.names if a.name not in public]
    return found


@pytest.mark.parametrize(
    "source",
    [
        "import labkv.widgets._render.tables",
        "import labkv.cluster._rank.dist_store as store",
        "from labkv.widgets._render.tables import key_rows",
        "from labkv.cluster import _store",
        "from labkv import _arrays",
        "from labkv.shard import Shard",
        "from labkv.widgets import MonitorModel, _monitor",
    ],
)
def test_private_imports_are_found(source):
    assert private_imports(ast.parse(source))


def test_public_imports_pass():
    source = (
        "import labkv\nfrom labkv.cluster import connect, run\nfrom labkv.widgets import monitor"
    )
    assert not private_imports(ast.parse(source))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_uses_only_documented_public_api(path):
    tree = ast.parse(code_of(path))
    used = set()
    for node in ast.walk(tree):
        is_attr = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        if is_attr and node.value.id == "labkv":
            used.add(node.attr)
    assert not private_imports(tree), private_imports(tree)
    for name in sorted(used):
        assert name in labkv.__all__, f"labkv.{name} is not public API"
        obj = getattr(labkv, name)
        assert (obj.__doc__ or "").strip(), f"labkv.{name} has no docstring"
    for method in set(re.findall(r"\bkv\d?\.(\w+)\(", code_of(path))):
        if hasattr(labkv.KVStore, method):
            doc = getattr(labkv.KVStore, method).__doc__
            assert (doc or "").strip(), f"KVStore.{method} has no docstring"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_opens_with_its_plan_and_ends_with_its_recap(path):
    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0].source
    number = path.stem.split("_")[0]  # "05", "05b"
    assert first.startswith(f"# {number} · "), "the title carries the notebook's number"
    for part in ("**You will learn**", "**You need**", "**Time**"):
        assert part in first, f"the first cell says no {part}"
    last = [c.source for c in nb.cells if c.cell_type == "markdown"][-1]
    assert "## Recap" in last, "the last text is not the recap"
    assert "## References" in last, "the last text names no references"


# Wrong answers per exercise, mistakes a student could make: its check must say
# "not yet", not "correct", to each.
WRONG = {
    "solutions/01_1.py": [
        "def predict_pull(pushes):\n    return sum(sum(p) for p in pushes)  # every push added, as with an accumulating updater",
        "def predict_pull(pushes):\n    return pushes[-1][-1]  # the last device wins",
        "predict_pull = 6.0  # the tutorial's case typed in",
        "def predict_pull(pushes):\n    return 6.0  # the tutorial's case, as a function",
        "def predict_pull(pushes):\n    return _pushes_on_a_store(pushes)  # measured, not predicted",
    ],
    "solutions/01_2.py": [
        "def running_mean(key, merged, stored):\n    stored += 0.5 * (merged - stored)  # a moving average, not the mean",
        "seen = [0]\n\n\ndef running_mean(key, merged, stored):\n    seen[0] += 1  # one counter for every key\n    stored += (merged - stored) / seen[0]",
        "counts = {}\n\n\ndef running_mean(key, merged, stored):\n    counts[key] = counts.get(key, 1) + 1  # the initial value counted as a push\n    stored += (merged - stored) / counts[key]",
        "running_mean = 5.0  # the mean of 2, 4 and 9 typed in",
    ],
    "solutions/02_1.py": [
        "def momentum_weight(grads):\n    return -0.1 * sum(grads)  # momentum left out",
        "def momentum_weight(grads):\n    mom = w = 0.0\n    for g in grads:\n        w += mom  # the step taken before the momentum is updated\n        mom = 0.9 * mom - 0.1 * g\n    return w",
        "def momentum_weight(grads):\n    mom = w = 0.0\n    for g in grads:\n        mom = 0.9 * mom + 0.1 * g  # a moving average of the gradients\n        w -= 0.1 * mom\n    return w",
        "def momentum_weight(grads):\n    mom = w = 0.0\n    for g in grads:\n        mom = 0.9 * mom - 0.1 * g\n        w -= mom  # the step's sign flipped\n    return w",
        "momentum_weight = -(0.1 + 0.19 + 0.271)  # three pushes of 1, typed in",
        "def momentum_weight(grads):\n    return _weight_on_a_store(grads)  # measured, not predicted",
    ],
    "solutions/02_2.py": [
        "def pushes_to_send(g, threshold):\n    return int(threshold / abs(g))  # rounded down: 0.4 taken to reach 0.5",
        "def pushes_to_send(g, threshold):\n    return 1  # the first push taken to be sent at once",
        "def pushes_to_send(g, threshold):\n    return int(np.ceil(1.0 / abs(g)))  # the residual taken to need a whole 1.0",
        "def pushes_to_send(g, threshold):\n    return int(np.ceil(threshold / g))  # a negative gradient forgotten",
        "pushes_to_send = 3  # the case of 0.2 and 0.5 typed in",
        "def pushes_to_send(g, threshold):\n    return int(threshold / abs(g)) + 1  # sent once the residual is over the threshold, not at it",
    ],
    "solutions/03_1.py": [
        "def reducer_traffic(n, nbytes):\n    return (3 * n + 1) * nbytes  # the least traffic, not this reducer's",
        "def reducer_traffic(n, nbytes):\n    return 3 * n * nbytes + 2 * n * nbytes  # an add for every value, the first too",
        "def reducer_traffic(n, nbytes):\n    return 3 * (n - 1) * nbytes + 2 * n * nbytes  # a single value taken to cost nothing",
        "def reducer_traffic(n, nbytes):\n    return 2 * nbytes if n == 1 else 3 * (n - 1) * nbytes  # the pull forgotten",
        "reducer_traffic = 17 * (1920 << 20)  # one number typed in",
        "def reducer_traffic(n, nbytes):\n    return _measured_traffic(n, nbytes)  # measured, not predicted",
    ],
    "solutions/04_1.py": [
        "def on_server_1(key, rows, cols):\n    return rows * cols if key % 2 else 0  # never sliced",
        "def on_server_1(key, rows, cols):\n    return rows * cols - rows * cols // 2  # always sliced",
        "def on_server_1(key, rows, cols):\n    n = rows * cols\n    return n // 2 if n >= 10_000 else (n if key % 2 else 0)  # the larger slice on server 0",
        "def on_server_1(key, rows, cols):\n    n = rows * cols\n    return 4 * (n - n // 2) if n >= 10_000 else (4 * n if key % 2 else 0)  # bytes, not elements",
        "on_server_1 = 300 * 50 // 2  # the case of (300, 50) typed in",
        "def on_server_1(key, rows, cols):\n    return ex1_measured[key]  # the check's measurement read back",
    ],
    "solutions/04_2.py": [
        "def per_server(W, S):\n    return 2 * EX_ELEMENTS * 4 * W  # the servers not counted",
        "def per_server(W, S):\n    return EX_ELEMENTS * 4 * W / S  # the pulls forgotten",
        "def per_server(W, S):\n    return 2 * EX_ELEMENTS * 4 / S  # the ranks not counted",
        "def per_server(W, S):\n    return 2 * EX_ELEMENTS * W / S  # elements, not bytes",
        "per_server = {c: 2 * 1_000_000 * c[0] / c[1] for c in [(2, 1), (2, 2), (4, 2), (4, 4)]}  # four values typed in",
        "def per_server(W, S):\n    return max(bytes_per_server(W, S, EX_ELEMENTS, 2)[0])  # measured, not predicted",
    ],
    "solutions/05_1.py": [
        "def updater_calls(W, steps):\n    return W * steps, W * steps  # pushes counted, not updater calls",
        "def updater_calls(W, steps):\n    return steps, steps  # dist_async taken to have rounds too",
        "def updater_calls(W, steps):\n    return W * steps, steps  # sync and async swapped",
        "def updater_calls(W, steps):\n    return W * steps  # one number, for dist_async only",
        "updater_calls = (10, 20)  # the case of 2 ranks and 10 steps typed in",
        "def updater_calls(W, steps):\n    return _calls_on_the_servers(W, steps)  # measured, not predicted",
    ],
    "solutions/05_2.py": [
        "def pulls_that_wait(s):\n    return [True] * 4  # every pull waits, as in dist_sync",
        "def pulls_that_wait(s):\n    return [False] * 4  # no pull waits, as in dist_async",
        "def pulls_that_wait(s):\n    return [k - s >= 0 for k in range(1, 5)]  # the bound taken as s - 1",
        "def pulls_that_wait(s):\n    return [k - s >= 2 for k in range(1, 5)]  # the bound taken as s + 1",
        "pulls_that_wait = [False, False, True, True]  # the case of staleness 2 typed in",
        'def pulls_that_wait(s):\n    return run(ssp_waits, num_workers=W, kvstore="dist_ssp", staleness=s, cluster=handle, args=(0.5,))[0]  # measured',
    ],
    "solutions/05b_1.py": [
        "def flag_read_by_rank_1(inits, pushed):\n    return inits[1], pushed  # rank 1's own init taken to count",
        "def flag_read_by_rank_1(inits, pushed):\n    return pushed, pushed  # the pull taken to wait for rank 0's push",
        "def flag_read_by_rank_1(inits, pushed):\n    return inits[0], inits[0]  # the barrier taken to change nothing",
        "flag_read_by_rank_1 = (10.0, 99.0)  # the case of 10, 20 and 99 typed in",
        "def flag_read_by_rank_1(inits, pushed):\n    return pushed  # one number",
        'def flag_read_by_rank_1(inits, pushed):\n    return tuple(run(read_by_rank_1, W, kvstore="dist_async", cluster=handle, args=(inits, pushed, b))[1] for b in (False, True))  # measured',
    ],
    "solutions/06_1.py": [
        "def steps_per_rank(N, B, W):\n    return -(-N // B), N // B  # the ranks forgotten",
        "def steps_per_rank(N, B, W):\n    return N // (W * B), -(-N // (W * B))  # padding and drop_last swapped",
        "def steps_per_rank(N, B, W):\n    return -(-N // (W * B)), -(-N // (W * B))  # drop_last taken to drop nothing",
        "def steps_per_rank(N, B, W):\n    return round(N / (W * B)), N // (W * B)  # rounded, not padded",
        "steps_per_rank = (6, 5)  # the case of 1000 samples typed in",
        'def steps_per_rank(N, B, W):\n    return tuple(len(MinibatchSource({"x": np.arange(N)}, batch_size=B, rank=0, num_workers=W, drop_last=d)) for d in (False, True))  # asked, not predicted',
    ],
    "solutions/06_2.py": [
        "def reads_per_rank(N, W, B):\n    return N // W, N // W  # every rank reads only its share",
        "def reads_per_rank(N, W, B):\n    return N // W, N  # the two slicings swapped",
        "def reads_per_rank(N, W, B):\n    return N, W * B  # a partition taken to read one global batch",
        "def reads_per_rank(N, W, B):\n    return N * W, N // W  # every rank's reads, not one rank's",
        "reads_per_rank = (1200, 200)  # the case of 1200 samples and 6 ranks typed in",
        "def reads_per_rank(N, W, B):\n    return cntk_rank(np.arange(N), 0, W, B)[0], labkv_rank(np.arange(N), 0, W, B)[0]  # measured, not predicted",
    ],
    "solutions/07_1.py": [
        "def epoch_bytes(N, W):\n    steps = N // (W * 32)  # the padded step forgotten\n    return W * steps * 19240, W * (steps + 2) * 19240",
        "def epoch_bytes(N, W):\n    steps = -(-N // (W * 32))\n    return W * steps * 19240, W * steps * 19240  # the pulls outside the steps forgotten",
        "def epoch_bytes(N, W):\n    steps = -(-N // 32)  # the ranks forgotten in the steps\n    return W * steps * 19240, W * (steps + 2) * 19240",
        "epoch_bytes = (2 * 22 * 19240, 2 * 24 * 19240)  # the case of 1400 images and 2 ranks typed in",
        "def epoch_bytes(N, W):\n    return 2 * 22 * 19240  # one number, not a pair",
        "def epoch_bytes(N, W):\n    return _bytes_of_an_epoch(N, W)  # measured, not predicted",
    ],
    "solutions/07_2.py": [
        "def sent_at_last_step(n):\n    return n, n  # the alias forgotten",
        "def sent_at_last_step(n):\n    return 1, 1  # zero_grad taken to zero the worker's tensor either way",
        "def sent_at_last_step(n):\n    return n, 1  # the two versions swapped",
        "sent_at_last_step = (1, 3)  # the case of 3 steps typed in",
        "def sent_at_last_step(n):\n    return n  # one number, not a pair",
        "def sent_at_last_step(n):\n    return gradients_sent(False, steps=n)[-1], gradients_sent(True, steps=n)[-1]  # measured, not predicted",
    ],
    "solutions/08_1.py": [
        "def step_without_states(lr, m, g):\n    return -lr * g * (1 + m)  # the saved momentum taken to come back",
        "def step_without_states(lr, m, g):\n    return lr * g  # the step's sign flipped",
        "def step_without_states(lr, m, g):\n    return -m * lr * g  # the momentum factor applied to the first step",
        "def step_without_states(lr, m, g):\n    return float((after_resume[1] - checkpoint[1])[0])  # the step with the saved momentum",
        "step_without_states = -0.1  # the case of lr 0.1 and gradient 1 typed in",
        "def step_without_states(lr, m, g):\n    return _step_of_a_resumed_store(lr, m, g)  # measured, not predicted",
    ],
    "solutions/09_1.py": [
        "def servers_per_worker(S, n):\n    return [len(range(i, S, n)) for i in reversed(range(n))]  # the round-robin starts at the last worker",
        "def servers_per_worker(S, n):\n    return [S] + [0] * (n - 1)  # every server on the first worker",
        "def servers_per_worker(S, n):\n    return [S // n] * n  # the servers left over forgotten",
        "servers_per_worker = [2, 1]  # the case of 3 servers typed in",
        "def servers_per_worker(S, n):\n    return 2  # one number, not a count per worker",
        "def servers_per_worker(S, n):\n    return _hosted(S)  # measured, not predicted",
    ],
    "solutions/10_1.py": [
        "def ring_sent(W, M):\n    return (W - 1) * M / W  # the reduce-scatter only",
        "def ring_sent(W, M):\n    return 2 * M  # a worker's push and pull",
        "def ring_sent(W, M):\n    return 2 * (W - 1) * M  # the whole gradient at every step",
        "def ring_sent(W, M):\n    return (2 * W - 1) * M / W  # one step too many",
        "ring_sent = 2 * (8 - 1) * M // 8  # the case W = 8 typed in",
        "def ring_sent(W, M):\n    net = Network(W, B, ALPHA)\n    ring_allreduce(net, [np.ones(M // 4, np.float32)] * W)\n    return net.sent[0]  # the simulator run, not predicted",
    ],
    "solutions/10_2.py": [
        "def ps_seconds(W, S):\n    return 2 * (ALPHA + M / B)  # the fan-in forgotten",
        "def ps_seconds(W, S):\n    return ALPHA + W * M / S / B  # the pull forgotten",
        "def ps_seconds(W, S):\n    return 2 * (ALPHA + W * M / S / B)  # a worker's own link forgotten",
        "ps_seconds = 2 * (ALPHA + 8 * M / 2 / B)  # the case W = 8, S = 2 typed in",
        "def ps_seconds(W, S):\n    return 2 * (ALPHA + max(M, W * M / S) / B)  # one latency per phase, not per message",
        "def ps_seconds(W, S):\n    return 2 * (W * ALPHA + max(M, W * M / S) / B)  # the workers' S messages forgotten",
        "def ps_seconds(W, S):\n    net = Network(W + S, B, ALPHA)\n    ps_step(net, [np.ones(M // 4, np.float32)] * W, list(range(W, W + S)))\n    return net.seconds  # the simulator run, not predicted",
    ],
    "solutions/11_1.py": [
        "def push_bytes(user_ids, item_ids):\n    return (USERS + ITEMS) * K * 4  # the dense tables",
        "def push_bytes(user_ids, item_ids):\n    return (len(user_ids) + len(item_ids)) * (K * 4 + 8)  # a row for every rating, repeats too",
        "def push_bytes(user_ids, item_ids):\n    return (len(np.unique(user_ids)) + len(np.unique(item_ids))) * K * 4  # the row numbers forgotten",
        "def push_bytes(user_ids, item_ids):\n    return (len(np.unique(user_ids)) + len(np.unique(item_ids))) * (K * 4 + 4)  # int32 row numbers",
        "push_bytes = (len(np.unique(users_in_batch)) + len(np.unique(items_in_batch))) * (K * 4 + 8)  # the batch above, one number",
        "def push_bytes(user_ids, item_ids):\n    return _bytes_in_of_a_push(fresh, user_ids, item_ids)  # measured, not predicted",
    ],
    "solutions/12_1.py": [
        "def sent_per_rank(W, n, rank):\n    return (W - 1) * n / W, (W - 1) * n / W  # the chunks taken to be equal",
        "def sent_per_rank(W, n, rank):\n    own = n // 4 // W + (rank < n // 4 % W)\n    return 2 * (n - 4 * own), n - 4 * own  # the reduce-scatter taken for a whole all-reduce",
        "def sent_per_rank(W, n, rank):\n    return (W - 1) * n, (W - 1) * n  # the whole vector at every step",
        "def sent_per_rank(W, n, rank):\n    own = n // 4 // W + (rank < n // 4 % W)\n    return n - 4 * own, n  # the all-to-all taken to send its own chunk too",
        "def sent_per_rank(W, n, rank):\n    own = n // 4 // W + (rank >= W - n // 4 % W)\n    return n - 4 * own, n - 4 * own  # the longer chunks taken to be the last ones",
        "def sent_per_rank(W, n, rank):\n    return n - 4 * (n // 4 // W)  # one number, not a pair",
        "sent_per_rank = (32768, 32768)  # the case of 48 KiB on 3 ranks typed in",
        "def sent_per_rank(W, n, rank):\n    counts = spawn_ranks(hand_collectives, W, ([n],))[rank][n]\n    return counts[0], counts[2]  # measured, not predicted",
    ],
}


def _with_solutions(nb) -> tuple[list[int], list[int], list[int]]:
    """Insert, after each exercise's check cell, each of its wrong answers (``WRONG``)
    and the check again, then the solution its answer cell names (what ``%load`` would put
    there) and the check again; returns the indices of the original checks, of the
    checks after a wrong answer and of those after the solution."""
    cells, first, wrong, again = [], [], [], []
    solution = None
    for cell in nb.cells:
        cells.append(cell)
        tags = cell.metadata.get("tags", [])
        if "exercise" in tags:
            solution = re.search(r"%load (solutions/\S+\.py)", cell.source).group(1)
        if "check" in tags:
            first.append(len(cells) - 1)
            tries = [(source, wrong) for source in WRONG[solution]]
            for source, indices in (*tries, ((SOLUTIONS.parent / solution).read_text(), again)):
                cells.append(nbformat.v4.new_code_cell(source))
                cells.append(nbformat.v4.new_code_cell(cell.source))
                indices.append(len(cells) - 1)
    nb.cells = cells
    return first, wrong, again


def _stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path):
    """Run top to bottom: no error, every exercise check says "not yet" on the
    untouched exercise and on a wrong answer, and "correct" once the solution file
    ran in its place."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    first, wrong, again = _with_solutions(nb)
    assert first, "no exercise check cell (tagged 'check')"
    client = NotebookClient(
        nb,
        timeout=120,  # per cell; every notebook is meant to finish in well under 60 s
        kernel_name="python3",
        startup_timeout=60,
        allow_errors=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert not errors
    for i in first:
        assert re.match(r"exercise \d: not yet", _stdout(nb.cells[i])), _stdout(nb.cells[i])
    for i in wrong:
        said = _stdout(nb.cells[i])
        assert re.match(r"exercise \d: not yet: ", said), (
            f"a wrong answer ({nb.cells[i - 1].source}): {said}"
        )
    for i in again:
        assert re.match(r"exercise \d: correct", _stdout(nb.cells[i])), _stdout(nb.cells[i])


def test_every_solution_belongs_to_an_exercise():
    named = set()
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if "exercise" in cell.metadata.get("tags", []):
                named |= set(re.findall(r"%load (solutions/\S+\.py)", cell.source))
    files = {f"solutions/{p.name}" for p in SOLUTIONS.glob("*.py")}
    assert named == files


def test_every_exercise_has_a_wrong_answer():
    files = {f"solutions/{p.name}" for p in SOLUTIONS.glob("*.py")}
    assert set(WRONG) == files
    assert all(len(WRONG[f]) >= 2 for f in files), [f for f in files if len(WRONG[f]) < 2]
