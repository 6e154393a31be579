"""Shadow compare on this machine: the engine's ``Validator`` over the gateway's read
API and a sandbox process of the target image.

The live turns the source answered since the window opened are cut from the journal
(the state each started from comes with them, from the migration's snapshot), the
target image answers them in a sandbox process — the same image and the same state as
the shadow, nothing journaled, no side effect — and the gate's judge compares. The
source's serving path is not touched: the comparison reads the journal only.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Final

from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.errors import ShadowpodError
from shadowpod.engine.record import ValidationSummary
from shadowpod.gates.gate import build_judge, chat_model, evaluate
from shadowpod.gates.golden import GoldenFile, GoldenInvalid
from shadowpod.gates.llm import JudgeUnavailable
from shadowpod.gates.policy import GatePolicy
from shadowpod.gates.replay import SandboxReport, pairs_of
from shadowpod.gates.semantic import SemanticUnavailable
from shadowpod.local.golden import record_golden, replay_in_sandbox
from shadowpod.local.images import ImageMap

PAGE: Final = 5000


class ValidationUnavailable(ShadowpodError):
    """The comparison could not be made (the judge's model or endpoint, a policy the
    judge cannot use): the migration rolls back saying so, it does not guess."""

    reason = "ValidationUnavailable"


WORST: Final = 5
SHOWN: Final = 160  # characters of each answer kept in the record


class LocalValidator:
    def __init__(self, client: GatewayClient, images: ImageMap) -> None:
        self.client = client
        self.images = images

    async def completed_turns(self, session: str, *, after_seq: int) -> tuple[int, int]:
        count, last, cursor = 0, after_seq, after_seq
        while True:
            entries, head = await self.client.journal(session, after=cursor, limit=PAGE)
            for entry in entries:
                turn = entry.payload.get("turn")
                if entry.kind == "ack" and isinstance(turn, int) and turn > after_seq:
                    count, last = count + 1, entry.seq
            if not entries or entries[-1].seq >= head:
                return count, last
            cursor = entries[-1].seq

    async def replay_golden(
        self, golden: str, image: str, *, gate: GatePolicy
    ) -> ValidationSummary:
        path = Path(golden)
        try:
            recorded = GoldenFile.read(path)
        except GoldenInvalid as exc:
            raise ValidationUnavailable(str(exc)) from exc
        report = await replay_in_sandbox(self.images.resolve(image), path)
        return await self._judge(recorded, report, image, gate, golden=golden)

    async def compare(
        self, session: str, image: str, *, after_seq: int, to_seq: int, gate: GatePolicy
    ) -> ValidationSummary:
        golden = await record_golden(
            self.client, session, from_seq=after_seq + 1, to_seq=to_seq, note="shadow compare"
        )
        with tempfile.TemporaryDirectory(prefix="shadowpod-compare-") as workdir:
            path = Path(workdir) / "live.jsonl"
            golden.write(path)
            report = await replay_in_sandbox(self.images.resolve(image), path)
        summary = await self._judge(golden, report, image, gate)
        return summary.model_copy(update={"from_seq": after_seq, "to_seq": to_seq})

    async def _judge(
        self,
        recorded: GoldenFile,
        report: SandboxReport,
        image: str,
        gate: GatePolicy,
        *,
        golden: str | None = None,
    ) -> ValidationSummary:
        chat = None
        try:
            chat = chat_model(gate) if gate.judge == "llm" else None
            judge = build_judge(gate, agent_patterns=report.nondeterministic, chat=chat)
            verdict = await evaluate(gate, judge, pairs_of(recorded, report))
        except (SemanticUnavailable, JudgeUnavailable, ValueError) as exc:
            raise ValidationUnavailable(f"the {gate.judge} judge cannot run: {exc}") from exc
        finally:
            if chat is not None:
                await chat.close()
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
