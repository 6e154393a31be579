"""Running an agent process: settings from the environment, signals, exit code.

A *warm* process (``SHADOWPOD_WARM=1``) is started before anyone needs it: it loads
the agent's code — most of a start's cost, the interpreter and its imports — runs
the agent's ``on_start`` hook, and then waits for one line on stdin, a JSON object of
the environment that makes it an instance (identity, mode, epoch, listen address).
It then runs as if it had been started with that environment. stdin closing first
means it is not needed: exit 0.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import signal
import sys
import threading
from typing import NoReturn

from aiohttp import web

from shadowpod import eventloop, logs
from shadowpod.agent.declaration import AgentDeclaration
from shadowpod.agent.runtime import AgentRuntime
from shadowpod.agent.sandbox import run_sandbox, sandbox_requested
from shadowpod.agent.server import make_status_app
from shadowpod.agent.settings import DESCRIBE_ENV, AgentSettings
from shadowpod.agent.termination import write_termination_message

logger = logging.getLogger(__name__)


async def serve_agent(agent: AgentDeclaration, settings: AgentSettings) -> int:
    runtime = AgentRuntime(agent, settings)
    runner = web.AppRunner(make_status_app(runtime), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, reuse_address=True)
    await site.start()

    async def rebind(host: str, port: int) -> None:
        # A copy restored from a checkpoint, in a new place: its listener died with the
        # dump (a stand-in took its place, see shadowpod.agent.checkpoint).
        nonlocal site
        await site.stop()
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()

    runtime.rebind = rebind
    main = asyncio.create_task(runtime.run(), name="agent-runtime")
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, runtime.request_stop, main)
    try:
        code = await main
    finally:
        await runner.cleanup()
    if code and runtime.error:
        write_termination_message(runtime.error)
    return code


def activate_warm_process() -> bool:
    """In a warm process: wait for the environment that makes it an instance and
    apply it. Returns ``False`` when stdin closed instead (the process is not needed)."""
    line = sys.stdin.readline()
    if not line.strip():
        return False
    try:
        env = json.loads(line)
    except ValueError:
        env = None
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ValueError(
            "a warm agent process (SHADOWPOD_WARM=1) expects one JSON object of strings "
            "on stdin: the environment of the instance it becomes"
        )
    os.environ.update(env)
    return True


def describe(agent: AgentDeclaration) -> dict[str, object]:
    """What an agent's code declares: the one source of its schema versions (an image
    map may leave them out; the local runtime then asks the code, see ``DESCRIBE_ENV``)."""
    return {
        "name": agent.name,
        "version": agent.version,
        "state_schema": agent.state_schema,
        "reads_state_schemas": agent.reads_state_schemas,
    }


def run_agent(agent: AgentDeclaration) -> None:
    if os.environ.get(DESCRIBE_ENV) == "1":
        print(json.dumps(describe(agent)), flush=True)
        sys.exit(0)
    eventloop.exit_with_parent()
    if agent.start_hook is not None:
        eventloop.run(_started(agent))
    if os.environ.get("SHADOWPOD_WARM") == "1":
        # The agent's code is loaded: its objects leave the collector's sight now, while
        # nobody waits, not after the handover (that first full collection is ~65 ms
        # with LangGraph imported, and it came in the migration's Restoring phase).
        eventloop.tune_gc()
        try:
            if not activate_warm_process():
                sys.exit(0)
        except ValueError as exc:  # not an instance yet: nobody reads a termination message
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
    logs.configure(
        os.environ.get("SHADOWPOD_LOG_LEVEL", "info"),
        os.environ.get("SHADOWPOD_LOG_FORMAT", "json"),
    )
    if sandbox_requested():  # an upgrade gate's replay: no session, no gateway
        sys.exit(run_sandbox(agent))
    try:
        settings = AgentSettings.from_env()
    except ValueError as exc:
        _exit_with(str(exc), 2)
    try:
        code = eventloop.run(serve_agent(agent, settings))
    except Exception as exc:  # a crash before the runtime ran (identity, listen address)
        write_termination_message(f"{type(exc).__name__}: {exc}")
        raise
    exit_without_teardown(code)


async def _started(agent: AgentDeclaration) -> None:
    """The agent's ``on_start`` hook, on a loop of its own (the instance's comes later,
    once a warm process is handed its environment)."""
    assert agent.start_hook is not None
    try:
        await agent.start_hook()
    except Exception:
        logger.exception("the on_start hook failed; the agent starts without it")


def exit_without_teardown(code: int) -> NoReturn:
    """Exit as the interpreter would — other threads waited for, ``atexit`` handlers
    run (logging's flush among them), stdio flushed — but without tearing the heap down
    object by object: for a LangGraph agent at 1,000 turns (its state, the decoded
    conversation) that took 35-55 ms after its drain, while the migration that replaced
    it waited for it to be gone. ``multiprocessing``'s children end the same way."""
    threading._shutdown()  # type: ignore[attr-defined]  # what Py_Finalize calls first
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def _exit_with(message: str, code: int) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    write_termination_message(message)
    sys.exit(code)
