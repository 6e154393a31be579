"""Rules of the ownership record shared by every backend."""

from __future__ import annotations

from shadowpod.domain.entries import NewEntry
from shadowpod.domain.ownership import Ownership
from shadowpod.domain.payloads import ControlEvent, ControlPayload
from shadowpod.journal.errors import InvalidOwnership


def validate_transition(session: str, current: Ownership, new: Ownership) -> None:
    if new.epoch < current.epoch:
        raise InvalidOwnership(
            f"session {session!r}: epoch may only grow (current {current.epoch}, "
            f"requested {new.epoch})"
        )


def epoch_marker(current: Ownership, new: Ownership) -> NewEntry:
    """The ``control``/``epoch`` entry journaled with an epoch change; its seq is ``fence_seq``."""
    return NewEntry.of(
        ControlPayload(
            event=ControlEvent.EPOCH,
            epoch=new.epoch,
            owner=new.owner,
            detail={"previous_epoch": current.epoch, "previous_owner": current.owner},
        ),
        id=f"epoch:{new.epoch}",
    )
