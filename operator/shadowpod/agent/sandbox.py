"""The sandbox: a candidate version answers turns it will never own.

The handler runs with the same ``Turn`` API as an owner's, through the owner's own
``take_turn``, so an agent needs no change. What differs is below the API:

- its outputs are captured, never journaled (there is no gateway here at all);
- its tool calls are answered from the calls the source recorded for that turn (the
  same tool with the same arguments, first unused one first); a call the recording
  does not have is refused, and so is a background process: no side effect leaves
  the sandbox. A refusal reaches the handler as the tool's failure.

A running instance answers a golden file in its sandbox on request
(``POST /v1/sandbox/replay``, ``shadowpod.agent.server``): an upgrade gate asks the
shadow itself. Offline (``shadowpod golden replay --image``), an agent process runs a
golden file in the sandbox when ``SHADOWPOD_SANDBOX_GOLDEN``
names one: it answers every turn of it and writes a ``SandboxReport`` (JSON) to
``SHADOWPOD_SANDBOX_REPORT``, then exits (0; 2 when it cannot read or write them).
What the handler does itself (a model call, say) is its own business: that is what
is being judged.
"""

from __future__ import annotations

import asyncio
import copy
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from pydantic import JsonValue

from shadowpod.agent.declaration import AgentDeclaration
from shadowpod.agent.owner import take_turn
from shadowpod.agent.processes import ProcessRegistry
from shadowpod.agent.tools import ToolSpec
from shadowpod.agent.turn_group import TurnGroup
from shadowpod.domain.entries import NewEntry
from shadowpod.domain.errors import ShadowpodError
from shadowpod.domain.state import SessionState
from shadowpod.gates.golden import GoldenFile
from shadowpod.gates.replay import (
    GoldenTurn,
    RecordedCall,
    SandboxAnswer,
    SandboxOutput,
    SandboxReport,
    golden_turns,
)

SANDBOX_INSTANCE = "sandbox"
MAX_GOLDEN_BYTES: Final = 64 * 1024 * 1024  # the largest golden file an instance replays


class SideEffectRefused(Exception):
    """The sandbox refused something that would have left it."""


class _RefusingProcesses(ProcessRegistry):
    def __init__(self, refused: list[str]) -> None:
        super().__init__(None)
        self._refused = refused

    async def spawn(self, name: str, command: Sequence[str]) -> int:
        self._refused.append(f"background process {name!r}")
        raise SideEffectRefused(f"the sandbox starts no background process ({name!r})")


def _recorded_tools(
    tools: Mapping[str, ToolSpec], recorded: Sequence[RecordedCall], refused: list[str]
) -> dict[str, ToolSpec]:
    unused = list(recorded)

    def answering(name: str) -> ToolSpec:
        async def answer(**args: JsonValue) -> JsonValue:
            call = next((c for c in unused if c.tool == name and c.args == args), None)
            if call is None or call.status is None:
                why = "not in the recording" if call is None else "its result was not recorded"
                refused.append(f"tool {name}({args}): {why}")
                raise SideEffectRefused(f"the sandbox does not run {name!r}: {why}")
            unused.remove(call)
            if call.status != "ok":
                raise RuntimeError(call.error or f"the recorded call ended {call.status}")
            return call.result

        return ToolSpec(name, answer, tools[name].idempotent)

    return {name: answering(name) for name in tools}


async def answer_in_sandbox(
    agent: AgentDeclaration, turn: GoldenTurn, state: SessionState
) -> SandboxAnswer:
    """``agent``'s answer to ``turn`` from ``state``; nothing leaves the sandbox."""
    captured: list[NewEntry] = []
    refused: list[str] = []

    async def capture(entries: Sequence[NewEntry]) -> list[int]:
        captured.extend(entries)  # never journaled
        return [0] * len(entries)

    sandboxed = copy.copy(agent)
    sandboxed.tools = _recorded_tools(agent.tools, turn.calls, refused)
    group = TurnGroup(state, state.epoch, capture)
    outputs = await take_turn(
        sandboxed,
        turn.inbound,
        group,
        epoch=state.epoch,
        instance=SANDBOX_INSTANCE,
        processes=_RefusingProcesses(refused),
    )
    return SandboxAnswer(
        turn=turn.seq,
        outputs=[
            SandboxOutput(kind=e.kind, payload=e.payload)
            for e in (*captured, *outputs)
            if e.kind != "ack"
        ],
        refused=refused,
    )


async def replay_golden(agent: AgentDeclaration, golden: GoldenFile) -> SandboxReport:
    answers = [await answer_in_sandbox(agent, turn, state) for turn, state in golden_turns(golden)]
    return SandboxReport(
        agent=agent.name,
        version=agent.version,
        nondeterministic=list(agent.nondeterministic_patterns),
        answers=answers,
    )


def sandbox_requested() -> bool:
    return bool(os.environ.get("SHADOWPOD_SANDBOX_GOLDEN"))


def run_sandbox(agent: AgentDeclaration) -> int:
    """This process answers the golden file in ``$SHADOWPOD_SANDBOX_GOLDEN``."""
    golden_path = Path(os.environ["SHADOWPOD_SANDBOX_GOLDEN"])
    report_path = os.environ.get("SHADOWPOD_SANDBOX_REPORT")
    if not report_path:
        print("error: SHADOWPOD_SANDBOX_REPORT must name the report file", file=sys.stderr)
        return 2
    try:
        golden = GoldenFile.read(golden_path)
    except ShadowpodError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = asyncio.run(replay_golden(agent, golden))
    try:
        Path(report_path).write_text(report.model_dump_json())
    except OSError as exc:
        print(f"error: cannot write the sandbox report {report_path}: {exc}", file=sys.stderr)
        return 2
    return 0
