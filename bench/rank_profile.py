"""Where a dist_sync round's CPU goes at W ranks: a cProfile of every worker process.

    python bench/rank_profile.py [--ranks=8] [--servers=1] [--case=tiny|barrier]
        [--iters=500] [--top=30] [--save=FILE]

An embedded LocalCluster of W worker processes, W ranks (``labkv.cluster.run``)
on S servers, each iteration a push+pull of one float32 key ("tiny") or a
barrier, as in ``bench/ranks.py``. Every worker's event loop thread (the
servers, the streams' readers, Dask) is profiled from before the first rank
starts to after the last one ends, and each rank's thread over its iterations;
the stats of all of them are merged and printed per round (ms of CPU per
iteration of the run, summed over the processes), the functions with the most
own time first, then the same grouped by file. cProfile's overhead inflates
small functions: read it for shares and call counts, the CPU per round of
``bench/ranks.py`` for the real cost. ``--save=FILE`` writes the merged stats
(``pstats.Stats(FILE).print_callers("recv")`` says who called what).
A benchmark, not a test: it prints, it asserts nothing.
"""

from __future__ import annotations

import cProfile
import io
import marshal
import pstats
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ranks import warmed_step  # noqa: E402


def _rank(kv, case: str, iters: int) -> bytes:
    """One rank's loop (``bench/ranks.py``'s), its thread profiled over the timed
    iterations: the stats, marshalled."""
    step = warmed_step(kv, case)
    profile = cProfile.Profile(time.thread_time)
    profile.enable()
    for _ in range(iters):
        step()
    profile.disable()
    kv.barrier()
    profile.create_stats()
    return marshal.dumps(profile.stats)


def _start_loop_profile(dask_worker) -> None:
    """Run on a worker's event loop thread: profile it from now on (the profile
    is kept on the worker: this function travels by value, its module's globals
    with it)."""
    profile = cProfile.Profile(time.thread_time)
    dask_worker.labkv_bench_profile = profile
    profile.enable()


def _stop_loop_profile(dask_worker) -> bytes:
    profile = dask_worker.labkv_bench_profile
    del dask_worker.labkv_bench_profile
    profile.disable()
    profile.create_stats()
    return marshal.dumps(profile.stats)


def _merged(dumps: list[bytes]) -> pstats.Stats:
    """One ``pstats.Stats`` of several marshalled profiles."""
    stats = None
    with tempfile.TemporaryDirectory() as tmp:
        for i, dump in enumerate(dumps):
            path = Path(tmp) / f"{i}.prof"
            path.write_bytes(dump)
            if stats is None:
                stats = pstats.Stats(str(path), stream=io.StringIO())
            else:
                stats.add(str(path))
    return stats


def _where(filename: str) -> str:
    for marker in ("/labkv/", "/distributed/", "/tornado/", "/asyncio/", "/numpy/"):
        if marker in filename:
            return marker.strip("/") + "/" + filename.split(marker, 1)[1]
    return filename.rsplit("/", 1)[-1] if "/" in filename else filename


def main(ranks: int, servers: int, case: str, iters: int, top: int, save: str | None) -> None:
    from labkv.cluster import connect, run

    with connect(n_workers=ranks, dashboard_address=None, set_as_default=False) as handle:
        run(_rank, ranks, num_servers=servers, cluster=handle, args=(case, 20))  # warm
        handle.client.run(_start_loop_profile)
        start = time.perf_counter()
        rank_dumps = run(_rank, ranks, num_servers=servers, cluster=handle, args=(case, iters))
        wall = time.perf_counter() - start
        loop_dumps = list(handle.client.run(_stop_loop_profile).values())
    stats = _merged(rank_dumps + loop_dumps)
    if save:
        stats.dump_stats(save)
    per_round = 1e3 / iters
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])
    total = sum(v[2] for v in stats.stats.values())
    print(
        f"labkv dist_sync {case}, W = {ranks} ranks, S = {servers}, {iters} iterations "
        f"(the run: {wall:.1f} s wall, setup included); profiled CPU per round, all "
        f"processes: {total * per_round:.3f} ms"
    )
    print(f"{'own ms/round':>12}{'calls/round':>12}  function")
    for (filename, line, name), (_, ncalls, tottime, _, _) in rows[:top]:
        print(
            f"{tottime * per_round:>12.4f}{ncalls / iters:>12.1f}  {_where(filename)}:{line} {name}"
        )
    by_file: dict[str, float] = defaultdict(float)
    for (filename, _, _), (_, _, tottime, _, _) in stats.stats.items():
        by_file[_where(filename)] += tottime
    print(f"\n{'own ms/round':>12}  file")
    for where, tottime in sorted(by_file.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{tottime * per_round:>12.4f}  {where}")


def _arguments(argv: list[str]) -> dict:
    known = {"ranks", "servers", "case", "iters", "top", "save"}
    options = {}
    for arg in argv:
        name, sep, value = arg.removeprefix("--").partition("=")
        if not sep or name not in known:
            raise SystemExit(f"bench/rank_profile.py: unknown argument {arg!r} (--help)")
        options[name] = value
    case = options.get("case", "tiny")
    if case not in ("tiny", "barrier"):
        raise SystemExit(f"bench/rank_profile.py: --case is tiny or barrier, not {case!r}")
    return {
        "ranks": int(options.get("ranks", 8)),
        "servers": int(options.get("servers", 1)),
        "case": case,
        "iters": int(options.get("iters", 500)),
        "top": int(options.get("top", 30)),
        "save": options.get("save"),
    }


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
    else:
        main(**_arguments(sys.argv[1:]))
