"""Reading an agent instance's own endpoint: its ``/v1/status`` as the engine's
``InstanceStatus``. Shared by the runtimes that run instances (local processes, pods).
"""

from __future__ import annotations

from typing import Final

import aiohttp
from pydantic import ValidationError

from shadowpod.api.agent import AgentStatus
from shadowpod.engine.ports import InstanceStatus

STATUS_TIMEOUT: Final = aiohttp.ClientTimeout(total=1.0)


async def read_agent_status(
    http: aiohttp.ClientSession, base_url: str, *, timeout: aiohttp.ClientTimeout = STATUS_TIMEOUT
) -> AgentStatus | None:
    """The instance's status; ``None`` while it does not answer (starting up, or
    gone) or answers with something that is not a status."""
    try:
        async with http.get(f"{base_url}/v1/status", timeout=timeout) as response:
            if response.status != 200:
                return None
            return AgentStatus.model_validate_json(await response.read())
    except (aiohttp.ClientError, TimeoutError, ValidationError):
        return None


def instance_status(name: str, status: AgentStatus | None) -> InstanceStatus:
    """What a live instance reports, as the engine sees it."""
    if status is None:
        return InstanceStatus(name=name, alive=True)  # starting up: not answering yet
    return InstanceStatus(
        name=name,
        alive=True,
        ready=status.ready,
        mode=status.mode,
        epoch=status.epoch,
        watermark=status.watermark,
        catchup_entries=None if status.catchup is None else status.catchup.entries,
        catchup_entries_per_s=None if status.catchup is None else status.catchup.entries_per_s,
        promoted_fence_seq=None if status.promotion is None else status.promotion.fence_seq,
        serving=status.serving,
        error=status.error,
    )
