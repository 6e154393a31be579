"""A judge's verdicts: one per turn, with its reason, and the gate's overall verdict."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field


class TurnVerdict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    turn: int
    agreed: bool
    score: float = Field(ge=0.0, le=1.0)  # 1.0: the same answer
    reason: str
    expected: str = ""
    got: str = ""


class GateVerdict(BaseModel):
    """Whether a candidate passed: the share of turns judged in agreement against the
    policy's threshold. ``turns`` keeps every turn's verdict and reason."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    judge: str
    threshold: float
    turns: list[TurnVerdict]
    min_turns: int = 1

    @property
    def compared(self) -> int:
        return len(self.turns)

    @property
    def agreed(self) -> int:
        return sum(1 for verdict in self.turns if verdict.agreed)

    @property
    def agreement(self) -> float:
        return self.agreed / self.compared if self.turns else 0.0

    @property
    def passed(self) -> bool:
        return self.compared >= self.min_turns and self.agreement >= self.threshold

    def worst(self, count: int = 5) -> Sequence[TurnVerdict]:
        """The disagreements with the lowest scores first (the ones to read)."""
        disagreements = [verdict for verdict in self.turns if not verdict.agreed]
        return sorted(disagreements, key=lambda v: (v.score, v.turn))[:count]

    def summary(self) -> str:
        outcome = "passed" if self.passed else "FAILED"
        text = (
            f"{outcome}: {self.agreed}/{self.compared} turns agree ({self.agreement:.0%}) "
            f"by the {self.judge} judge; the policy needs {self.threshold:.0%}"
        )
        if self.compared < self.min_turns:
            text += f" over at least {self.min_turns} turns"
        return text
