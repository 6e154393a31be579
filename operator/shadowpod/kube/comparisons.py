"""Shadow compare on a cluster: the shared ``ShadowValidator`` with what only the
operator knows — the shadow pod's address, golden sessions in ConfigMaps, the LLM
judge's key in a Secret — and every compared turn's answers kept in the migration's
answers ConfigMap (``shadowpod.kube.answers``) for ``kubectl shadowpod diff``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

from shadowpod.client.validation import SHOWN, WORST, ShadowValidator
from shadowpod.engine.ports import ValidationUnavailable
from shadowpod.engine.record import ValidationSummary
from shadowpod.gates.answers import TurnPair
from shadowpod.gates.gate import build_judge, chat_model, evaluate, shared_embedder
from shadowpod.gates.llm import JudgeUnavailable
from shadowpod.gates.policy import GatePolicy
from shadowpod.gates.replay import SandboxReport
from shadowpod.gates.semantic import SemanticUnavailable
from shadowpod.gates.verdicts import GateVerdict
from shadowpod.kube import answers, validation
from shadowpod.kube.context import OperatorContext
from shadowpod.kube.models.v1alpha1 import ValidationPolicy

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

    async def _judge(
        self,
        pairs: Sequence[TurnPair],
        report: SandboxReport,
        image: str,
        gate: GatePolicy,
        *,
        golden: str | None = None,
    ) -> ValidationSummary:
        """As ``ShadowValidator``'s, keeping every turn's verdict (both answers, the
        score and the reason) in the answers ConfigMap before the verdict is returned."""
        verdict = await self._verdict(pairs, report, gate)
        await self._keep(verdict, golden=golden)
        return ValidationSummary(
            judge=verdict.judge,
            compared=verdict.compared,
            agreed=verdict.agreed,
            agreement=verdict.agreement,
            threshold=verdict.threshold,
            passed=verdict.passed,
            golden=golden,
            worst=[
                f"turn {v.turn} (score {v.score:.2f}): {v.reason}; source said "
                f"{v.expected[:SHOWN]!r}, {image} said {v.got[:SHOWN]!r}"
                for v in verdict.worst(WORST)
            ],
            message=f"{image} {verdict.summary()}"
            + (f" on the golden session {golden}" if golden else " on live turns"),
        )

    async def _verdict(
        self, pairs: Sequence[TurnPair], report: SandboxReport, gate: GatePolicy
    ) -> GateVerdict:
        chat = None
        try:
            if gate.judge == "llm":
                await self._provide_key()
                chat = chat_model(gate)
            judge = build_judge(gate, agent_patterns=report.nondeterministic, chat=chat)
            return await evaluate(gate, judge, pairs)
        except (SemanticUnavailable, JudgeUnavailable, ValueError) as exc:
            raise ValidationUnavailable(f"the {gate.judge} judge cannot run: {exc}") from exc
        finally:
            if chat is not None:
                await chat.close()

    async def _provide_key(self) -> None:
        if self.policy is None:
            return
        try:
            await validation.provide_judge_key(self.ctx, self.namespace, self.policy)
        except validation.InvalidValidationPolicy as exc:
            raise ValidationUnavailable(str(exc)) from None

    async def _keep(self, verdict: GateVerdict, *, golden: str | None) -> None:
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
