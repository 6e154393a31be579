"""Shadow compare on this machine: ``ShadowValidator`` (``shadowpod.validator``)
with the local runtime's instance addresses, and golden sessions named as files.

The shadow answers in its own process (its agent API's sandbox): no sandbox process
is started per comparison.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from shadowpod.client.gateway import GatewayClient
from shadowpod.engine.ports import ValidationUnavailable
from shadowpod.local.runtime import LocalRuntime
from shadowpod.validator import ShadowValidator

__all__ = ["ValidationUnavailable", "local_validator"]


def local_validator(client: GatewayClient, runtime: LocalRuntime) -> ShadowValidator:
    async def address_of(name: str) -> str:
        instance = runtime.instance(name)
        if instance is None:
            raise ValidationUnavailable(f"no instance {name!r} runs on this machine")
        return instance.url

    async def golden_text(reference: str) -> str:
        return await asyncio.to_thread(Path(reference).read_text)

    return ShadowValidator(client, address_of, golden_text)
