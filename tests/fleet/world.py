"""A fleet in a loop: the planner and the pacing queue drive migrations whose outcome
the test decides, tick by tick, as the operator will drive AgentMigrations.

Each tick: the planner decides (its state carried over, as in the AgentDeployment's
status); the rollout's starts become queued migrations and its cancels are withdrawn;
the pacing queue admits queued ones; running ones progress, and finish as ``judge``
says. ``check`` runs after every tick so a property holds at every instant.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from shadowpod.fleet.followers import Follower, Move, MoveState, Outcome, Verdict
from shadowpod.fleet.pacing import Caps, Request, admit, drain_group, rollout_group
from shadowpod.fleet.planner import Plan, plan
from shadowpod.fleet.state import Control, RolloutState
from shadowpod.fleet.strategy import RolloutStrategy

ROLLOUT = rollout_group("default", "support")


@dataclass
class Migration:
    name: str
    session: str
    target: str
    group: str
    node: str | None
    queued_at: float
    revision: int | None
    running: bool = False
    ticks_left: int = 2


@dataclass
class World:
    sessions: dict[str, Follower]
    strategy: RolloutStrategy
    caps: Caps = field(default_factory=Caps)
    # (session, target) -> (succeeded, engine reason); default: every move succeeds.
    judge: Callable[[str, str], tuple[bool, str | None]] = lambda _s, _t: (True, None)
    duration: int = 2
    # Whether clients send turns during the moves: without, a gate has none to judge.
    traffic: bool = True
    state: RolloutState = field(default_factory=RolloutState)
    control: Control = field(default_factory=Control)
    now: float = 1_000.0
    migrations: dict[str, Migration] = field(default_factory=dict)
    plans: list[Plan] = field(default_factory=list)
    started: list[str] = field(default_factory=list)  # every session a move was made for
    max_running: int = 0
    max_running_per_node: int = 0
    max_rollout_in_flight: int = 0
    max_rollout_per_node: int = 0

    def followers(self) -> list[Follower]:
        moves = {m.session: m for m in self.migrations.values()}
        result = []
        for follower in self.sessions.values():
            migration = moves.get(follower.name)
            move = None
            if migration is not None:
                move = Move(
                    migration.name,
                    migration.target,
                    MoveState.RUNNING if migration.running else MoveState.QUEUED,
                    migration.revision,
                )
            result.append(replace(follower, move=move))
        return result

    def tick(self, target: str) -> Plan:
        self.now += 1
        decided = plan(target, self.followers(), self.strategy, self.state, self.control, self.now)
        self.plans.append(decided)
        self.state = decided.state
        for name in decided.cancel:
            migration = self.migrations.pop(name)
            assert not migration.running, f"{name} was withdrawn while running"
        for start in decided.start:
            assert not any(m.session == start.session for m in self.migrations.values()), (
                f"{start.session} was given a second migration"
            )
            name = f"{start.session}-r{start.revision}-{len(self.started)}"
            self.started.append(start.session)
            self.migrations[name] = Migration(
                name,
                start.session,
                start.target,
                ROLLOUT,
                start.node,
                self.now,
                start.revision,
                ticks_left=self.duration,
            )
        self.pace()
        self.progress()
        return decided

    def drain(self, node: str) -> list[str]:
        """Queue a move of every session on ``node`` that has none (same version)."""
        names = []
        for follower in self.sessions.values():
            if follower.node != node or follower.pinned:
                continue
            if any(m.session == follower.name for m in self.migrations.values()):
                continue
            name = f"{follower.name}-drain-{self.now}"
            self.migrations[name] = Migration(
                name,
                follower.name,
                follower.version,
                drain_group(node),
                node,
                self.now,
                None,
                ticks_left=self.duration,
            )
            names.append(name)
        return names

    def pace(self) -> None:
        requests = [
            Request(m.name, m.group, m.node, m.queued_at, m.running)
            for m in self.migrations.values()
        ]
        for name in admit(requests, self.caps).admit:
            self.migrations[name].running = True
        running = [m for m in self.migrations.values() if m.running]
        own = [m for m in self.migrations.values() if m.revision is not None]
        self.max_running = max(self.max_running, len(running))
        self.max_running_per_node = max(
            [self.max_running_per_node, *Counter(m.node for m in running).values()]
        )
        self.max_rollout_in_flight = max(self.max_rollout_in_flight, len(own))
        self.max_rollout_per_node = max(
            [self.max_rollout_per_node, *Counter(m.node for m in own).values()]
        )

    def progress(self) -> None:
        for migration in list(self.migrations.values()):
            if not migration.running:
                continue
            migration.ticks_left -= 1
            if migration.ticks_left > 0:
                continue
            del self.migrations[migration.name]
            session = self.sessions[migration.session]
            assert not session.pinned, f"pinned {session.name} was moved"
            succeeded, reason = self.judge(session.name, migration.target)
            verdict = Verdict(
                passed=reason != "ValidationFailed",
                judge="exact",
                inconclusive=reason == "ValidationFailed" and not self.traffic,
            )
            outcome = Outcome(
                migration.name,
                migration.target,
                succeeded,
                self.now,
                float(self.duration),
                migration.revision,
                None if succeeded else reason,
                reason or "",
                verdict,
            )
            version = migration.target if succeeded else session.version
            # A drained session lands on another node.
            node = session.node if migration.revision is not None else f"{session.node}-new"
            self.sessions[session.name] = replace(session, version=version, node=node, last=outcome)

    def run(self, target: str, ticks: int, until: Callable[[Plan], bool]) -> Plan:
        for _ in range(ticks):
            decided = self.tick(target)
            if until(decided) and not self.migrations:
                return decided
        raise AssertionError(f"not done after {ticks} ticks: {self.plans[-1].progress}")


def fleet(
    count: int, version: str = "agent:1", nodes: int = 3, pinned: frozenset[int] = frozenset()
) -> dict[str, Follower]:
    return {
        f"s{i:04}": Follower(f"s{i:04}", version, node=f"node-{i % nodes}", pinned=i in pinned)
        for i in range(count)
    }
