"""The Validating phase (shadow compare) on in-memory fakes of the engine's ports.

With real processes and real judges: tests/gates/test_shadow_compare.py.
"""

from __future__ import annotations

import pytest

from shadowpod.engine.engine import MigrationEngine
from shadowpod.engine.record import MigrationRecord, Phase, ValidationPolicy
from shadowpod.gates.persona import PersonaPolicy
from shadowpod.gates.policy import GatePolicy
from tests.engine.fakes import FakeValidator, MemoryRecords
from tests.engine.test_engine import SOURCE, TARGET, World

GATED_PHASES = [
    "Pending", "Preflight", "Snapshotting", "Restoring", "CatchingUp",
    "Validating", "Fencing", "Committed", "Draining", "Succeeded",
]  # fmt: skip


class GatedWorld(World):
    def __init__(self) -> None:
        super().__init__()
        self.validator: FakeValidator | None = FakeValidator(self.session)

    def engine(self) -> MigrationEngine:
        return MigrationEngine(
            self.runtime,
            self.control,
            self.records,
            clock=self.clock,
            poll_s=0.0001,
            validator=self.validator,
        )

    def gated(
        self, turns: int = 5, timeout_s: float = 30, goldens: list[str] | None = None
    ) -> MigrationRecord:
        validation = ValidationPolicy(
            turns=turns,
            timeout_s=timeout_s,
            gate=GatePolicy(judge="normalised"),
            goldens=goldens or [],
        )
        return self.record(validation=validation)


@pytest.fixture
def world() -> GatedWorld:
    return GatedWorld()


async def test_a_version_that_agrees_is_validated_then_fenced(world: GatedWorld) -> None:
    record = await world.engine().run(world.gated())
    assert record.phase is Phase.SUCCEEDED, record.error
    assert world.records.phases() == GATED_PHASES
    assert record.validation is not None and record.validation.passed
    assert record.validation.compared == 5  # the policy's turns, not all that came
    assert world.validator is not None and len(world.validator.compares) == 1
    assert world.validator.asked == {TARGET}  # the shadow answers, nobody else


async def test_a_version_that_disagrees_rolls_back_before_any_fence(world: GatedWorld) -> None:
    assert world.validator is not None
    world.validator.agrees = False
    record = await world.engine().run(world.gated())
    assert record.phase is Phase.ROLLED_BACK
    assert (record.reason, record.failed_phase) == ("ValidationFailed", Phase.VALIDATING)
    assert record.error is not None and "agree" in record.error
    assert record.validation is not None and record.validation.worst
    assert world.session.fences == 0
    assert (world.session.ownership.epoch, world.session.ownership.owner) == (1, SOURCE)
    assert world.runtime.alive() == {SOURCE}  # the shadow is gone, the source serves


async def test_an_idle_session_is_judged_on_what_came_when_the_time_is_up(
    world: GatedWorld,
) -> None:
    world.session.arrivals_per_poll = 0  # nobody talks to the session
    record = await world.engine().run(world.gated(timeout_s=3))
    assert record.phase is Phase.ROLLED_BACK and record.reason == "ValidationFailed"
    assert record.validation is not None and record.validation.compared == 0
    timing = record.timings["Validating"].seconds
    assert timing is not None and 3 <= timing < 10  # fake seconds: polls of the clock


async def test_an_engine_without_a_validator_rolls_back_saying_so(world: GatedWorld) -> None:
    world.validator = None
    record = await world.engine().run(world.gated())
    assert record.phase is Phase.ROLLED_BACK
    assert record.error is not None and "cannot validate" in record.error


async def test_a_fence_retry_does_not_validate_again(world: GatedWorld) -> None:
    world.session.busy_fences = 1
    record = await world.engine().run(world.gated())
    assert record.phase is Phase.SUCCEEDED, record.error
    assert record.fence_attempts == 2
    assert world.records.phases().count("Validating") == 1
    assert world.validator is not None and len(world.validator.compares) == 1


class EngineStopped(BaseException):
    pass


async def test_an_engine_stopped_while_validating_keeps_the_window(world: GatedWorld) -> None:
    class StopsOnce(MemoryRecords):
        stopped = False

        async def save(self, record: MigrationRecord) -> None:
            await super().save(record)
            if record.validation_from is not None and not self.stopped:
                self.stopped = True
                raise EngineStopped

    world.records = StopsOnce()
    with pytest.raises(EngineStopped):
        await world.engine().run(world.gated())
    stored = await world.records.load("m-1")
    assert stored is not None and stored.phase is Phase.VALIDATING
    window = stored.validation_from
    record = await world.engine().run(stored)
    assert record.phase is Phase.SUCCEEDED, record.error
    assert record.validation is not None and record.validation.from_seq == window
    assert [s.name for s in world.runtime.started] == [TARGET]


async def test_golden_sessions_are_replayed_first_and_a_failed_one_rolls_back(
    world: GatedWorld,
) -> None:
    assert world.validator is not None
    world.validator.failing_goldens = {"b.jsonl"}
    record = await world.engine().run(world.gated(goldens=["a.jsonl", "b.jsonl"]))
    assert record.phase is Phase.ROLLED_BACK and record.reason == "ValidationFailed"
    assert record.error is not None and "b.jsonl: FAILED" in record.error
    assert [v.passed for v in record.golden_validations] == [True, False]
    assert world.validator.compares == []  # no live window was opened
    assert world.session.fences == 0


async def test_goldens_alone_gate_a_migration(world: GatedWorld) -> None:
    record = await world.engine().run(world.gated(turns=0, goldens=["a.jsonl"]))
    assert record.phase is Phase.SUCCEEDED, record.error
    assert world.records.phases() == GATED_PHASES
    assert world.validator is not None and world.validator.replayed == ["a.jsonl"]
    assert world.validator.compares == [] and record.validation is None


async def test_a_shadow_that_lost_its_window_gets_another(world: GatedWorld) -> None:
    assert world.validator is not None
    world.validator.loses_window = 1  # restarted mid-window: its answers are gone
    record = await world.engine().run(world.gated())
    assert record.phase is Phase.SUCCEEDED, record.error
    first, second = world.validator.windows
    assert second > first  # re-opened at the head, not judged on the lost window
    assert record.validation is not None and record.validation.from_seq == second
    assert any("lost its compare window" in note for note in record.notes)


async def test_a_shadow_that_keeps_losing_its_window_rolls_back_unjudged(
    world: GatedWorld,
) -> None:
    assert world.validator is not None
    world.validator.loses_window = 10
    record = await world.engine().run(world.gated())
    assert record.phase is Phase.ROLLED_BACK
    assert record.reason == "ValidationUnavailable"  # never a guessed verdict
    assert record.validation is None
    assert world.session.fences == 0


async def test_persona_drift_rolls_back_before_the_fence_with_the_probes_kept(
    world: GatedWorld,
) -> None:
    assert world.validator is not None
    world.validator.drifts = True
    record = world.record(persona=PersonaPolicy(on_drift="rollback"))
    record = await world.engine().run(record)
    assert record.phase is Phase.ROLLED_BACK
    assert (record.reason, record.failed_phase) == ("PersonaDrift", Phase.VALIDATING)
    [check] = record.persona_checks
    assert check.reply == "I am someone else" and check.action == "rolled back"
    assert world.session.fences == 0


async def test_a_persona_policy_alone_probes_after_restore_and_after_promotion(
    world: GatedWorld,
) -> None:
    record = await world.engine().run(world.record(persona=PersonaPolicy()))
    assert record.phase is Phase.SUCCEEDED, record.error
    assert [c.stage for c in record.persona_checks] == ["restore", "promotion"]
    assert "Validating" in world.records.phases()
