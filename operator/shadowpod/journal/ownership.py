"""Rules of the ownership record shared by every backend.

The fence guarantee: a write at an epoch older than the current one is refused, so
an ownership change must never let two owners write at one epoch. Hence an epoch
never goes down, and a new owner always comes with a new, larger epoch (changing
only the fence keeps the epoch). Stores check this in the transaction of the change,
under the same lock as the compare-and-set, and the databases refuse any other
update of the record that breaks it (a trigger on each backend).
"""

from __future__ import annotations

from shadowpod.domain.entries import NewEntry
from shadowpod.domain.ownership import Ownership
from shadowpod.domain.payloads import ControlEvent, ControlPayload
from shadowpod.journal.arguments import check_epoch
from shadowpod.journal.errors import EpochDecrease, OwnerChangeNeedsNewEpoch

# What the databases' triggers say when an update of the record breaks the rule.
TRIGGER_MESSAGE = (
    "shadowpod: the ownership record may not lower its epoch, nor change its owner "
    "without a larger epoch"
)


def validate_transition(session: str, current: Ownership, new: Ownership) -> None:
    check_epoch("epoch", new.epoch)
    if new.epoch < current.epoch:
        raise EpochDecrease(session, current=current, requested=new.epoch)
    if new.owner != current.owner and new.epoch == current.epoch:
        raise OwnerChangeNeedsNewEpoch(session, current=current, new=new)


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
