"""Errors of the journal store. Adapters map ``reason`` to HTTP statuses and conditions."""

from __future__ import annotations

from shadowpod.domain.errors import ShadowpodError
from shadowpod.domain.ownership import Ownership


class SessionNotFound(ShadowpodError, LookupError):
    reason = "SessionNotFound"

    def __init__(self, session: str) -> None:
        self.session = session
        super().__init__(f"session {session!r} does not exist; create it first")


class SessionExists(ShadowpodError):
    reason = "SessionExists"

    def __init__(self, session: str) -> None:
        self.session = session
        super().__init__(f"session {session!r} already exists")


class Fenced(ShadowpodError):
    """An owner wrote with an epoch that is no longer the session's epoch."""

    reason = "Fenced"

    def __init__(self, session: str, *, epoch: int, current: int) -> None:
        self.session = session
        self.epoch = epoch
        self.current = current
        super().__init__(
            f"session {session!r}: writes at epoch {epoch} are refused, the current epoch "
            f"is {current}; this owner has been replaced and must stop"
        )


class OwnerMismatch(Fenced):
    """An owner write at the current epoch by another instance than the one named
    owner at it: only the instance the ownership record names may write at an epoch."""

    def __init__(self, session: str, *, epoch: int, owner: str, current_owner: str | None) -> None:
        ShadowpodError.__init__(
            self,
            f"session {session!r}: epoch {epoch} belongs to owner {current_owner!r}, not "
            f"{owner!r}; this instance was not named owner at that epoch and must not write",
        )
        self.session = session
        self.epoch = epoch
        self.current = epoch
        self.owner = owner


def check_writer(
    session: str, epoch: int, current_owner: str | None, owner_epoch: int | None, owner: str | None
) -> None:
    """An owner write (``owner_epoch`` given) is allowed only at the session's epoch and,
    when ``owner`` is named, only by the instance named owner at it."""
    if owner_epoch is None:
        return
    if owner_epoch != epoch:
        raise Fenced(session, epoch=owner_epoch, current=epoch)
    if owner is not None and owner != current_owner:
        raise OwnerMismatch(session, epoch=owner_epoch, owner=owner, current_owner=current_owner)


class IdempotencyConflict(ShadowpodError):
    """An entry whose idempotency key was journaled before with other content: a key
    names one entry, so the write is refused rather than taken for a repeat."""

    reason = "IdempotencyConflict"

    def __init__(self, session: str, *, entry_id: str, seq: int | None) -> None:
        self.session = session
        self.entry_id = entry_id
        self.seq = seq
        where = f"at seq {seq}" if seq is not None else "earlier in the same append"
        super().__init__(
            f"session {session!r}: id {entry_id!r} was journaled {where} with other "
            "content; an id names one entry — send the same content to retry, or a new id "
            "for a new entry (nothing of this append was journaled)"
        )


class EpochConflict(ShadowpodError):
    """A compare-and-set of the ownership record expected another epoch."""

    reason = "EpochConflict"

    def __init__(self, session: str, *, expected: int, current: Ownership) -> None:
        self.session = session
        self.expected = expected
        self.current = current
        super().__init__(
            f"session {session!r}: expected ownership epoch {expected}, found "
            f"{current.epoch} (owner {current.owner!r}); re-read the ownership and retry"
        )


class InvalidForkPoint(ShadowpodError, ValueError):
    """A fork asked for at a point its parent cannot give: beyond its head, or below
    what its retention removed."""

    reason = "InvalidForkPoint"


class SessionHasForks(ShadowpodError):
    """A session whose journal forks still read (their entries up to the fork point
    are its entries) cannot be deleted before them."""

    reason = "SessionHasForks"

    def __init__(self, session: str, forks: list[str]) -> None:
        self.session = session
        self.forks = forks
        named = ", ".join(map(repr, forks))
        super().__init__(
            f"session {session!r} cannot be deleted: its forks {named} read its journal up "
            "to their fork points; delete them first (or let their retention truncate past "
            "their fork points)"
        )


class JournalTruncated(ShadowpodError):
    reason = "JournalTruncated"

    def __init__(self, session: str, *, after: int, through: int) -> None:
        self.session = session
        self.after = after
        self.through = through
        super().__init__(
            f"session {session!r}: entries up to seq {through} were removed by retention; "
            f"reading after {after} is not possible — load a snapshot at or after seq "
            f"{through} and read from its watermark"
        )


class SnapshotNotFound(ShadowpodError, LookupError):
    reason = "SnapshotNotFound"

    def __init__(self, session: str, watermark: int | None = None) -> None:
        self.session = session
        self.watermark = watermark
        what = "snapshot" if watermark is None else f"snapshot at seq {watermark}"
        super().__init__(f"session {session!r} has no {what}")


class InvalidSnapshot(ShadowpodError, ValueError):
    reason = "InvalidSnapshot"


class SnapshotTooOld(InvalidSnapshot):
    """A snapshot older than every one a session keeps: it would be deleted at once."""

    def __init__(self, session: str, *, watermark: int, kept: int) -> None:
        self.session = session
        self.watermark = watermark
        super().__init__(
            f"session {session!r}: a snapshot at seq {watermark} is older than the {kept} "
            "newest, the most a session keeps; snapshot the current state instead"
        )


class StoreUnavailable(ShadowpodError):
    """The database could not be reached; the operation did not happen and may be retried."""

    reason = "StoreUnavailable"


class LeaseLost(StoreUnavailable):
    """This gateway replica no longer holds the session's lease (``journal/leases.py``):
    the ownership change did not happen; retried, it reaches the replica that does."""

    reason = "LeaseLost"

    def __init__(self, session: str, replica: str) -> None:
        super().__init__(
            f"gateway replica {replica!r} no longer serves session {session!r} (its lease "
            "expired or was taken over): nothing changed; retry, the request then reaches "
            "the replica that serves it"
        )
        self.session = session


class StoreFull(StoreUnavailable):
    """The journal's disk (or database) is full: the write did not happen. Retrying
    helps only once space is freed, so the gateway also reports itself not ready."""

    reason = "StoreFull"

    def __init__(self, detail: object) -> None:
        super().__init__(
            f"the journal's storage is full ({detail}): nothing was written; free space or "
            "grow the volume, then retry"
        )


class InvalidOwnership(ShadowpodError, ValueError):
    """An ownership change that breaks the fence guarantee: an epoch never goes down,
    and a new owner always comes with a new, larger epoch."""

    reason = "InvalidOwnership"


class EpochDecrease(InvalidOwnership):
    reason = "EpochDecrease"

    def __init__(self, session: str, *, current: Ownership, requested: int) -> None:
        self.session = session
        self.current = current
        self.requested = requested
        super().__init__(
            f"session {session!r}: an epoch never goes down (current {current.epoch}, "
            f"requested {requested}); re-read the ownership and ask for epoch "
            f"{current.epoch} (to change only the fence) or a larger one"
        )


class OwnerChangeNeedsNewEpoch(InvalidOwnership):
    reason = "OwnerChangeNeedsNewEpoch"

    def __init__(self, session: str, *, current: Ownership, new: Ownership) -> None:
        self.session = session
        self.current = current
        self.new = new
        super().__init__(
            f"session {session!r}: a new owner needs a new, larger epoch: {new.owner!r} "
            f"would take over from {current.owner!r} at epoch {new.epoch}, where "
            f"{current.owner!r} could go on writing; ask for epoch {current.epoch + 1}"
        )


class InvalidArgument(ShadowpodError, ValueError):
    """A number given to the store that it cannot take (out of range, or not an
    integer); nothing was read or written."""

    reason = "InvalidArgument"


class InvalidTurn(ShadowpodError, ValueError):
    """An output or an ack names a turn that is not an inbound entry of the journal."""

    reason = "InvalidTurn"

    def __init__(self, session: str, *, kind: str, turn: int, head: int, beyond: bool) -> None:
        self.session = session
        self.turn = turn
        self.head = head
        what = "an ack" if kind == "ack" else f"a {kind!r} output"
        why = (
            f"beyond the journal's head ({head})"
            if beyond
            else "which is not an inbound entry (a user or system message, a schedule fire)"
        )
        super().__init__(
            f"session {session!r}: {what} names turn {turn}, {why}; a turn is the seq of "
            "the inbound entry being processed, as delivered — nothing was appended"
        )


class StoreUnusable(ShadowpodError):
    """The journal's location cannot hold a journal (a directory, a file that is not a
    database, no permission): retrying will not help; the URL or the path must change."""

    reason = "StoreUnusable"
