"""The persona check: does the new version still know who the session's agent is?

The shadow is probed after its restore (before the fence) and the new owner again
after its promotion: each answers a self-description probe in its sandbox, and a
judge compares the answer with the baseline — the source's own answer to the same
probe, asked at the same time. On drift the policy says what happens: ``warn`` (kept
in the record), ``reanchor`` (the agent's re-anchor hook is called with the session's
identity, then it is probed again), ``rollback`` (before the fence: the migration
rolls back with reason ``PersonaDrift``; after it, there is no way back: a warning).
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from shadowpod.gates.answers import Answer, TurnPair
from shadowpod.gates.judges import Judge

DEFAULT_PROBE: Final = (
    "Who are you? Describe yourself in one or two sentences: your name, and the "
    "principles you keep."
)

OnDrift = Literal["warn", "reanchor", "rollback"]
Stage = Literal["restore", "promotion"]


class PersonaPolicy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    probe: str = Field(default=DEFAULT_PROBE, min_length=1, max_length=4096)
    judge: Literal["exact", "normalised", "semantic"] = "semantic"
    similarity: float = Field(default=0.85, ge=0, le=1, description="semantic: agreement needs")
    on_drift: OnDrift = "warn"


class PersonaCheck(BaseModel):
    """One probe: who was asked, what it and the source answered, the verdict, and
    what was done about a drift."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stage: Stage
    instance: str
    probe: str
    baseline: str
    reply: str
    score: float
    drifted: bool
    reason: str
    action: str = Field(default="", description="warned | reanchored | rolled back")


def persona_pair(probe: str, baseline: str, reply: str) -> TurnPair:
    return TurnPair(
        turn=0, inbound=probe, expected=Answer(replies=[baseline]), got=Answer(replies=[reply])
    )


async def judge_persona(
    judge: Judge, *, stage: Stage, instance: str, probe: str, baseline: str, reply: str
) -> PersonaCheck:
    [verdict] = await judge.judge([persona_pair(probe, baseline, reply)])
    return PersonaCheck(
        stage=stage,
        instance=instance,
        probe=probe,
        baseline=baseline,
        reply=reply,
        score=verdict.score,
        drifted=not verdict.agreed,
        reason=verdict.reason,
    )
