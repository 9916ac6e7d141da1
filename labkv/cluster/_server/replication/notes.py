"""What a log entry's note does on a replica: the one place the notes
(:mod:`labkv.cluster._protocol.entries`) are told apart by type.

A backup applies the note of every entry it takes. The note of a push's entry
(a dist_ssp :class:`~labkv.cluster._protocol.entries.Clock`) does the same on
the primary as it issues the entry; the notes of failed updates, of failures
told, of votes and of control calls record what the primary did itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...._types import Key
from ..._errors import Failure
from ..._protocol.entries import Clock, Control, Failed, Note, Passed, Told, Vote

if TYPE_CHECKING:
    from .ports import BarriersPort, ClocksPort, KeptVotesPort, KeyTablePort, RoundsPort


class NoteEffects:
    """The effects of the notes on server ``sid`` (``clocks``: dist_ssp only;
    ``controls``: the server's own handling of each control method, by name)."""

    def __init__(
        self,
        sid: int,
        table: KeyTablePort,
        rounds: RoundsPort,
        kept: KeptVotesPort,
        clocks: ClocksPort | None,
        barriers: BarriersPort,
    ) -> None:
        self.sid, self.table, self.rounds, self.kept, self.clocks = sid, table, rounds, kept, clocks
        self.barriers = barriers
        self.controls: dict[str, Callable[..., Any]] = {}

    def apply(
        self, note: Note | None, updates: list[tuple[Key, Any]], pushes: list[tuple]
    ) -> Failure | None:
        """Apply ``note`` of an entry of ``updates`` and ``pushes``; the failure
        a :class:`Failed` note describes (its keys: those updated with None)."""
        match note:
            case Failed(error, owed):
                return Failure(error, self.sid, [k for k, v in updates if v is None], owed)
            case Told(sender, keys):
                for key in keys:
                    self.rounds[key].report_to(sender)
            case Clock(rank):
                self.clocked(pushes[0][0], rank, [k for _, k, _ in pushes])
            case Vote():
                self.kept.keep(note)
            case Passed(group, generation):
                self.barriers.passed_on_primary(group, generation)
            case Control(method, args):
                self.controls[method](*args)
        return None

    def clocked(self, sender: str, rank: int, keys: list[Key]) -> None:
        """``rank``'s push (from ``sender``) of ``keys`` counts: its clocks advance."""
        self.clocks.pushed(sender, rank, [k for k in keys if k in self.table])
