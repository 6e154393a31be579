"""In-memory fakes of the engine's ports, for engine and operator tests without processes.

``FakeSession`` is one session as the gateway and its instances would show it, kept
coherent: a snapshot request is answered by the owner, a started shadow restores,
catches up and reports ready, the fence bumps the epoch and the shadow takes over,
the superseded source exits. The runtime (``FakeRuntime``) and the control API
(``FakeControl``) are two views of it. Faults are set on the fakes: an instance that
never gets ready or fails, a runtime or gateway that cannot be reached for a while, an
image that cannot read the source's state schema.

Time is the fake's too (``FakeClock``): every status poll moves it on by a second, so
deadlines and ``max_duration_s`` are met after a known number of polls, not after a
wait in real time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from shadowpod.domain.ownership import FenceState, Ownership
from shadowpod.engine.ports import (
    Checkpoint,
    CheckpointRestoreUnsupported,
    CompareWindowLost,
    FenceOutcome,
    FencePause,
    FenceTimedOut,
    GatewayUnavailable,
    ImageInfo,
    ImageNotFound,
    InstanceSpec,
    InstanceStatus,
    RuntimeFailure,
    RuntimeUnavailable,
)
from shadowpod.engine.record import MigrationRecord, ValidationSummary
from shadowpod.gates.persona import PersonaCheck, PersonaPolicy, Stage
from shadowpod.gates.policy import GatePolicy
from shadowpod.journal.errors import EpochConflict


class FakeClock:
    def __init__(self, start: float = 1_000_000.0, tick_s: float = 1.0) -> None:
        self.now = start
        self.tick_s = tick_s

    def __call__(self) -> float:
        return self.now

    def tick(self) -> None:
        self.now += self.tick_s


@dataclass
class FakeInstance:
    spec: InstanceSpec
    alive: bool = True
    mode: str = "starting"
    epoch: int = 0
    watermark: int = 0
    polls: int = 0
    error: str | None = None
    # Polls before it reports ready (a shadow restoring, an owner starting).
    ready_after: int = 1
    # False: it never catches up (its lag grows with the session's head).
    catches_up: bool = True
    # How it behaves once promoted: serves (after this many polls), or fails with this error.
    takeover_polls: int = 0
    fails_to_serve: str | None = None

    def status(self) -> InstanceStatus:
        ready = self.alive and self.mode in ("shadow", "owner") and self.polls >= self.ready_after
        return InstanceStatus(
            name=self.spec.name,
            alive=self.alive,
            ready=ready,
            mode=self.mode,
            epoch=self.epoch,
            watermark=self.watermark,
            catchup_entries=self.watermark if ready and self.catches_up else None,
            catchup_entries_per_s=1000.0 if ready and self.catches_up else None,
            serving=ready and self.mode == "owner",
            error=self.error,
        )


@dataclass
class FakeSession:
    """One session: its journal head, ownership, snapshots and instances."""

    name: str
    head: int = 100
    ownership: Ownership = field(default_factory=Ownership)
    snapshots: list[int] = field(default_factory=list)
    instances: dict[str, FakeInstance] = field(default_factory=dict)
    # Inbound entries arriving per status poll: the session keeps serving.
    arrivals_per_poll: int = 3
    # Faults of the gateway: a fence the source is too busy for, an unreachable gateway.
    busy_fences: int = 0
    gateway_down_calls: int = 0
    fences: int = 0

    def advance(self) -> None:
        self.head += self.arrivals_per_poll
        for instance in self.instances.values():
            if not instance.alive:
                continue
            instance.polls += 1
            if instance.mode == "starting" and instance.polls >= instance.ready_after:
                instance.mode = "owner" if instance.spec.mode == "owner" else "shadow"
            if instance.mode == "shadow" and instance.catches_up:
                instance.watermark = self.head
            owner = instance.mode == "owner" and instance.epoch == self.ownership.epoch
            if owner:
                instance.watermark = self.head
            if instance.mode == "owner" and instance.epoch < self.ownership.epoch:
                instance.alive, instance.mode = False, "stopped"  # superseded: drains, exits


class FakeRuntime:
    """The engine's ``Runtime`` over a ``FakeSession``."""

    def __init__(
        self,
        session: FakeSession,
        clock: FakeClock,
        images: dict[str, ImageInfo] | None = None,
    ) -> None:
        self.session = session
        self.clock = clock
        self.images = images or {
            "agent:v1": ImageInfo(image="agent:v1", state_schema=1, reads_state_schemas=[1]),
            "agent:v2": ImageInfo(image="agent:v2", state_schema=2, reads_state_schemas=[1, 2]),
        }
        self.started: list[InstanceSpec] = []
        self.stopped: list[str] = []
        self.unavailable_calls = 0  # calls answered RuntimeUnavailable before it answers again
        self.failing_starts: dict[str, str] = {}  # instance name -> why it cannot start
        self.missing: dict[str, list[str]] = {}  # image -> credentials it would not have
        # How each instance started here behaves (see ``FakeInstance``), by name.
        self.behaviour: dict[str, Callable[[FakeInstance], None]] = {}

    def _reachable(self) -> None:
        if self.unavailable_calls > 0:
            self.unavailable_calls -= 1
            self.clock.tick()  # giving up on an answer takes time
            raise RuntimeUnavailable("the API server did not answer")

    async def describe(self, image: str) -> ImageInfo:
        self._reachable()
        if image not in self.images:
            raise ImageNotFound(f"image {image!r} cannot be resolved")
        return self.images[image]

    async def missing_credentials(self, image: str, names: list[str]) -> list[str]:
        self._reachable()
        return [n for n in names if n in self.missing.get(image, [])]

    async def start(self, spec: InstanceSpec) -> None:
        self._reachable()
        if spec.name in self.failing_starts:
            raise RuntimeFailure(self.failing_starts[spec.name])
        running = self.session.instances.get(spec.name)
        if running is not None and running.alive:
            return
        instance = FakeInstance(spec, epoch=spec.epoch or 0)
        if spec.snapshot is not None:
            instance.watermark = spec.snapshot
        if behave := self.behaviour.get(spec.name):
            behave(instance)
        self.session.instances[spec.name] = instance
        self.started.append(spec)

    async def status(self, name: str) -> InstanceStatus:
        self._reachable()
        self.clock.tick()
        self.session.advance()
        instance = self.session.instances.get(name)
        if instance is None:
            return InstanceStatus(name=name, alive=False, error="never started here")
        return instance.status()

    async def stop(self, name: str, *, grace_s: float) -> None:
        self._reachable()
        instance = self.session.instances.get(name)
        if instance is not None and instance.alive:
            instance.alive, instance.mode = False, "stopped"
        self.stopped.append(name)

    def kill(self, name: str) -> None:
        """SIGKILL: the instance is gone at once, as a crashed process or pod is."""
        instance = self.session.instances[name]
        instance.alive, instance.mode, instance.error = False, "crashed", "was killed by SIGKILL"

    def owner(self, name: str, *, epoch: int = 1) -> FakeInstance:
        """An instance already serving as the session's owner (the migration's source)."""
        spec = InstanceSpec(name=name, image="agent:v1", session=self.session.name, mode="owner")
        instance = FakeInstance(spec, mode="owner", epoch=epoch, watermark=self.session.head)
        self.session.instances[name] = instance
        self.session.ownership = Ownership(epoch=epoch, owner=name)
        return instance

    def alive(self) -> set[str]:
        return {n for n, i in self.session.instances.items() if i.alive}


class FakeCheckpointer:
    """The engine's ``Checkpointer`` over a ``FakeRuntime``: a checkpoint holds the
    source's watermark; a restored instance starts as a shadow at that watermark."""

    def __init__(self, runtime: FakeRuntime) -> None:
        self.runtime = runtime
        self.taken: list[tuple[str, str, int]] = []  # (source, target, watermark)
        self.restored: list[tuple[str, InstanceSpec]] = []
        self.discarded: list[str] = []
        self.failure: str | None = None  # why a checkpoint cannot be taken
        # Why the checkpoint ("checkpoint") or the restore ("restore") is unsupported.
        self.unsupported: dict[str, str] = {}

    async def checkpoint(self, source: str, target: str) -> Checkpoint:
        self.runtime._reachable()
        if self.failure is not None:
            raise RuntimeFailure(self.failure)
        if "checkpoint" in self.unsupported:
            raise CheckpointRestoreUnsupported(self.unsupported["checkpoint"])
        instance = self.runtime.session.instances[source]
        self.taken.append((source, target, instance.watermark))
        return Checkpoint(
            ref=f"checkpoint-{len(self.taken)}", watermark=instance.watermark, dump_ms=12.5
        )

    async def restore(self, checkpoint: str, spec: InstanceSpec) -> None:
        if "restore" in self.unsupported:
            raise CheckpointRestoreUnsupported(self.unsupported["restore"])
        await self.runtime.start(spec)
        self.restored.append((checkpoint, spec))

    async def discard(self, checkpoint: str) -> None:
        self.discarded.append(checkpoint)


class FakeControl:
    """The engine's ``SessionControl`` over a ``FakeSession``."""

    def __init__(self, session: FakeSession) -> None:
        self.session = session
        self.set_owner_calls = 0

    def _reachable(self) -> None:
        if self.session.gateway_down_calls > 0:
            self.session.gateway_down_calls -= 1
            raise GatewayUnavailable("no answer from the gateway: connection refused")

    async def head(self, session: str) -> int:
        self._reachable()
        return self.session.head

    async def ownership(self, session: str) -> Ownership:
        self._reachable()
        return self.session.ownership

    async def request_snapshot(self, session: str) -> int:
        self._reachable()
        self.session.head += 1
        seq = self.session.head
        owner = self.session.instances.get(self.session.ownership.owner or "")
        if owner is not None and owner.alive:
            self.session.snapshots.append(seq)  # the owner answers at once
        return seq

    async def latest_snapshot(self, session: str) -> int | None:
        self._reachable()
        return self.session.snapshots[-1] if self.session.snapshots else None

    async def fence(
        self, session: str, *, expect_epoch: int, new_owner: str, timeout_s: float
    ) -> FenceOutcome:
        self._reachable()
        ownership = self.session.ownership
        if ownership.epoch != expect_epoch:
            raise EpochConflict(session, expected=expect_epoch, current=ownership)
        if self.session.busy_fences > 0:
            self.session.busy_fences -= 1
            raise FenceTimedOut("the owner stayed mid-turn past the fence timeout")
        owner = self.session.instances.get(ownership.owner or "")
        if owner is None or not owner.alive:  # a dead owner never acks what it was given
            raise FenceTimedOut("the owner did not finish its turn within the fence timeout")
        self.session.head += 1
        epoch = expect_epoch + 1
        self.session.ownership = Ownership(
            epoch=epoch, owner=new_owner, fence_seq=self.session.head
        )
        self.session.fences += 1
        shadow = self.session.instances.get(new_owner)
        if shadow is not None and shadow.alive and shadow.mode == "shadow":
            if shadow.fails_to_serve is not None:
                shadow.alive, shadow.mode, shadow.error = False, "failed", shadow.fails_to_serve
            else:
                shadow.mode, shadow.epoch = "owner", epoch
                shadow.ready_after = shadow.polls + shadow.takeover_polls
        return FenceOutcome(epoch=epoch, fence_seq=self.session.head, waited_ms=3.0)

    async def unfence(self, session: str, *, expect_epoch: int) -> None:
        self._reachable()
        ownership = self.session.ownership
        if ownership.epoch != expect_epoch:
            raise EpochConflict(session, expected=expect_epoch, current=ownership)
        self.session.ownership = ownership.model_copy(update={"fence": FenceState.OPEN})

    async def set_owner(
        self, session: str, *, expect_epoch: int, epoch: int, owner: str
    ) -> Ownership:
        self._reachable()
        if self.session.ownership.epoch != expect_epoch:
            raise EpochConflict(session, expected=expect_epoch, current=self.session.ownership)
        self.session.head += 1  # the epoch marker
        self.session.ownership = Ownership(epoch=epoch, owner=owner, fence_seq=self.session.head)
        self.set_owner_calls += 1
        shadow = self.session.instances.get(owner)
        if shadow is not None and shadow.alive and shadow.mode == "shadow":  # it sees the marker
            shadow.mode, shadow.epoch = "owner", epoch
            shadow.ready_after = shadow.polls + shadow.takeover_polls
        return self.session.ownership

    async def fence_pause(self, session: str) -> FencePause:
        self._reachable()
        return FencePause(ms=3.0)


class MemoryRecords:
    """The engine's ``RecordStore`` in memory, with every saved record kept in order."""

    def __init__(self) -> None:
        self.saved: list[MigrationRecord] = []
        self._latest: dict[str, MigrationRecord] = {}

    async def save(self, record: MigrationRecord) -> None:
        self.saved.append(record)
        self._latest[record.spec.id] = record

    async def load(self, migration_id: str) -> MigrationRecord | None:
        return self._latest.get(migration_id)

    def phases(self) -> list[str]:
        """The phases saved, in order, without repeats."""
        out: list[str] = []
        for record in self.saved:
            if not out or out[-1] != record.phase:
                out.append(record.phase)
        return out


@dataclass
class FakeValidator:
    """Shadow compare over a ``FakeSession``: every inbound entry is one turn the owner
    finishes at once; the verdict is set by the test (``agreed`` of each compared)."""

    session: FakeSession
    agrees: bool = True
    compares: list[tuple[int, int]] = field(default_factory=list)
    failing_goldens: set[str] = field(default_factory=set)
    replayed: list[str] = field(default_factory=list)
    asked: set[str] = field(default_factory=set)  # the instances asked to answer
    windows: list[int] = field(default_factory=list)  # where each window was opened
    loses_window: int = 0  # the shadow restarts mid-window this many times
    drifts: bool = False  # the target answers the persona probe as another agent

    async def replay_golden(
        self, golden: str, image: str, *, instance: str, gate: GatePolicy
    ) -> ValidationSummary:
        self.asked.add(instance)
        self.replayed.append(golden)
        passed = golden not in self.failing_goldens
        return ValidationSummary(
            judge=gate.judge,
            compared=4,
            agreed=4 if passed else 1,
            agreement=1.0 if passed else 0.25,
            threshold=gate.agreement,
            passed=passed,
            golden=golden,
            message=f"{image} on {golden}: {'passed' if passed else 'FAILED'}",
        )

    async def open_window(
        self, session: str, *, instance: str, after_seq: int, turns: int | None = None
    ) -> int:
        self.asked.add(instance)
        self.windows.append(after_seq)
        return after_seq

    async def completed_turns(
        self, session: str, *, instance: str, after_seq: int, up_to: int | None = None
    ) -> tuple[int, int]:
        turns = max(0, self.session.head - after_seq)
        if up_to is not None:
            turns = min(turns, up_to)
        return turns, after_seq + turns

    async def compare(
        self,
        session: str,
        image: str,
        *,
        instance: str,
        after_seq: int,
        to_seq: int,
        gate: GatePolicy,
    ) -> ValidationSummary:
        self.asked.add(instance)
        if self.loses_window:
            self.loses_window -= 1
            raise CompareWindowLost(f"no compare window from seq {after_seq} (restarted)")
        self.compares.append((after_seq, to_seq))
        compared = to_seq - after_seq
        agreed = compared if self.agrees else compared // 2
        agreement = agreed / compared if compared else 0.0
        passed = compared >= gate.min_turns and agreement >= gate.agreement
        return ValidationSummary(
            judge=gate.judge,
            compared=compared,
            agreed=agreed,
            agreement=agreement,
            threshold=gate.agreement,
            passed=passed,
            from_seq=after_seq,
            to_seq=to_seq,
            worst=[] if self.agrees else [f"turn {to_seq}: forgot the name"],
            message=f"{image}: {agreed}/{compared} agree",
        )

    async def persona(
        self,
        policy: PersonaPolicy,
        *,
        stage: Stage,
        instance: str,
        source: str,
        baseline: str | None = None,
    ) -> PersonaCheck:
        self.asked.add(instance)
        said = "I am someone else" if self.drifts else "I am the agent"
        return PersonaCheck(
            stage=stage,
            instance=instance,
            probe=policy.probe,
            baseline=baseline or "I am the agent",
            reply=said,
            score=0.0 if self.drifts else 1.0,
            drifted=self.drifts,
            reason="fake",
        )

    async def reanchor(self, instance: str) -> None:
        self.drifts = False
