"""Small agents for the agent runtime tests, run as real processes.

    python tests/agent/agents.py surfaces    # or: surfaces2, sidefx

``surfaces`` touches every state surface from a turn, one command per message:

- ``remember <key> <value>`` (memory), ``learn <fact id> <text>`` (facts), ``count``
  (the agent's own state);
- ``schedule <id> <seconds>`` sets a schedule;
- ``spawn <name> obedient|stubborn|tree|leaver`` starts a background process that
  writes ``$PROBE_DIR/<name>.up`` once it is set up; a stubborn one ignores SIGTERM;
  a tree one starts a child of its own in another process group and writes ``up
  <its pid>``; a leaver starts a child in its own group, writes ``up <its pid>`` and
  exits;
- ``echo <text>`` calls the idempotent ``echo`` tool;
- ``boom`` raises;
- ``grow <key> <n>`` keeps ``n`` characters (quotes, backslashes and non-ASCII among
  them) as one value of the agent's state; ``sizes`` answers the length of each;
- ``bulk <k> <n>`` remembers ``k`` values of ``n`` characters in one turn;
- ``shout <n>`` answers with ``n`` characters;
- ``say <text>`` keeps the conversation as one growing list, the natural layout
  (``values["messages"] = [*old, new]``); ``note <text>`` appends to ``notes`` with
  ``turn.append``;
- ``poison`` marks the agent's state as one ``surfaces2`` cannot migrate;
- anything else is answered ``heard: <content>``.

``surfaces2`` is the same agent with state schema 2: it reads schema 1 through a
migration that copies the values (and refuses a poisoned state).

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
from collections.abc import Mapping
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
SLEEPER = "import time\ntime.sleep(600)\n"
TREE = (
    "import pathlib, subprocess, sys, time\n"
    f"child = subprocess.Popen([sys.executable, '-c', {SLEEPER!r}], start_new_session=True)\n"
    "pathlib.Path(sys.argv[1]).write_text(f'up {child.pid}')\n"
    "time.sleep(600)\n"
)
LEAVER = (
    "import pathlib, subprocess, sys\n"
    f"child = subprocess.Popen([sys.executable, '-c', {SLEEPER!r}])\n"
    "pathlib.Path(sys.argv[1]).write_text(f'up {child.pid}')\n"
)
CODE = {"obedient": OBEDIENT, "stubborn": STUBBORN, "tree": TREE, "leaver": LEAVER}
# Characters JSON escapes, and some it does not (non-ASCII): no size is as it looks.
FILLER = '"\\é'


def _meta(turn: Turn) -> dict[str, JsonValue]:
    return {"instance": turn.instance, "epoch": turn.epoch}


def filler(n: int) -> str:
    return (FILLER * (n // len(FILLER) + 1))[:n]


def surfaces(state_schema: int = 1) -> Agent:
    agent = Agent("surfaces", version=str(state_schema), state_schema=state_schema)
    probe_dir = Path(os.environ.get("PROBE_DIR", "."))

    if state_schema == 2:

        @agent.migration(from_version=1)
        def copy_values(values: dict[str, JsonValue]) -> dict[str, JsonValue]:
            if values.get("poison"):
                raise ValueError("this state is poisoned: surfaces v2 cannot read it")
            return dict(values)

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
            marker = probe_dir / f"{name}.up"
            pid = await turn.spawn(name, [sys.executable, "-c", CODE[kind], str(marker)])
            await turn.reply(f"spawned {name} {pid}", pid=pid, **_meta(turn))
        elif command == "grow":
            key, _, n = rest.partition(" ")
            turn.values[key] = filler(int(n))
            await turn.reply(f"grew {key}", **_meta(turn))
        elif command == "sizes":
            sizes = {k: len(v) for k, v in sorted(turn.values.items()) if isinstance(v, str)}
            await turn.reply(f"sizes {sizes}", sizes=sizes, **_meta(turn))
        elif command == "bulk":
            k, _, n = rest.partition(" ")
            for index in range(int(k)):
                turn.remember(f"bulk-{index}", filler(int(n)))
            await turn.reply(f"remembered {k}", **_meta(turn))
        elif command == "shout":
            await turn.reply(filler(int(rest)), **_meta(turn))
        elif command == "say":
            old = turn.values.get("messages", [])
            assert isinstance(old, list)
            turn.values["messages"] = [*old, {"role": "user", "content": rest}]
            await turn.reply(f"said {len(old) + 1}", **_meta(turn))
        elif command == "note":
            turn.append("notes", rest)
            await turn.reply("noted", **_meta(turn))
        elif command == "poison":
            turn.values["poison"] = True
            await turn.reply("poisoned", **_meta(turn))
        elif command == "echo":
            result = await turn.tool("echo", {"text": rest})
            await turn.reply(f"tool said {result}", **_meta(turn))
        elif command == "boom":
            raise RuntimeError("boom as requested")
        else:
            await turn.reply(f"heard: {turn.content}", **_meta(turn))

    @agent.on_shadow_ready
    def warm(values: Mapping[str, JsonValue]) -> None:
        with (probe_dir / "warm.log").open("a") as log:
            log.write(f"{os.getpid()} count={values.get('count')}\n")
        if os.environ.get("WARM_FAILS"):
            raise RuntimeError("the warm-up failed, as asked")

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


AGENTS = {"surfaces": surfaces, "surfaces2": lambda: surfaces(2), "sidefx": sidefx}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in AGENTS:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(AGENTS)}")
    AGENTS[sys.argv[1]]().run()
