"""The reference agent: deterministic (no LLM), two versions, every state surface.

    python refagent.py --version 1     # or 2

What it does with a message:

- ``my name is <name>``  remembers the name (memory) and greets;
- ``remember: <rule>``   learns a durable fact;
- ``weather <city>``     calls the ``weather`` tool (idempotent);
- ``charge <amount>``    calls the ``charge`` tool (a side effect: not idempotent; each
                         run appends the amount to ``$REFAGENT_CHARGE_LOG``, if set);
- ``sleep <seconds>``    takes that long to answer (a long turn);
- ``what is my name?``   answers the name it remembers;
- ``who are you?``       describes itself: its name and its principle (the persona
                         check's probe);
- ``warm?``              tells its warm cache: an id drawn when the process started
                         and the forecasts it looked up, kept in memory only (never
                         journaled: a CRIU checkpoint carries it, a snapshot cannot);
- anything else          is answered with a running turn count.

On its first turn it registers a ``heartbeat`` schedule (every
``REFAGENT_HEARTBEAT_S`` seconds, 0 = none) and, whenever it becomes owner, starts a
background ``indexer`` process. Version 2 keeps its own state in a different shape
(schema 2) and reads version 1's through a migration; its answers start with ``v2``
where version 1's start with ``[v1]``, so a client can tell which version answered.

Three variants of version 2 exist to test upgrade gates (``--variant``):
``reworded`` says the same things in other words; ``forgetful`` regresses: it looks
the user's name up under a key of its own (a refactoring slip), so after a move it no
longer knows the name the session told the earlier version; ``renamed`` calls itself
by another name (a prompt that lost the agent's identity) until its re-anchor hook is
given the session's identity.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys

from pydantic import JsonValue

from shadowpod.agent import Agent, OwnerContext, SessionIdentity, Turn

HEARTBEAT_S = float(os.environ.get("REFAGENT_HEARTBEAT_S", "0"))
INDEXER = [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"]
# In memory only: this process's id, and what its weather tool looked up.
WARM_CACHE_ID = secrets.token_hex(4)
FORECASTS: dict[str, JsonValue] = {}


def _ballast(megabytes: int) -> bytearray:
    """Memory the process holds (``REFAGENT_BALLAST_MB``, for benchmarks of the CRIU
    path): every page written, so each is a page a checkpoint must carry."""
    ballast = bytearray(megabytes * 1024 * 1024)
    ballast[::4096] = b"\x01" * len(range(0, len(ballast), 4096))
    return ballast


BALLAST = _ballast(int(os.environ.get("REFAGENT_BALLAST_MB", "0")))


VARIANTS = ("plain", "reworded", "forgetful", "renamed")
NAME = "Refagent"
PRINCIPLE = "I answer every message once, in order"


def build(version: int, variant: str = "plain") -> Agent:
    label = str(version) if variant == "plain" else f"{version}-{variant}"
    agent = Agent("refagent", version=label, state_schema=version)
    name_key = "user_name" if variant == "forgetful" else "name"
    reworded = variant == "reworded"
    # Who it says it is: in memory; the re-anchor hook sets it from the session's spec.
    persona = {"name": "Rex" if variant == "renamed" else NAME, "principle": PRINCIPLE}
    agent.nondeterministic(r"r-\d+(?:\.\d+)?")  # receipts: a payment system's own ids

    # --- the agent's own state, in its schema -----------------------------------------

    def count_of(values: dict[str, JsonValue]) -> int:
        if version == 1:
            return int(values.get("count", 0))  # type: ignore[arg-type]
        turns = values.get("turns", {})
        return int(turns.get("count", 0)) if isinstance(turns, dict) else 0  # type: ignore[arg-type]

    def with_count(values: dict[str, JsonValue], count: int) -> None:
        if version == 1:
            values["count"] = count
        else:
            values["turns"] = {"count": count}

    if version >= 2:

        @agent.migration(from_version=1)
        def v1_to_v2(values: dict[str, JsonValue]) -> dict[str, JsonValue]:
            return {
                "turns": {"count": values.get("count", 0)},
                "profile": {"greeted": values.get("greeted", False)},
            }

    # --- tools ------------------------------------------------------------------------

    @agent.tool(idempotent=True)
    async def weather(city: str) -> JsonValue:
        forecasts = ["sun", "rain", "wind", "snow", "fog"]
        result: JsonValue = {
            "city": city,
            "forecast": forecasts[sum(map(ord, city)) % len(forecasts)],
        }
        FORECASTS[city] = result
        return result

    @agent.tool(idempotent=False)
    async def charge(amount: str) -> JsonValue:
        if log := os.environ.get("REFAGENT_CHARGE_LOG"):
            with open(log, "a") as charges:  # noqa: ASYNC230 - one short line
                charges.write(f"{amount}\n")
        return {"charged": amount, "receipt": f"r-{amount}"}

    # --- becoming owner ---------------------------------------------------------------

    @agent.on_owner
    async def start_background_work(owner: OwnerContext) -> None:
        await owner.spawn("indexer", INDEXER)

    @agent.on_reanchor
    async def reanchor(identity: SessionIdentity) -> None:
        persona["name"] = identity.name or NAME
        if identity.principles:
            persona["principle"] = identity.principles[0]

    # --- turns ------------------------------------------------------------------------

    def answer(turn: Turn, text: str) -> str:
        name = turn.memory.get(name_key)
        suffix = (f" (hello {name})" if reworded else f" (hi {name})") if name else ""
        count = count_of(turn.values)
        if version == 1:
            return f"[v1] #{count} {text}{suffix}"
        return f"v2 > turn {count}: {text}{suffix}"

    @agent.on_message
    async def handle(turn: Turn) -> None:
        with_count(turn.values, count_of(turn.values) + 1)
        if HEARTBEAT_S > 0 and "heartbeat" not in turn.state.schedules:
            turn.schedule("heartbeat", every_s=HEARTBEAT_S, content="heartbeat")
        text = turn.content.strip()
        meta: dict[str, JsonValue] = {
            "version": agent.version,
            "instance": turn.instance,
            "epoch": turn.epoch,
        }
        if turn.schedule_id is not None:
            await turn.reply(answer(turn, f"{turn.schedule_id} fired"), **meta)
            return
        lowered = text.lower()
        if lowered.startswith("my name is "):
            turn.remember(name_key, text[len("my name is ") :].strip())
            greeting = "pleased to meet you" if reworded else "nice to meet you"
            await turn.reply(answer(turn, greeting), **meta)
        elif lowered.startswith(("what is my name", "what's my name")):
            name = turn.memory.get(name_key)
            if name is None:
                said = "I do not know your name yet"
            else:
                said = f"you are {name}" if reworded else f"your name is {name}"
            await turn.reply(answer(turn, said), **meta)
        elif lowered.startswith("remember:"):
            rule = text.split(":", 1)[1].strip()
            turn.learn(f"rule-{len(turn.facts) + 1}", rule)
            noted = f"noted, I'll keep in mind: {rule}" if reworded else f"I will remember: {rule}"
            await turn.reply(answer(turn, noted), **meta)
        elif lowered.startswith("weather "):
            result = await turn.tool("weather", {"city": text[len("weather ") :].strip()})
            await turn.reply(answer(turn, f"weather: {result}"), **meta)
        elif lowered.startswith("charge "):
            result = await turn.tool("charge", {"amount": text[len("charge ") :].strip()})
            await turn.reply(answer(turn, f"charged: {result}"), **meta)
        elif lowered.startswith("who are you"):
            await turn.reply(f"I am {persona['name']}: {persona['principle']}.", **meta)
        elif lowered == "warm?":
            cached = ", ".join(sorted(FORECASTS)) or "nothing"
            await turn.reply(answer(turn, f"warm cache {WARM_CACHE_ID}: {cached}"), **meta)
        elif lowered.startswith("sleep "):
            await asyncio.sleep(float(text.split()[1]))
            await turn.reply(answer(turn, f"slept {text.split()[1]}s"), **meta)
        else:
            await turn.reply(answer(turn, text), **meta)

    return agent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", type=int, choices=[1, 2], required=True)
    parser.add_argument("--variant", choices=VARIANTS, default="plain")
    args = parser.parse_args()
    build(args.version, args.variant).run()


if __name__ == "__main__":
    main()
