"""Upgrade gates, live on this machine: a session of the reference agent v2 is offered
two upgrades while a client keeps talking to it — one that forgets the user's name
(rejected by shadow compare: rolled back, the session untouched) and one merely
reworded (accepted: validated, fenced, serving). Behind ``shadowpod demo --gate``."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from shadowpod.domain.entries import JournalEntry
from shadowpod.engine.record import (
    InstanceRef,
    MigrationPolicy,
    MigrationRecord,
    Phase,
    ValidationPolicy,
)
from shadowpod.gates.policy import GatePolicy
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.images import reference_images

SESSION: Final = "gated"
SOURCE: Final = InstanceRef(name="gated-v2", image="refagent:v2")
LIVE: Final = ("what is my name?", "hello", "what's my name")
MAX_MESSAGES: Final = 300  # at ~5 a second: a bound, whatever happens
REJECTED: Final = "refagent:v2-forgetful"
ACCEPTED: Final = "refagent:v2-reworded"


@dataclass
class GateAttempt:
    record: MigrationRecord
    sent: list[int]
    replies_per_turn: dict[int, int]
    last_reply: str  # to a question asked once the verdict was in
    last_by: str

    @property
    def lost(self) -> int:
        return sum(1 for seq in self.sent if self.replies_per_turn.get(seq, 0) == 0)

    @property
    def duplicated(self) -> int:
        return sum(1 for seq in self.sent if self.replies_per_turn.get(seq, 0) > 1)


def gate_policy(gate: GatePolicy, *, turns: int = 3, timeout_s: float = 20) -> MigrationPolicy:
    return MigrationPolicy(
        validation=ValidationPolicy(turns=turns, timeout_s=timeout_s, gate=gate),
        max_duration_s=max(60.0, timeout_s * 3),
    )


async def attempt_upgrade(
    dep: LocalDeployment,
    owner: InstanceRef,
    target_image: str,
    policy: MigrationPolicy,
    *,
    last: str = "what is my name?",
) -> GateAttempt:
    """Migrate ``owner``'s session to ``target_image`` while a client asks questions;
    then one more question (``last``), and who answered it."""
    async with dep.client() as client:
        record = dep.plan(SESSION, source=owner, target_image=target_image, policy=policy)
        migration = asyncio.create_task(dep.migrate(record))
        sent: list[int] = []
        while not migration.done() and len(sent) < MAX_MESSAGES:
            text = LIVE[len(sent) % len(LIVE)]
            sent.append((await client.post_message(SESSION, text)).seq)
            await asyncio.wait({migration}, timeout=0.2)
        result = await migration
        sent.append((await client.post_message(SESSION, last)).seq)
        replies = await _replies_to(dep, sent)
    answer = replies[sent[-1]][0]
    return GateAttempt(
        record=result,
        sent=sent,
        replies_per_turn={seq: len(found) for seq, found in replies.items()},
        last_reply=str(answer.payload["content"]),
        last_by=str(answer.payload.get("meta", {}).get("instance")),
    )


async def _replies_to(
    dep: LocalDeployment, seqs: list[int], timeout_s: float = 30
) -> dict[int, list[JournalEntry]]:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        entries, _ = await dep.admin.journal(SESSION, after=0, limit=5000)
        found: dict[int, list[JournalEntry]] = {}
        for e in entries:
            turn = e.payload.get("turn")
            if e.kind == "message" and e.payload.get("role") == "assistant":
                found.setdefault(turn if isinstance(turn, int) else -1, []).append(e)
        acked = Counter(e.payload.get("turn") for e in entries if e.kind == "ack")
        if all(seq in found and acked[seq] for seq in seqs):
            return found
        if asyncio.get_running_loop().time() > deadline:
            missing = [seq for seq in seqs if seq not in found]
            raise TimeoutError(f"no reply to seqs {missing} within {timeout_s:g}s")
        await asyncio.sleep(0.05)


async def start_session(dep: LocalDeployment) -> None:
    """The session on v2, told the user's name (what the forgetful version loses)."""
    await dep.create_session(SESSION, image=SOURCE.image, instance=SOURCE.name)
    async with dep.client() as client:
        seed = (await client.post_message(SESSION, "my name is Ada")).seq
    await _replies_to(dep, [seed])


async def run_gate_demo(workdir: Path, gate: GatePolicy | None = None) -> list[GateAttempt]:
    """The forgetful upgrade, then the reworded one, on one session."""
    gate = gate or GatePolicy(judge="semantic")
    async with LocalDeployment(workdir, reference_images()) as dep:
        await dep.validator.prepare(gate)  # the judge's model, before any migration
        await start_session(dep)
        rejected = await attempt_upgrade(dep, SOURCE, REJECTED, gate_policy(gate))
        owner = (
            SOURCE if rejected.record.phase is not Phase.SUCCEEDED else rejected.record.spec.target
        )
        accepted = await attempt_upgrade(dep, owner, ACCEPTED, gate_policy(gate))
        return [rejected, accepted]
