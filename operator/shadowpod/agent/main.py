"""Running an agent process: settings from the environment, signals, exit code."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from aiohttp import web

from shadowpod import eventloop, logs
from shadowpod.agent.app import Agent
from shadowpod.agent.runtime import AgentRuntime
from shadowpod.agent.server import make_status_app
from shadowpod.agent.settings import AgentSettings


async def serve_agent(agent: Agent, settings: AgentSettings) -> int:
    runtime = AgentRuntime(agent, settings)
    runner = web.AppRunner(make_status_app(runtime), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, settings.host, settings.port, reuse_address=True).start()
    main = asyncio.create_task(runtime.run(), name="agent-runtime")
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, runtime.request_stop, main)
    try:
        return await main
    finally:
        await runner.cleanup()


def run_agent(agent: Agent) -> None:
    logs.configure(
        os.environ.get("SHADOWPOD_LOG_LEVEL", "info"),
        os.environ.get("SHADOWPOD_LOG_FORMAT", "json"),
    )
    try:
        settings = AgentSettings.from_env()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    sys.exit(eventloop.run(serve_agent(agent, settings)))
