"""A live CRIU migration under client load, run where CRIU runs (the CRIU container):

    python -m tests.image.criu_scenario REPORT.json [--rate 20]

The reference agent v1 owns a session under steady client load (and a heartbeat
schedule). It looks a forecast up (its warm cache, in memory only) and says what its
cache holds. Then the engine migrates it with the ``criu`` strategy to an instance
of the same image: the owner is checkpointed while it serves, restored as the shadow
at another loopback address, caught up from the watermark of the checkpoint, fenced
and promoted. A charge (a tool with a side effect, each run logged) is made just
before the move and one after it: each must have run once. The new owner is asked
about its cache again; then the session moves
once more on the app-level state path (a snapshot, a new process), whose owner is
asked too: its cache is cold, as the journal never held it. The report (JSON) holds
the scenario's checks (nothing lost, duplicated or reordered; the state at the fence;
epochs silent after their fence; schedules fired once; the source drained), the
migration and both answers about the cache; ``tests/image/test_criu.py`` judges it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shadowpod.local.scenario import LiveScenario

WARM = re.compile(r"warm cache ([0-9a-f]+): ([^()]*?)(?: \(hi |$)")


async def ask(scenario: LiveScenario, content: str, timeout_s: float = 30.0) -> tuple[int, str]:
    """Post ``content`` as a client and wait for the reply the load's watcher sees:
    (the message's seq, the reply)."""
    assert scenario.client is not None
    live = scenario.main
    accepted = await scenario.client.post_message(live.name, content)
    deadline = time.monotonic() + timeout_s
    while accepted.seq not in live.load.replies:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no reply to {content!r} within {timeout_s}s")
        await asyncio.sleep(0.01)
    return accepted.seq, live.load.replies[accepted.seq][0].content


async def warm(scenario: LiveScenario) -> dict[str, Any]:
    """What the owner's warm cache holds, and which instance answered."""
    seq, answer = await ask(scenario, "warm?")
    journal = await scenario.journal(scenario.main.name)
    meta = next(
        e.payload.get("meta") or {}
        for e in journal
        if e.payload.get("turn") == seq and e.payload.get("role") == "assistant"
    )
    found = WARM.search(answer)
    return {
        "answer": answer,
        "instance": meta.get("instance"),
        "id": None if found is None else found[1],
        "cached": None if found is None else found[2].strip(),
    }


async def run(workdir: Path, rate: float) -> dict[str, Any]:
    charges = workdir / "charges.log"
    os.environ["REFAGENT_CHARGE_LOG"] = str(charges)  # the agents' environment
    async with LiveScenario(workdir, rate=rate, heartbeat_s=1.0, checkpoints=True) as scenario:
        await ask(scenario, "weather Oslo")
        before = await warm(scenario)
        await asyncio.sleep(1.0)  # serving under load
        assert scenario.client is not None
        await scenario.client.post_message(scenario.main.name, "charge 5")
        outcome = await scenario.migrate("refagent:v1", strategy="criu")
        await ask(scenario, "charge 7")
        left = sorted(p.name for p in (workdir / "checkpoints").glob("*"))
        await asyncio.sleep(1.0)  # the new owner serving under load
        after = await warm(scenario)
        state_path = await scenario.migrate("refagent:v1", strategy="shadow")
        await asyncio.sleep(0.5)
        after_state_path = await warm(scenario)
        report = await scenario.finish()
        journal = await scenario.journal(scenario.main.name)
    calls = {
        str(e.payload["call_id"])
        for e in journal
        if e.kind == "tool_call" and e.payload.get("tool") == "charge"
    }
    journaled = [
        e.kind
        for e in journal
        if e.kind in ("tool_call", "tool_result") and str(e.payload.get("call_id")) in calls
    ]
    record = outcome.record
    return {
        "ok": report.ok,
        "checks": [
            {"name": c.name, "ok": c.ok, "detail": c.detail, "measured": c.measured}
            for c in report.checks
        ],
        "verdict": {
            "sent": report.verdict.sent,
            "accepted": report.verdict.accepted,
            "replied": report.verdict.replied,
            "lost": report.verdict.lost,
            "duplicated": report.verdict.duplicated,
            "reordered": report.verdict.reordered,
        },
        "migration": outcome.summary(),
        "checkpoint": {"watermark": record.snapshot_watermark, "ms": record.checkpoint_ms},
        "source": record.spec.source.name,
        "target": record.spec.target.name,
        "warm_before": before,
        "warm_after": after,
        "state_path": state_path.summary()
        | {"target_instance": state_path.record.spec.target.name},
        "warm_after_state_path": after_state_path,
        "checkpoints_left": left,
        "charges_run": charges.read_text().split() if charges.exists() else [],
        "charge_entries": {kind: journaled.count(kind) for kind in ("tool_call", "tool_result")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--rate", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shadowpod-criu-") as workdir:
        result = asyncio.run(run(Path(workdir), args.rate))
    args.report.write_text(json.dumps(result, indent=2))
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
