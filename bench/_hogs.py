"""CPU-bound processes beside a benchmark: what a busy laptop is to the code measured."""

from __future__ import annotations

import subprocess
import sys


class Hogs:
    """``n`` CPU-bound processes, each in its own session (so that no scheduling
    group of the caller's shields the measured code from them), for a ``with`` block."""

    def __init__(self, n: int):
        self.n, self.procs = n, []

    def start(self) -> Hogs:
        for _ in range(self.n):
            # setsid execs in place (this process is no group leader's child),
            # so the pid is the busy loop's own.
            self.procs.append(
                subprocess.Popen(["setsid", sys.executable, "-c", "while True: pass"])
            )
        return self

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
        self.procs = []

    def __enter__(self) -> Hogs:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
