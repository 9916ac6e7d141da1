"""Time to export 100,000 events as a Chrome / Perfetto trace, measured side by side
with the baseline of writing the same events as plain JSON (``Event.to_dict``).

    python bench/trace.py [--events N]

The events are a training run's mix, made directly (no store): per step, each of
2 ranks pushes and pulls 4 keys (the pulls with a start time, as a store's are),
and a server reports the receipts, the optimizer steps and the dist_ssp waits.
A benchmark, not a test: it prints times and the ratio, and asserts nothing.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from labkv.events import Event, export_trace


def _events(n: int) -> list[Event]:
    events: list[Event] = []
    t, seq = 1.7e9, 0
    summary = {"min": 0.0, "max": 1.0, "mean": 0.5, "norm": 3.0}
    while len(events) < n:
        for rank in range(2):
            for k in range(4):
                key = f"layer{k}"
                for op in ("push", "pull"):
                    extra = {"start": t}
                    t += 2e-5
                    events.append(
                        Event(seq, t, "s", op, key, rank, (), (), "", 4096, summary, extra=extra)
                    )
                    seq += 1
                for op, extra in (
                    ("push", {}),
                    ("optimizer", {}),
                    ("clock", {"clocks": [3, 2], "clock": 3, "waited_s": 1e-4}),
                ):
                    t += 1e-5
                    events.append(
                        Event(seq, t, "s", op, key, rank=rank, server=0, nbytes=4096, extra=extra)
                    )
                    seq += 1
    return events[:n]


def main(n: int = 100_000) -> None:
    events = _events(n)
    with tempfile.TemporaryDirectory() as tmp:
        plain, traced = [], []
        for _ in range(3):  # alternated, best of 3 each
            t = time.perf_counter()
            text = json.dumps([e.to_dict() for e in events], separators=(",", ":"))
            with open(os.path.join(tmp, "plain.json"), "w") as f:
                f.write(text)
            plain.append(time.perf_counter() - t)
            t = time.perf_counter()
            counts = export_trace(events, os.path.join(tmp, "run.json"))
            traced.append(time.perf_counter() - t)
        size = os.path.getsize(os.path.join(tmp, "run.json"))
    print(f"{n:,} events -> trace of {size / 1e6:.1f} MB ({counts})")
    print(f"export_trace:             {min(traced):.3f} s  (target: under 2 s)")
    print(f"plain JSON of the events: {min(plain):.3f} s")
    print(f"ratio trace / plain:      {min(traced) / min(plain):.2f}x")


if __name__ == "__main__":
    main(int(sys.argv[sys.argv.index("--events") + 1]) if "--events" in sys.argv else 100_000)
