"""Shadow compare on a cluster: the shared ``ShadowValidator`` with what only the
operator knows — the shadow pod's address, golden sessions in ConfigMaps, the LLM
judge's key in a Secret — and every compared turn's answers kept in the migration's
answers ConfigMap (``shadowpod.kube.answers``) for ``kubectl shadowpod diff``.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from shadowpod.engine.ports import ValidationUnavailable
from shadowpod.gates.gate import shared_embedder
from shadowpod.gates.policy import GatePolicy
from shadowpod.gates.verdicts import GateVerdict
from shadowpod.kube import answers, validation
from shadowpod.kube.context import OperatorContext
from shadowpod.kube.models.v1alpha1 import ValidationPolicy
from shadowpod.validator import ShadowValidator

_warming: threading.Thread | None = None


def warm_semantic_judge() -> None:
    """Load the semantic judge's model in the background, once per operator process:
    called when a session or a migration asks for the semantic judge, so that a gate
    adds the turns it waits for, not the model's load (~7 s; seconds more on a busy
    machine). A model that cannot load says so when the judge needs it."""
    global _warming
    if _warming is not None:
        return

    def load() -> None:
        with contextlib.suppress(Exception):
            # One text embedded too: the model's first call costs twice the next ones.
            shared_embedder().embed(["shadowpod"])

    _warming = threading.Thread(target=load, name="semantic-judge-load", daemon=True)
    _warming.start()


class ClusterValidator(ShadowValidator):
    """``ShadowValidator`` for the pods of one migration (``migration``, its body)."""

    def __init__(
        self,
        ctx: OperatorContext,
        migration: dict[str, Any],
        *,
        session: str,
        source_image: str,
        target_image: str,
        policy: ValidationPolicy | None,
    ) -> None:
        namespace = migration["metadata"]["namespace"]

        async def address_of(instance: str) -> str:
            return await validation.agent_address(ctx, namespace, instance)

        async def golden_text(golden: str) -> str:
            try:
                return await validation.golden_text(ctx, namespace, golden)
            except validation.GoldenUnavailable as exc:
                raise ValidationUnavailable(str(exc)) from None

        super().__init__(ctx.admin, address_of, golden_text)
        self.ctx = ctx
        self.namespace = namespace
        self.migration = migration
        self.policy = policy
        self.base = answers.Answers(
            migration=migration["metadata"]["name"],
            session=session,
            source_image=source_image,
            target_image=target_image,
        )

    async def before_judging(self, gate: GatePolicy) -> None:
        """The LLM judge's key, from the Secret the policy names."""
        if gate.judge != "llm" or self.policy is None:
            return
        try:
            await validation.provide_judge_key(self.ctx, self.namespace, self.policy)
        except validation.InvalidValidationPolicy as exc:
            raise ValidationUnavailable(str(exc)) from None

    async def keep(self, verdict: GateVerdict, *, golden: str | None) -> None:
        """Every turn's verdict (both answers, the score and the reason) in the
        answers ConfigMap, for ``kubectl shadowpod diff``."""
        found, cut = answers.comparison(
            verdict.turns,
            judge=verdict.judge,
            passed=verdict.passed,
            threshold=verdict.threshold,
            golden=golden,
        )
        kept = await answers.load(self.ctx.api, self.namespace, self.base.migration)
        others = [] if kept is None else [c for c in kept.comparisons if c.golden != golden]
        document = self.base.model_copy(
            update={
                "comparisons": [*others, found],
                "cut": cut + (0 if kept is None else kept.cut),
            }
        )
        await answers.save(self.ctx.api, self.migration, document)
