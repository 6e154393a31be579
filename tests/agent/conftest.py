"""A real gateway (subprocess, SQLite) and a local runtime for the test agents."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shadowpod.client.gateway import GatewayClient
from shadowpod.local.deployment import LocalDeployment
from tests.agent.support import agent_images


@pytest.fixture
async def dep(tmp_path: Path) -> AsyncIterator[LocalDeployment]:
    async with LocalDeployment(tmp_path, agent_images(tmp_path)) as deployment:
        yield deployment


@pytest.fixture
async def client(dep: LocalDeployment) -> AsyncIterator[GatewayClient]:
    """A client as end users have one."""
    async with dep.client() as end_user:
        yield end_user
