"""A call through a replicated link (:class:`Call`): the futures of one call
as made, read back with the link's failover.

A call is made on the primary (a broadcast on the backups too). A rank's pull
may instead be a **near read** (see :mod:`.failover`): the pushes it carried
go to the primary as pushes, and the pull to the backup on the rank's own
worker, which answers once it applied the updates of the rank's last pushes
of the pulled keys. Its payload is None when that backup cannot answer (it is no
longer one of two replicas): the call is then made on the primary.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._errors import TIMEOUTS, ClusterError, answered_by, is_lost
from .._protocol.messages import Peer
from .._transport.base import ServerLink, Waitable

if TYPE_CHECKING:
    from .failover import ReplicatedLink


def call_or_failed(link: ServerLink, method: str, *args: Any) -> Waitable:
    """``link.call(method, *args)``; a call that cannot even be made (its server
    known lost) is a failed future, so that its waiter meets the error."""
    try:
        return link.call(method, *args)
    except ClusterError as exc:
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_exception(exc)
        return future


class Sent:
    """The futures of a call as made: the one whose reply is the call's
    (``inner``), the backups' of a broadcast (``others``, as ``(backup,
    future)``), and a near read's carried pushes (``carried``, on the primary)."""

    __slots__ = ("carried", "inner", "others")

    def __init__(
        self,
        inner: Waitable,
        others: list[tuple[Peer, Waitable]] | None = None,
        carried: list[Waitable] | None = None,
    ):
        self.inner, self.others, self.carried = inner, others or [], carried or []


class Call:
    """A call through a :class:`~.failover.ReplicatedLink`, unwrapped when read.
    :meth:`result` fails over and makes the call again (see the link's module
    doc); ``acknowledge``: the reply is ``(acked, epoch, payload)`` (a tracked
    held push's future has none)."""

    __slots__ = ("acknowledge", "args", "generation", "link", "method", "sent")

    def __init__(
        self, link: ReplicatedLink, method: str, args: tuple, sent: Sent, acknowledge: bool
    ):
        self.link, self.method, self.args = link, method, args
        self.sent, self.acknowledge = sent, acknowledge
        self.generation = link.generation

    def reply(self, timeout: float | None = None) -> Any:
        """The answer to the call as made, without failover: the primary's reply
        (its acknowledgement taken), once the backups answered too (one gone, or
        silent on a worker the scheduler dropped, is no error; its answer is).
        A near read answers once its carried pushes did too (a refused one is
        raised at once: the read would wait for it in vain)."""
        sent, link = self.sent, self.link
        for push in sent.carried:
            if push.done():
                self._carried(push, 0)
        out = sent.inner.result(timeout)
        for push in sent.carried:
            self._carried(push, timeout)
        for peer, other in sent.others:
            try:
                other.result(timeout)
            except TIMEOUTS:
                if not link.backup_gone(peer):
                    raise
            except Exception as exc:
                if answered_by(exc) is not None:
                    raise
        return link.acknowledged(out) if self.acknowledge else out

    def _carried(self, push: Waitable, timeout: float | None) -> None:
        """A carried push's reply: its acknowledgement taken, its refusal raised.
        A primary lost meanwhile is no error here: the read either waited for
        the push's round, or is waited for and fails over."""
        try:
            self.link.acknowledged(push.result(timeout))
        except TIMEOUTS as exc:
            if answered_by(exc) is not None or self.link.primary_lost() is None:
                raise
        except Exception as exc:
            if not is_lost(exc):
                raise

    def result(self, timeout: float | None = None) -> Any:
        """The reply, waiting at most ``timeout`` each time the call is made: a
        lost primary is failed over, and the call made again on the new one
        (a push returns None then: the replay carried it)."""
        link = self.link
        while True:
            if self.generation != link.generation and not self.sent.inner.done():
                # Made on a primary replaced since: its wait would watch the new
                # primary, alive, while the call sits on the dead one's connection.
                if not self._again():
                    return None
                continue
            try:
                out = self.reply(timeout)
            except TIMEOUTS as exc:
                if answered_by(exc) is not None or link.primary_lost() is None:
                    raise  # not answered yet: the caller waits on
            except Exception as exc:
                if link.told_before(exc):
                    if not self._again():
                        return None
                    continue
                if not is_lost(exc):
                    raise
            else:
                if out is None and self.method == "pull":  # the backup sent it to the primary
                    self._again(near=False)
                    continue
                link.after_reply()
                return out
            link.fail_over(self.generation)
            if not self._again():
                return None

    def _again(self, near: bool = True) -> bool:
        """Make the call again on the link's primary of now; False for a push."""
        if self.method == "push":
            return False
        if self.method == "pull":  # the pushes it carried were replayed with the others
            self.args = (self.args[0]._replace(pushes=()),)
        self.sent = self.link.send(self.method, self.args, near)
        self.generation = self.link.generation
        return True

    def done(self) -> bool:
        """Whether every replica called has answered the call as made."""
        sent = self.sent
        return (
            sent.inner.done()
            and all(o.done() for _, o in sent.others)
            and all(p.done() for p in sent.carried)
        )

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The error of :meth:`reply`, or None: what a done-callback reads (it
        runs on the link's loop, where no failover may wait; the call's waiter
        fails over)."""
        try:
            self.reply(timeout)
        except TIMEOUTS:
            raise
        except BaseException as exc:
            return exc
        return None

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        """``fn(call)`` once the primary has answered (on the link's loop)."""
        self.sent.inner.add_done_callback(lambda _: fn(self))
