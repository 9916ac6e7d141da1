"""Handing calls to the transport whole: a Ctrl-C waits until they are sent.

Every push takes the next sequence number of its server, and a server applies
a sender's pushes in that order (a pull first waits for the pushes it was
told of). A number taken and never sent is a gap every later call of that
rank waits on until its timeout, for ever. A ``KeyboardInterrupt`` between
the two (a student interrupting a cell) did exactly that. So the few lines
that take numbers and hand the messages over run inside :data:`sigint_held`:
a SIGINT that arrives meanwhile is held and delivered when they are done,
microseconds later; the waits that follow stay interruptible.

How: the first section on the main thread wraps the process's SIGINT handler
in :func:`_hold_or_pass`, which passes a signal on to the handler it wrapped,
except inside a section, where it notes it for the section's end. A section
then makes no system call and costs about 1 us (swapping the handler in and
out at every section cost about 10 us, against a tiny round of about 1 ms). A handler
installed later replaces the wrapper: sections then hold nothing, as before,
until the next section wraps it again. Signals reach only the main thread;
elsewhere a section changes nothing. The local stores use sections too: a push
or init of several keys changes all of them or none. Any other exception that
is not an ``Exception`` escaping a cluster store's section closes that store,
with an error that says so
(see :meth:`labkv.cluster._rank.calls.Calls.sending`).
"""

from __future__ import annotations

import _signal
import signal
import threading
from typing import Any

_state: dict[str, Any] = {"depth": 0, "pending": None, "wrapped": signal.SIG_DFL}
_MAIN = threading.main_thread()
_SIGINT = int(signal.SIGINT)


def _hold_or_pass(signum: int, frame: Any) -> None:
    """The SIGINT handler while wrapped: held inside a section, else passed on."""
    if _state["depth"]:
        _state["pending"] = (signum, frame)
    else:
        _deliver(_state["wrapped"], signum, frame)


def _deliver(handler: Any, signum: int, frame: Any) -> None:
    """What ``handler`` (the wrapped SIGINT handler) does with the signal."""
    if handler is None or handler is signal.SIG_DFL:  # None: installed outside Python
        raise KeyboardInterrupt
    if callable(handler):
        handler(signum, frame)


class _SigintHeld:
    """``with sigint_held:``: hold a SIGINT that arrives inside the block and
    deliver it after (see module doc); sections nest.

    >>> import os
    >>> try:
    ...     with sigint_held:
    ...         os.kill(os.getpid(), signal.SIGINT)  # held, not raised here
    ...         reached = True
    ... except KeyboardInterrupt:
    ...     print("raised after the block; the block ran to its end:", reached)
    raised after the block; the block ran to its end: True
    """

    def __enter__(self) -> None:
        if threading.current_thread() is not _MAIN:
            return
        if not _state["depth"] and _signal.getsignal(_SIGINT) is not _hold_or_pass:
            try:
                wrapped = signal.signal(signal.SIGINT, _hold_or_pass)
            except ValueError:  # not the main interpreter
                return
            _state["wrapped"] = wrapped
        _state["depth"] += 1

    def __exit__(self, *exc: object) -> None:
        if threading.current_thread() is not _MAIN or not _state["depth"]:
            return
        _state["depth"] -= 1
        if not _state["depth"] and _state["pending"] is not None:
            pending, _state["pending"] = _state["pending"], None
            _deliver(_state["wrapped"], *pending)


sigint_held = _SigintHeld()
