"""The upgrade gate on Kubernetes: which validation policy a migration runs, that policy
as the engine's, what is wrong in it that only the operator can see, and what the
shared validator needs from the cluster — where a shadow pod's agent listens, a golden
session's text from its ConfigMap, the LLM judge's key from its Secret.

- A migration runs its own ``spec.validation``; without one, the session's
  ``spec.migration.validation`` when the image changes (a move to another node keeps
  the image: nothing new to judge).
- The API server checks the policy's shape; the operator checks the rest (a pattern
  that does not compile, the judge's Secret): a problem is ``InvalidValidationPolicy``,
  said as a condition and a Warning event, and nothing else happens.
- The judge's key is read from its Secret when a comparison needs it and handed to the
  judge through this process' environment, under a name of its own: the policy, the
  record and the status only ever name the Secret.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from typing import Final, Literal

from pydantic import ValidationError

from shadowpod.domain.errors import ShadowpodError
from shadowpod.engine.ports import RuntimeUnavailable
from shadowpod.engine.record import ValidationPolicy as EngineValidation
from shadowpod.gates.persona import DEFAULT_PROBE
from shadowpod.gates.persona import OnDrift as EngineOnDrift
from shadowpod.gates.persona import PersonaPolicy as EnginePersona
from shadowpod.gates.policy import GatePolicy as EngineGate
from shadowpod.gates.policy import JudgeKind, LLMEndpoint
from shadowpod.kube import names
from shadowpod.kube.api import namespaced
from shadowpod.kube.context import OperatorContext
from shadowpod.kube.models.v1alpha1 import (
    AgentMigration,
    AgentSession,
    Judge,
    OnDrift,
    PersonaJudge,
    PersonaPolicy,
    SecretKeyReference,
    ValidationPolicy,
)

JUDGES: Final[dict[Judge, JudgeKind]] = {
    Judge.EXACT: "exact",
    Judge.NORMALISED: "normalised",
    Judge.TOOL_CALLS: "tool_calls",
    Judge.SEMANTIC: "semantic",
    Judge.LLM: "llm",
}
PERSONA_JUDGES: Final[dict[PersonaJudge, Literal["exact", "normalised", "semantic"]]] = {
    PersonaJudge.EXACT: "exact",
    PersonaJudge.NORMALISED: "normalised",
    PersonaJudge.SEMANTIC: "semantic",
}
ON_DRIFT: Final[dict[OnDrift, EngineOnDrift]] = {
    OnDrift.WARN: "warn",
    OnDrift.REANCHOR: "reanchor",
    OnDrift.ROLLBACK: "rollback",
}
KEY_ENV_PREFIX: Final = "SHADOWPOD_JUDGE_KEY_"


class InvalidValidationPolicy(ShadowpodError):
    """A validation policy the API server admitted but the gate cannot use."""

    reason = "InvalidValidationPolicy"


class GoldenUnavailable(ShadowpodError):
    """A golden session the policy names cannot be read (no ConfigMap, no key)."""

    reason = "ValidationUnavailable"


def policy_of(
    session: AgentSession, migration: AgentMigration, *, image_changes: bool
) -> ValidationPolicy | None:
    """The validation ``migration`` runs: its own, else the session's on an image change."""
    if migration.spec.validation is not None:
        return migration.spec.validation
    return session.spec.migration.validation if image_changes else None


def persona_of(
    session: AgentSession, migration: AgentMigration, *, image_changes: bool
) -> PersonaPolicy | None:
    """The persona check ``migration`` runs: its own, else the session's on an image change."""
    if migration.spec.persona is not None:
        return migration.spec.persona
    return session.spec.migration.persona if image_changes else None


def engine_persona(policy: PersonaPolicy) -> EnginePersona:
    return EnginePersona(
        probe=policy.probe or DEFAULT_PROBE,
        judge=PERSONA_JUDGES[policy.judge],
        similarity=policy.similarity_percent / 100,
        on_drift=ON_DRIFT[policy.on_drift],
    )


def key_env(namespace: str, ref: SecretKeyReference) -> str:
    """The environment variable the judge reads the key from (never the key itself)."""
    digest = hashlib.sha256(f"{namespace}/{ref.name}/{ref.key}".encode()).hexdigest()[:16]
    return f"{KEY_ENV_PREFIX}{digest.upper()}"


def golden_name(config_map: str, key: str) -> str:
    return f"{config_map}/{key}"


def engine_policy(policy: ValidationPolicy, namespace: str, *, field: str) -> EngineValidation:
    """``policy`` as the engine runs it; ``InvalidValidationPolicy`` naming the field."""
    gate = policy.gate
    llm = None
    if gate.llm is not None:
        ref = gate.llm.api_key_secret_ref
        llm = LLMEndpoint(
            url=gate.llm.url,
            model=gate.llm.model,
            api_key_env=None if ref is None else key_env(namespace, ref),
            timeout_s=gate.llm.timeout_seconds,
        )
    try:
        engine_gate = EngineGate(
            judge=JUDGES[gate.judge],
            agreement=gate.agreement_percent / 100,
            similarity=gate.similarity_percent / 100,
            tool_calls=gate.tool_calls,
            min_turns=gate.min_turns,
            nondeterministic=list(gate.nondeterministic),
            llm=llm,
        )
    except ValidationError as exc:
        problems = "; ".join(_said(error) for error in exc.errors())
        raise InvalidValidationPolicy(f"{field}.gate is invalid: {problems}") from None
    return EngineValidation(
        turns=policy.turns,
        timeout_s=float(policy.timeout_seconds),
        gate=engine_gate,
        goldens=[golden_name(g.config_map, g.key) for g in policy.goldens],
    )


def _said(error: object) -> str:
    message = str(error.get("msg", "")) if isinstance(error, dict) else str(error)
    message = message.removeprefix("Value error, ")
    if "nondeterministic" in message or "pattern" in message:
        return f"{message}: correct nondeterministic (Python regular expressions)"
    return message


async def policy_problems(
    ctx: OperatorContext, namespace: str, policy: ValidationPolicy, *, field: str
) -> list[str]:
    """What is wrong in ``policy`` that the API server cannot see, as messages."""
    found = []
    try:
        engine_policy(policy, namespace, field=field)
    except InvalidValidationPolicy as exc:
        found.append(str(exc))
    llm = policy.gate.llm
    if llm is not None and llm.api_key_secret_ref is not None:
        try:
            await judge_key(ctx, namespace, llm.api_key_secret_ref, field=field)
        except InvalidValidationPolicy as exc:
            found.append(str(exc))
    return found


async def judge_key(
    ctx: OperatorContext, namespace: str, ref: SecretKeyReference, *, field: str
) -> str:
    """The LLM judge's key, from its Secret."""
    secret = await ctx.api.get(namespaced("secrets", namespace, ref.name))
    where_ = f"{field}.gate.llm.apiKeySecretRef"
    if secret is None:
        raise InvalidValidationPolicy(
            f"{where_} names Secret {ref.name!r}, which does not exist in namespace"
            f" {namespace!r}: create it"
        )
    raw = (secret.get("data") or {}).get(ref.key)
    if raw is None:
        raise InvalidValidationPolicy(
            f"{where_} names key {ref.key!r} of Secret {ref.name!r}, which has no such key:"
            " add it or correct the key"
        )
    try:
        return base64.b64decode(raw).decode().strip()
    except (binascii.Error, UnicodeDecodeError):
        raise InvalidValidationPolicy(
            f"{where_}: key {ref.key!r} of Secret {ref.name!r} is not text"
        ) from None


async def provide_judge_key(ctx: OperatorContext, namespace: str, policy: ValidationPolicy) -> None:
    """Put the LLM judge's key where the judge reads it (this process' environment)."""
    llm = policy.gate.llm
    if llm is None or llm.api_key_secret_ref is None:
        return
    ref = llm.api_key_secret_ref
    os.environ[key_env(namespace, ref)] = await judge_key(ctx, namespace, ref, field="validation")


async def golden_text(ctx: OperatorContext, namespace: str, golden: str) -> str:
    """The text of the golden session ``configMap/key`` (``GoldenUnavailable`` if none)."""
    config_map, _, key = golden.partition("/")
    found = await ctx.api.get(namespaced("configmaps", namespace, config_map))
    if found is None:
        raise GoldenUnavailable(
            f"golden session {golden}: ConfigMap {config_map!r} does not exist in namespace"
            f" {namespace!r}: create it (kubectl create configmap {config_map}"
            f" --from-file={key}=GOLDEN.jsonl) or remove it from validation.goldens"
        )
    if key in (found.get("data") or {}):
        return str(found["data"][key])
    if key in (found.get("binaryData") or {}):
        return base64.b64decode(found["binaryData"][key]).decode(errors="replace")
    keys = sorted({*(found.get("data") or {}), *(found.get("binaryData") or {})})
    raise GoldenUnavailable(
        f"golden session {golden}: ConfigMap {config_map!r} has no key {key!r}"
        f" (it has {', '.join(keys) or 'none'}): correct validation.goldens or add the key"
    )


async def agent_address(ctx: OperatorContext, namespace: str, instance: str) -> str:
    """Where the agent of instance ``instance`` (its pod) listens, as ``status`` reaches it."""
    pod = await ctx.api.get(namespaced("pods", namespace, instance))
    ip = None if pod is None else (pod.get("status") or {}).get("podIP")
    if not ip:
        raise RuntimeUnavailable(f"pod {instance} has no IP address yet: its agent cannot be asked")
    return f"http://{ip}:{names.AGENT_PORT}"
