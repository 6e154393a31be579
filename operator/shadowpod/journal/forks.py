"""The journal of a fork: its ancestors' entries up to the fork point, then its own.

A fork shares its parent's journal instead of copying it, so forking a session of a
hundred thousand entries costs what creating one does. Each store keeps, per fork, one
*segment* per ancestor whose entries it reads as its own: a fork of P at seq 40, where
P is itself a fork of G at seq 25, reads G's entries 1..25, P's 26..40 and its own from
41 on. An ancestor's own entries all lie above its fork point, so a segment is exactly
"that session's entries in (after, through]". This module is the arithmetic both
backends share; the queries are theirs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shadowpod.journal.errors import InvalidForkPoint
from shadowpod.journal.store import ForkPoint


@dataclass(frozen=True, slots=True)
class Segment:
    """The entries of session ``sid`` (a store's row id) with ``after < seq <= through``
    (``through`` None: no end — a session's own entries)."""

    sid: int
    after: int
    through: int | None

    def holds(self, seq: int) -> bool:
        return self.after < seq and (self.through is None or seq <= self.through)


def inherited(
    parent_sid: int, parent_fork_seq: int | None, parent_segments: Sequence[Segment], at: int
) -> list[Segment]:
    """The ancestor segments of a fork of the parent at seq ``at``: the parent's own
    ancestors cut at ``at``, then the parent's own entries up to ``at``."""
    segments = [
        Segment(s.sid, s.after, at if s.through is None else min(s.through, at))
        for s in parent_segments
        if s.after < at
    ]
    own_after = parent_fork_seq or 0
    if own_after < at:
        segments.append(Segment(parent_sid, own_after, at))
    return segments


def spans(ancestors: Sequence[Segment], sid: int, fork_seq: int, after: int) -> list[Segment]:
    """What to read, in seq order, for the entries after ``after`` of the fork ``sid``
    (made at ``fork_seq``) whose ancestor segments are ``ancestors``."""
    ordered = [*sorted(ancestors, key=lambda s: s.after), Segment(sid, fork_seq, None)]
    return [
        Segment(s.sid, max(s.after, after), s.through)
        for s in ordered
        if s.through is None or s.through > after
    ]


def holding(ancestors: Sequence[Segment], seq: int) -> Segment | None:
    """The ancestor segment that holds ``seq`` (None: the fork's own, or nobody's)."""
    return next((s for s in ancestors if s.holds(seq)), None)


def check_point(fork: ForkPoint, head: int, truncated_through: int) -> None:
    """A fork point the parent (at ``head``, truncated through ``truncated_through``)
    can give, or ``InvalidForkPoint`` saying which it can."""
    if fork.seq > head:
        raise InvalidForkPoint(
            f"session {fork.session!r} has no seq {fork.seq} (its head is {head}): fork at "
            "a seq it has journaled"
        )
    if fork.seq < truncated_through:
        raise InvalidForkPoint(
            f"session {fork.session!r}: its entries up to seq {truncated_through} were removed "
            f"by retention, so its state at seq {fork.seq} is gone; fork at seq "
            f"{truncated_through} or later (or at one of its snapshots)"
        )
