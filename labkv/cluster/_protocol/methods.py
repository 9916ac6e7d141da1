"""The remote methods of a server, as one table (as distributed's worker keeps
its ``handlers``): every method a rank, a peer or the driver calls by name,
with what the transport and a replicated link must know of it.

>>> METHODS["push"].acknowledged, METHODS["fence"].broadcast, METHODS["peek"].local
(True, True, False)
>>> method("no such method")
Traceback (most recent call last):
...
KeyError: "no server method 'no such method' (see labkv.cluster._protocol.methods)"
"""

from __future__ import annotations

from typing import NamedTuple


class Method(NamedTuple):
    """A server method and its properties."""

    name: str
    #: a rank on the server's own worker calls it in-process: the server copies
    #: or only reads its arguments, and its result is fresh or read-only
    local: bool = False
    #: its one argument is a message (``_protocol.messages``) that may travel
    #: as one frame (``messages.encode``)
    message: bool = False
    #: every replica of a replicated server runs it (the others: the primary)
    broadcast: bool = False
    #: a replicated server's backups are sent this method with the same
    #: arguments, as a notice (no answer: the primary answers), and the
    #: primary the actor keys of the backups it was sent to, as a last argument
    backups: str | None = None
    #: a replicated server replies ``(acked, epoch, payload)``
    acknowledged: bool = False


def _table(*methods: Method) -> dict[str, Method]:
    return {m.name: m for m in methods}


#: Every remote method of :class:`~labkv.cluster._server.actor.Server`.
METHODS: dict[str, Method] = _table(
    # a rank's data path
    Method("push", local=True, message=True, acknowledged=True),
    Method("pull", local=True, message=True, acknowledged=True),
    Method("read", local=True, acknowledged=True),
    Method("init", local=True),
    Method("keys", local=True),
    Method("wait_keys", local=True),
    Method("peek"),
    Method("summary"),
    # settings and run control: every replica takes them
    Method("set_updater"),
    Method("set_optimizer"),
    Method("set_states"),
    Method("get_states"),
    Method("configure", broadcast=True),
    Method("abort", broadcast=True),
    Method("fence", broadcast=True),
    Method("resume_step", local=True),
    Method("barrier", local=True, backups="barrier_arrived"),
    Method("barrier_arrived", local=True),
    Method("link", broadcast=True),
    Method("streaming", broadcast=True),
    Method("load"),
    # a replicated server's group
    Method("members"),
    Method("promote"),
    Method("replay", acknowledged=True),
    Method("add_replica"),
    Method("join_group"),
    Method("seed"),
    # between servers
    Method("replicate"),
    Method("vote"),
    Method("peer_promoted"),
)


def method(name: str) -> Method:
    """The table's row of ``name``; a ``KeyError`` naming it when there is none."""
    try:
        return METHODS[name]
    except KeyError:
        raise KeyError(f"no server method {name!r} (see {__name__})") from None
