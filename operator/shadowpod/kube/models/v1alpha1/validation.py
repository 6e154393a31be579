"""The upgrade gate a migration runs before its fence (``validation``), and what it found.

Thresholds are integer percents with the unit in the name (``agreementPercent: 90``),
as durations are integer seconds (``timeoutSeconds``): the Kubernetes API conventions
keep floating-point numbers out of specs, and every client reads an integer the same
way. The LLM judge's API key is a Secret reference, never a value: a policy is read by
anyone who may read the session.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Final, Literal

from pydantic import ConfigDict, Field, StringConstraints

from shadowpod.kube.models.base import (
    ATOMIC_LIST,
    DEFAULT_OBJECT,
    Bool,
    Count,
    Int64,
    Integer,
    KubeModel,
    Rule,
    validations,
)
from shadowpod.kube.models.core import DataKey, ObjectName

Pattern = Annotated[str, StringConstraints(min_length=1, max_length=256)]
# How many disagreements the status names; the rest are in the answers ConfigMap.
WORST_SHOWN: Final = 5


class Judge(StrEnum):
    """How a candidate's answer is compared with the source's (docs/upgrade-gates.md)."""

    EXACT = "Exact"
    NORMALISED = "Normalised"
    TOOL_CALLS = "ToolCalls"
    SEMANTIC = "Semantic"
    LLM = "LLM"


class SecretKeyReference(KubeModel):
    """One key of a Secret in the session's namespace."""

    name: ObjectName = Field(description="The Secret's name.")
    key: DataKey = Field(description="The key within the Secret.")


class LLMJudgeEndpoint(KubeModel):
    """An OpenAI-compatible chat completions endpoint for the LLM judge."""

    url: str = Field(
        min_length=1,
        max_length=2048,
        pattern=r"^https?://\S+$",
        description="Base URL; the judge posts to {url}/chat/completions.",
    )
    model: str = Field(min_length=1, max_length=256, description="The model to ask.")
    api_key_secret_ref: SecretKeyReference | None = Field(
        default=None,
        description="The Secret key holding the endpoint's API key (read by the operator;"
        " never written in the policy). Unset: the endpoint needs no key.",
    )
    timeout_seconds: Integer = Field(
        default=60, ge=1, le=600, description="How long one judgement may take."
    )


class GatePolicy(KubeModel):
    """Which judge compares the answers, and how many must agree."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            Rule(
                "self.judge != 'LLM' || has(self.llm)",
                "judge LLM needs llm (url, model and apiKeySecretRef): add it, or choose"
                " another judge",
                field_path=".llm",
            ),
        )
    )

    judge: Judge = Field(
        default=Judge.SEMANTIC, description="Exact, Normalised, ToolCalls, Semantic or LLM."
    )
    agreement_percent: Integer = Field(
        default=90, ge=0, le=100, description="The share of compared turns that must agree."
    )
    similarity_percent: Integer = Field(
        default=85,
        ge=0,
        le=100,
        description="Semantic: the cosine similarity (in percent) a turn needs to agree.",
    )
    tool_calls: Bool = Field(
        default=True, description="Semantic and LLM: the tool calls must be the same too."
    )
    min_turns: Integer = Field(
        default=1, ge=0, le=1000, description="Comparing fewer turns than this fails the gate."
    )
    nondeterministic: list[Pattern] = Field(
        default_factory=list,
        max_length=32,
        json_schema_extra=ATOMIC_LIST,
        description="Regular expressions (Python syntax) masked before comparing, besides"
        " the agent's own declarations: order numbers, receipts.",
    )
    llm: LLMJudgeEndpoint | None = Field(default=None, description="Judge LLM only.")


class GoldenReference(KubeModel):
    """A golden session file (``shadowpod golden record``) kept in a ConfigMap key."""

    config_map: ObjectName = Field(description="The ConfigMap, in the session's namespace.")
    key: DataKey = Field(description="Its key holding the golden file (JSON Lines).")


class ValidationPolicy(KubeModel):
    """The upgrade gate: before the fence, the target answers live turns (and golden
    sessions) in a sandbox, and a judge compares its answers with the source's. A
    verdict that fails rolls the migration back (``ValidationFailed``); a comparison
    that cannot be made too (``ValidationUnavailable``): the gate never guesses."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            Rule(
                "self.turns > 0 || (has(self.goldens) && size(self.goldens) > 0)",
                "validation compares nothing with turns 0 and no goldens: set turns, name"
                " goldens, or remove validation",
                field_path=".turns",
            ),
        )
    )

    turns: Integer = Field(
        default=5, ge=0, le=1000, description="Live turns to compare (0: the goldens only)."
    )
    timeout_seconds: Integer = Field(
        default=60,
        ge=1,
        le=3600,
        description="How long to wait for those turns; then what came is judged.",
    )
    gate: GatePolicy = Field(default_factory=GatePolicy, json_schema_extra=DEFAULT_OBJECT)
    goldens: list[GoldenReference] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra=ATOMIC_LIST,
        description="Golden sessions the target must pass too, replayed before the live turns.",
    )


class PersonaJudge(StrEnum):
    EXACT = "Exact"
    NORMALISED = "Normalised"
    SEMANTIC = "Semantic"


class OnDrift(StrEnum):
    """What a persona drift does: Warn (kept in the status), Reanchor (the agent's
    re-anchor hook is called with the session's identity, then probed again), Rollback
    (before the fence: the migration rolls back with PersonaDrift; after it, a warning)."""

    WARN = "Warn"
    REANCHOR = "Reanchor"
    ROLLBACK = "Rollback"


class PersonaPolicy(KubeModel):
    """The persona check: the shadow after its restore, and the new owner after its
    promotion, answer a self-description probe; a judge compares each answer with the
    source's answer to the same probe (spec.identity is who the agent should be)."""

    probe: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="What the agent is asked; unset: its name and its principles.",
    )
    judge: PersonaJudge = Field(
        default=PersonaJudge.SEMANTIC, description="Exact, Normalised or Semantic."
    )
    similarity_percent: Integer = Field(
        default=85, ge=0, le=100, description="Semantic: the similarity an answer needs."
    )
    on_drift: OnDrift = Field(default=OnDrift.WARN, description="Warn, Reanchor or Rollback.")


# --- what it found (the AgentMigration's status) ---------------------------------------


class Disagreement(KubeModel):
    """A turn the judge found in disagreement, by reference: both answers are in the
    answers ConfigMap (``kubectl shadowpod diff``)."""

    seq: Int64 = Field(
        description="The seq of the turn's inbound message (in the journal, or in the golden)."
    )
    golden: str | None = Field(
        default=None, max_length=512, description="configMap/key, when a golden turn."
    )
    score_percent: Integer = Field(ge=0, le=100, description="The judge's score (100: the same).")
    reason: str = Field(max_length=512, description="Why the judge disagreed.")


class GoldenVerdict(KubeModel):
    """One golden session's verdict."""

    golden: str = Field(max_length=512, description="configMap/key.")
    compared: Count
    agreed: Count
    passed: Bool


class ValidationStatus(KubeModel):
    """The upgrade gate's verdict: small on purpose, the answers are in ``answers``."""

    judge: str = Field(max_length=32)
    compared: Count = Field(default=0, description="Live turns compared.")
    agreed: Count = Field(
        default=0, description="Of those, the turns the judge found in agreement."
    )
    agreement_percent: Integer = Field(
        default=0, ge=0, le=100, description="agreed / compared, rounded down."
    )
    threshold_percent: Integer = Field(ge=0, le=100, description="What the policy needs.")
    passed: Bool = Field(description="Every golden and the live turns passed.")
    from_seq: Int64 | None = Field(
        default=None, description="Turns whose inbound came after this seq were compared."
    )
    to_seq: Int64 | None = None
    worst: list[Disagreement] = Field(
        default_factory=list,
        max_length=WORST_SHOWN,
        json_schema_extra=ATOMIC_LIST,
        description="The worst disagreements, lowest score first.",
    )
    goldens: list[GoldenVerdict] = Field(
        default_factory=list, max_length=16, json_schema_extra=ATOMIC_LIST
    )
    answers: ObjectName | None = Field(
        default=None,
        description="The ConfigMap with every compared turn's answers, old and new.",
    )
    message: str | None = Field(default=None, max_length=2048)


class PersonaStatus(KubeModel):
    """One persona probe: after the restore (the shadow) or after the promotion."""

    stage: Literal["restore", "promotion"]
    instance: str = Field(max_length=253)
    drifted: Bool
    score_percent: Integer = Field(ge=0, le=100)
    reason: str = Field(max_length=512)
    action: str | None = Field(
        default=None, max_length=64, description="warned, reanchored or rolled back."
    )
