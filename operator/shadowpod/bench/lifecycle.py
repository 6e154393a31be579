"""``shadowpod bench lifecycle``: what a suspended session costs to wake.

Local processes on this machine (the gateway, the reference agent as the owner):
``rounds`` times, the session is suspended (final snapshot, the gateway's suspend, the
owner stopped), then a client's message wakes it through the real path — the gateway's
wake feed, the next owner started from the snapshot and the journal, delivery opened —
and is answered. Measured per round:

- ``resume_latency``: from the waking message's post to its reply (what a user waits);
- ``owner_start``: from the wake to the new owner serving (an agent process's cold
  start with its restore: the floor of the resume latency, a pod's start on a cluster
  adds its scheduling and image pull);
- ``suspend``: the whole suspend (snapshot, fence, stop).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shadowpod.bench.machine import MachineProbe
from shadowpod.client.gateway import GatewayClient
from shadowpod.engine.record import InstanceRef
from shadowpod.local import suspension
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.images import reference_images
from shadowpod.stats import summary_ms

SESSION = "bench"
IMAGE = "refagent:v1"


@dataclass(frozen=True)
class LifecycleBenchConfig:
    rounds: int
    workdir: Path
    history: int = 200  # messages the session holds before the first suspend


async def _answered(client: GatewayClient, seq: int, timeout_s: float = 120) -> float:
    """When the reply to ``seq`` was seen (monotonic)."""
    after = seq
    async with asyncio.timeout(timeout_s):
        while True:
            page = await client.events(SESSION, after=after, wait_s=1.0, kinds=["message"])
            for event in page.events:
                payload = event["payload"]
                if (
                    isinstance(payload, dict)
                    and payload.get("role") == "assistant"
                    and payload.get("turn") == seq
                ):
                    return time.monotonic()
            after = max(after, page.next_after)


async def run_lifecycle_bench(config: LifecycleBenchConfig) -> dict[str, Any]:
    probe = MachineProbe()
    probe.start()
    resume_s: list[float] = []
    start_s: list[float] = []
    suspend_s: list[float] = []
    async with LocalDeployment(config.workdir, reference_images()) as deployment:
        owner = InstanceRef(name=deployment.next_name(SESSION), image=IMAGE)
        await deployment.create_session(SESSION, image=IMAGE, instance=owner.name)
        woke: asyncio.Queue[float] = asyncio.Queue()

        async def wake(session: str) -> None:
            nonlocal owner
            began = time.monotonic()
            owner = await suspension.resume(deployment, session, IMAGE)
            woke.put_nowait(time.monotonic() - began)

        listener = suspension.WakeListener(deployment, wake)
        listener.start()
        try:
            async with deployment.client() as client:
                last = None
                for n in range(config.history):
                    last = await client.post_message(SESSION, f"fact {n}", id=f"h{n}")
                if last is not None:
                    await _answered(client, last.seq)
                for n in range(config.rounds):
                    began = time.monotonic()
                    await suspension.suspend(deployment, SESSION, owner)
                    suspend_s.append(time.monotonic() - began)
                    posted = time.monotonic()
                    message = await client.post_message(SESSION, f"wake {n}", id=f"w{n}")
                    replied = await _answered(client, message.seq)
                    resume_s.append(replied - posted)
                    start_s.append(await woke.get())
        finally:
            await listener.close()
    return {
        "config": {"rounds": config.rounds, "history": config.history, "image": IMAGE},
        "resume_latency_ms": summary_ms(resume_s),
        "owner_start_ms": summary_ms(start_s),
        "suspend_ms": summary_ms(suspend_s),
        "machine": probe.report(),
    }
