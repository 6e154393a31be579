"""Shadow compare over the agent API: the engine's ``Validator`` for any runtime.

The shadow itself answers, in its sandbox: the same process, the same image, the
state it holds, nothing journaled, no side effect. Live turns: a compare window
opened on the shadow (``POST /v1/compare/window``) has it answer each live turn as it
follows the journal; its answers (``GET /v1/compare``) are judged against the
source's, read from the journal through the gateway. Golden sessions: the shadow
answers the file (``POST /v1/sandbox/replay``). No process is started for a
comparison.

Where an instance listens (``address_of``) and what a golden reference names
(``golden_text``: a file path on this machine, a ConfigMap key on a cluster) are the
runtime's to say.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import aiohttp

from shadowpod.client.agent import (
    AgentAPIError,
    compare_report,
    open_compare_window,
    persona_probe,
    persona_reanchor,
    sandbox_replay,
)
from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.entries import JournalEntry
from shadowpod.engine.ports import CompareWindowLost, ValidationUnavailable
from shadowpod.engine.record import ValidationSummary
from shadowpod.gates.answers import TurnPair
from shadowpod.gates.gate import build_judge, chat_model, evaluate, shared_embedder
from shadowpod.gates.golden import GoldenFile, GoldenInvalid
from shadowpod.gates.llm import JudgeUnavailable
from shadowpod.gates.persona import PersonaCheck, PersonaPolicy, Stage, judge_persona
from shadowpod.gates.policy import GatePolicy
from shadowpod.gates.replay import SandboxReport, live_pairs, pairs_of
from shadowpod.gates.semantic import SemanticUnavailable
from shadowpod.gates.verdicts import GateVerdict

PAGE: Final = 5000
WORST: Final = 5
SHOWN: Final = 160  # characters of each answer kept in the record
WINDOW_TIMEOUT: Final = aiohttp.ClientTimeout(total=10.0)
# How long the shadow may take to follow up to the window's last turn and answer it
# (it follows the live journal: milliseconds, unless its sandbox is slow).
ANSWERS_WAIT_S: Final = 60.0
ANSWERS_POLL_S: Final = 0.01

AddressOf = Callable[[str], Awaitable[str]]
GoldenText = Callable[[str], Awaitable[str]]


async def prepare_judge(gate: GatePolicy) -> None:
    """Load what ``gate``'s judge needs (the semantic judge's embedding model, seconds
    of CPU; one per process), so no migration waits for it: call it at start-up."""
    if gate.judge != "semantic":
        return
    try:
        # One text embedded too: the model's first call costs twice the next ones.
        await asyncio.to_thread(shared_embedder().embed, ["shadowpod"])
    except SemanticUnavailable as exc:
        raise ValidationUnavailable(f"the semantic judge cannot run: {exc}") from exc


class ShadowValidator:
    def __init__(
        self, gateway: GatewayClient, address_of: AddressOf, golden_text: GoldenText
    ) -> None:
        self.gateway = gateway
        self.address_of = address_of
        self.golden_text = golden_text
        self._http: aiohttp.ClientSession | None = None

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession()
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def prepare(self, gate: GatePolicy) -> None:
        await prepare_judge(gate)

    # --- the engine's Validator port --------------------------------------------------

    async def completed_turns(
        self, session: str, *, instance: str, after_seq: int, up_to: int | None = None
    ) -> tuple[int, int]:
        count, last, cursor = 0, after_seq, after_seq
        while True:
            entries, head = await self.gateway.journal(session, after=cursor, limit=PAGE)
            for entry in entries:
                turn = entry.payload.get("turn")
                if entry.kind == "ack" and isinstance(turn, int) and turn > after_seq:
                    count, last = count + 1, entry.seq
                    if count == up_to:
                        return count, last
            if not entries or entries[-1].seq >= head:
                return count, last
            cursor = entries[-1].seq

    async def open_window(
        self, session: str, *, instance: str, after_seq: int, turns: int | None = None
    ) -> int:
        base_url = await self.address_of(instance)
        try:
            return await open_compare_window(
                self.http, base_url, after_seq, turns=turns, timeout=WINDOW_TIMEOUT
            )
        except AgentAPIError as exc:
            raise ValidationUnavailable(
                f"the shadow {instance!r} cannot open a compare window: {exc}"
            ) from exc

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
        report, entries = await asyncio.gather(
            self._answers(instance, after_seq, to_seq), self._journal(session, after_seq, to_seq)
        )
        pairs = live_pairs(entries, report, after=after_seq, to=to_seq)
        summary = await self._judge(pairs, report, image, gate)
        return summary.model_copy(update={"from_seq": after_seq, "to_seq": to_seq})

    async def replay_golden(
        self, golden: str, image: str, *, instance: str, gate: GatePolicy
    ) -> ValidationSummary:
        try:
            text = await self.golden_text(golden)
            recorded = GoldenFile.loads(text, name=golden)
        except (GoldenInvalid, OSError) as exc:
            why = f"the golden session {golden} cannot be read: {exc}"
            raise ValidationUnavailable(why) from exc
        report = await self._replay(instance, text)
        return await self._judge(pairs_of(recorded, report), report, image, gate, golden=golden)

    async def persona(
        self,
        policy: PersonaPolicy,
        *,
        stage: Stage,
        instance: str,
        source: str,
        baseline: str | None = None,
    ) -> PersonaCheck:
        if baseline is None:
            baseline = await self._probe(source, policy.probe)
        reply = await self._probe(instance, policy.probe)
        gate = GatePolicy(judge=policy.judge, similarity=policy.similarity, tool_calls=False)
        try:
            judge = build_judge(gate)
            return await judge_persona(
                judge,
                stage=stage,
                instance=instance,
                probe=policy.probe,
                baseline=baseline,
                reply=reply,
            )
        except (SemanticUnavailable, ValueError) as exc:
            raise ValidationUnavailable(
                f"the persona's {policy.judge} judge cannot run: {exc}"
            ) from exc

    async def reanchor(self, instance: str) -> None:
        base_url = await self.address_of(instance)
        try:
            await persona_reanchor(self.http, base_url)
        except AgentAPIError as exc:
            raise ValidationUnavailable(f"{instance!r} could not re-anchor: {exc}") from exc

    # --- below ------------------------------------------------------------------------

    async def _probe(self, instance: str, message: str) -> str:
        base_url = await self.address_of(instance)
        try:
            return await persona_probe(self.http, base_url, message)
        except AgentAPIError as exc:
            raise ValidationUnavailable(
                f"{instance!r} could not answer the persona probe: {exc}"
            ) from exc

    async def _replay(self, instance: str, text: str) -> SandboxReport:
        base_url = await self.address_of(instance)
        try:
            return await sandbox_replay(self.http, base_url, text)
        except AgentAPIError as exc:
            raise ValidationUnavailable(
                f"the shadow {instance!r} could not answer in its sandbox: {exc}"
            ) from exc

    async def _answers(self, instance: str, after: int, to: int) -> SandboxReport:
        """The shadow's answers to the window's turns, once it has followed to ``to``."""
        base_url = await self.address_of(instance)
        deadline = time.monotonic() + ANSWERS_WAIT_S
        while True:
            try:
                return await compare_report(
                    self.http, base_url, after=after, to=to, timeout=WINDOW_TIMEOUT
                )
            except AgentAPIError as exc:
                if exc.error == "WindowLost":
                    raise CompareWindowLost(f"the shadow {instance!r}: {exc}") from exc
                if exc.error != "Pending" or time.monotonic() > deadline:
                    raise ValidationUnavailable(
                        f"the shadow {instance!r} did not give its answers: {exc}"
                    ) from exc
            await asyncio.sleep(ANSWERS_POLL_S)

    async def _journal(self, session: str, after: int, to: int) -> list[JournalEntry]:
        """The journal in (after, to]: the source's answers, as recorded."""
        entries: list[JournalEntry] = []
        cursor = after
        while cursor < to:
            page, _ = await self.gateway.journal(session, after=cursor, limit=PAGE)
            if not page:
                break
            entries += [e for e in page if e.seq <= to]
            cursor = page[-1].seq
        return entries

    async def _judge(
        self,
        pairs: Sequence[TurnPair],
        report: SandboxReport,
        image: str,
        gate: GatePolicy,
        *,
        golden: str | None = None,
    ) -> ValidationSummary:
        chat = None
        try:
            await self.before_judging(gate)
            chat = chat_model(gate) if gate.judge == "llm" else None
            judge = build_judge(gate, agent_patterns=report.nondeterministic, chat=chat)
            verdict = await evaluate(gate, judge, pairs)
        except (SemanticUnavailable, JudgeUnavailable, ValueError) as exc:
            raise ValidationUnavailable(f"the {gate.judge} judge cannot run: {exc}") from exc
        finally:
            if chat is not None:
                await chat.close()
        await self.keep(verdict, golden=golden)
        return summary_of(verdict, image, golden=golden)

    # --- what a runtime may add -------------------------------------------------------

    async def before_judging(self, gate: GatePolicy) -> None:
        """Called before each verdict: provide what the judge needs (the operator reads
        the LLM judge's key from its Secret here). Raise ``ValidationUnavailable``."""

    async def keep(self, verdict: GateVerdict, *, golden: str | None) -> None:
        """Called with every verdict, every turn's answers in it, before the summary
        goes to the engine (the operator keeps them for ``kubectl shadowpod diff``)."""


def summary_of(verdict: GateVerdict, image: str, *, golden: str | None) -> ValidationSummary:
    """What the record keeps of a verdict: the counts and the worst disagreements."""
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
