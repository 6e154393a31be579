"""Small agents for the agent runtime tests, run as real processes.

    python tests/agent/agents.py surfaces    # or: sidefx

``surfaces`` touches every state surface from a turn, one command per message:

- ``remember <key> <value>`` (memory), ``learn <fact id> <text>`` (facts), ``count``
  (the agent's own state);
- ``schedule <id> <seconds>`` sets a schedule;
- ``spawn <name> obedient|stubborn`` starts a background process that writes
  ``$PROBE_DIR/<name>.up`` once it is set up; a stubborn one ignores SIGTERM;
- ``echo <text>`` calls the idempotent ``echo`` tool;
- ``boom`` raises;
- anything else is answered ``heard: <content>``.

``sidefx`` has two tools with a side effect, each appending a line to
``$SIDEFX_LOG`` every time it runs and then taking ``$SIDEFX_TOOL_S`` seconds:
``book <what>`` calls ``book`` (not idempotent), ``lookup <what>`` calls ``lookup``
(idempotent). With ``SIDEFX_CHANGED_MIND=1`` it calls no tool at all and says so, as
an LLM-driven agent redoing a turn may well decide.

Every reply carries ``instance`` and ``epoch`` in its meta.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from pydantic import JsonValue

from shadowpod.agent import Agent, Turn

STUBBORN = (
    "import pathlib, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "pathlib.Path(sys.argv[1]).write_text('up')\n"
    "time.sleep(600)\n"
)
OBEDIENT = (
    "import pathlib, sys, time\npathlib.Path(sys.argv[1]).write_text('up')\ntime.sleep(600)\n"
)


def _meta(turn: Turn) -> dict[str, JsonValue]:
    return {"instance": turn.instance, "epoch": turn.epoch}


def surfaces() -> Agent:
    agent = Agent("surfaces", version="1")
    probe_dir = Path(os.environ.get("PROBE_DIR", "."))

    @agent.tool(idempotent=True)
    async def echo(text: str) -> JsonValue:
        return {"echoed": text}

    @agent.on_message
    async def handle(turn: Turn) -> None:
        command, _, rest = turn.content.strip().partition(" ")
        if command == "remember":
            key, _, value = rest.partition(" ")
            turn.remember(key, value)
            await turn.reply(f"remembered {key}", **_meta(turn))
        elif command == "learn":
            fact_id, _, text = rest.partition(" ")
            turn.learn(fact_id, text)
            await turn.reply(f"learned {fact_id}", **_meta(turn))
        elif command == "count":
            count = turn.values.get("count", 0)
            assert isinstance(count, int)
            turn.values["count"] = count + 1
            await turn.reply(f"count {count + 1}", **_meta(turn))
        elif command == "schedule":
            schedule_id, _, every = rest.partition(" ")
            turn.schedule(schedule_id, every_s=float(every), content=f"tick {schedule_id}")
            await turn.reply(f"scheduled {schedule_id}", **_meta(turn))
        elif command == "spawn":
            name, _, kind = rest.partition(" ")
            code = STUBBORN if kind == "stubborn" else OBEDIENT
            marker = probe_dir / f"{name}.up"
            pid = await turn.spawn(name, [sys.executable, "-c", code, str(marker)])
            await turn.reply(f"spawned {name} {pid}", pid=pid, **_meta(turn))
        elif command == "echo":
            result = await turn.tool("echo", {"text": rest})
            await turn.reply(f"tool said {result}", **_meta(turn))
        elif command == "boom":
            raise RuntimeError("boom as requested")
        else:
            await turn.reply(f"heard: {turn.content}", **_meta(turn))

    return agent


def sidefx() -> Agent:
    agent = Agent("sidefx", version="1")
    log = Path(os.environ.get("SIDEFX_LOG", "sidefx.log"))
    takes_s = float(os.environ.get("SIDEFX_TOOL_S", "0"))
    changed_mind = os.environ.get("SIDEFX_CHANGED_MIND") == "1"

    def record(line: str) -> None:
        with log.open("a") as handle:
            handle.write(line + "\n")

    async def side_effect(tool: str, what: str) -> JsonValue:
        record(f"{tool} {what} pid={os.getpid()}")
        await asyncio.sleep(takes_s)
        return {"done": f"{tool} {what}"}

    @agent.tool(idempotent=False)
    async def book(what: str) -> JsonValue:
        return await side_effect("book", what)

    @agent.tool(idempotent=True)
    async def lookup(what: str) -> JsonValue:
        return await side_effect("lookup", what)

    @agent.on_message
    async def handle(turn: Turn) -> None:
        command, _, rest = turn.content.strip().partition(" ")
        if command in ("book", "lookup") and changed_mind:
            await turn.reply(f"on second thought, no {command}", **_meta(turn))
        elif command in ("book", "lookup"):
            result = await turn.tool(command, {"what": rest})
            await turn.reply(f"{command} done: {result}", **_meta(turn))
        else:
            await turn.reply(f"heard: {turn.content}", **_meta(turn))

    return agent


AGENTS = {"surfaces": surfaces, "sidefx": sidefx}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in AGENTS:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(AGENTS)}")
    AGENTS[sys.argv[1]]().run()
