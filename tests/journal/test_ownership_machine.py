"""The fence guarantee as a state machine, on every backend: whatever the sequence of
ownership changes, fences, unfences and owner writes,

- a write at an epoch other than the current one (an older one above all) is refused;
- an epoch never goes down, and a new owner always comes with a larger epoch;
- in the journal, no owner entry of an epoch follows the marker of a later one.
"""

from __future__ import annotations

import itertools
from typing import ClassVar, Final

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from shadowpod.domain.ownership import FenceState, Ownership
from shadowpod.journal.errors import (
    EpochConflict,
    EpochDecrease,
    Fenced,
    InvalidArgument,
    OwnerChangeNeedsNewEpoch,
)
from shadowpod.journal.store import JournalStore
from tests.journal.conftest import SyncStore
from tests.journal.test_contract import msg

OWNERS: Final = st.sampled_from(["pod-a", "pod-b", "pod-c", None])
_names = itertools.count()


class OwnershipMachine(RuleBasedStateMachine):
    sync: ClassVar[SyncStore]

    def __init__(self) -> None:
        super().__init__()
        self.session = f"m{next(_names)}"
        self.sync(self.store.create_session(self.session))
        self.current = Ownership()  # what the store must hold
        self.seen = Ownership()  # the record as last read back

    @property
    def store(self) -> JournalStore:
        return self.sync.store

    def _set(self, expect_epoch: int, new: Ownership) -> type[Exception] | None:
        try:
            self.sync(self.store.compare_and_set_ownership(self.session, expect_epoch, new))
        except (EpochConflict, EpochDecrease, OwnerChangeNeedsNewEpoch) as exc:
            return type(exc)
        return None

    @rule(
        expect_offset=st.sampled_from([0, 0, 0, -1, 1]),
        bump=st.sampled_from([0, 1, 1, 2, -1]),
        owner=OWNERS,
    )
    def change_owner(self, expect_offset: int, bump: int, owner: str | None) -> None:
        expect = self.current.epoch + expect_offset
        epoch = self.current.epoch + bump
        if expect < 0 or epoch < 0:
            return
        new = Ownership(epoch=epoch, owner=owner, fence=FenceState.OPEN)
        refused = self._set(expect, new)
        if expect != self.current.epoch:
            assert refused is EpochConflict
        elif epoch < self.current.epoch:
            assert refused is EpochDecrease
        elif owner != self.current.owner and epoch == self.current.epoch:
            assert refused is OwnerChangeNeedsNewEpoch
        else:
            assert refused is None
            self.current = new

    @rule(fence=st.sampled_from(FenceState))
    def fence_or_unfence(self, fence: FenceState) -> None:
        new = self.current.model_copy(update={"fence": fence})
        assert self._set(self.current.epoch, new) is None
        self.current = new

    @rule(offset=st.sampled_from([0, 0, -1, -2, 1]))
    def owner_writes(self, offset: int) -> None:
        epoch = self.current.epoch + offset
        entry = msg(f"at {epoch}", role="assistant")
        outcome: tuple[int, int] | str | None = None
        try:
            self.sync(self.store.append(self.session, [entry], owner_epoch=epoch))
        except Fenced as exc:
            outcome = (exc.epoch, exc.current)
        except InvalidArgument:
            outcome = "invalid"
        if epoch < 1:
            assert outcome == "invalid"  # no owner writes at epoch 0
        elif epoch != self.current.epoch:
            assert outcome == (epoch, self.current.epoch)  # an older epoch above all
        else:
            assert outcome is None

    @invariant()
    def the_record_keeps_the_fence_guarantee(self) -> None:
        record = self.sync(self.store.get_ownership(self.session))
        assert (record.epoch, record.owner, record.fence) == (
            self.current.epoch,
            self.current.owner,
            self.current.fence,
        )
        assert record.epoch >= self.seen.epoch  # never down
        if record.owner != self.seen.owner:
            assert record.epoch > self.seen.epoch  # a new owner, a new epoch
        self.seen = record

    def teardown(self) -> None:
        latest = 0  # the epoch of the last marker in seq order
        for entry in self.sync(self.store.read(self.session, 0, 100_000)):
            if entry.kind == "control" and entry.payload.get("event") == "epoch":
                assert entry.payload["epoch"] > latest
                latest = entry.payload["epoch"]
            elif entry.epoch:
                assert entry.epoch == latest, "an owner wrote after its epoch was replaced"


def test_the_fence_guarantee_holds_for_any_sequence_of_changes_and_writes(
    sync_store: SyncStore,
) -> None:
    machine = type("Machine", (OwnershipMachine,), {"sync": sync_store})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=30,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture],
        ),
    )
