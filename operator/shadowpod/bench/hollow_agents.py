"""Hollow agents: the agents of a hollow node's Shadowpod pods, run in this process.

A hollow node (``bench.hollow``) says its pods Running without running anything,
which is enough for the operator at rest; a migration is not: its shadow restores
and catches up, the old owner drains and hands over, each through the real gateway,
and the operator reads each instance's status from ``http://POD_IP:8080``. A
thousand agent processes do not fit the benchmark's machine, a thousand agent
*runtimes* do: each pod here gets the SDK's own runtime (``AgentRuntime``, the one an
agent process runs, with its status endpoints) as tasks of this process, on a
loopback address of its own (the pod's IP: the whole of 127/8 is this machine's),
from what the pod is given — its identity files from its downward API and the
session's Secret, its mode, epoch and snapshot from its environment. So every move
of a rollout is a real one, with real state, against the real gateway; only the
process boundary and the container are not there.

Only Shadowpod's own agent pods are run (the operator writes them: ``kube.manifests``),
with an agent declared here per image (``bench_agent``): a turn answers with its
version and a count in the agent's state, whose shape changes at version 2 (a real
state migration on every move to it).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import ipaddress
import logging
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from aiohttp import web
from pydantic import JsonValue

from shadowpod.agent.declaration import AgentDeclaration
from shadowpod.agent.identity import Identity
from shadowpod.agent.runtime import AgentRuntime
from shadowpod.agent.server import make_status_app
from shadowpod.agent.settings import AgentSettings
from shadowpod.agent.termination import MAX_BYTES
from shadowpod.agent.turn import Turn
from shadowpod.kube import names
from shadowpod.kube.api import KubeApi

# Pod addresses: 127.1.0.1 onwards (127.0.0.x is where tests and gateways listen).
FIRST_ADDRESS: Final = ipaddress.IPv4Address("127.1.0.1")
LAST_ADDRESS: Final = ipaddress.IPv4Address("127.254.255.254")
BIND_ATTEMPTS: Final = 1000


def bench_agent(version: int) -> AgentDeclaration:
    """The benchmark's agent at ``version`` (1 or 2): answers ``[vN] #count text``; its
    count is kept as ``count`` at version 1 and as ``turns.count`` at 2, which reads
    version 1's state through a migration."""
    agent = AgentDeclaration("fleet-bench", version=str(version), state_schema=version)

    if version >= 2:

        @agent.migration(from_version=1)
        def nest(values: dict[str, JsonValue]) -> dict[str, JsonValue]:
            return {"turns": {"count": values.get("count", 0)}}

    @agent.on_message
    async def answer(turn: Turn) -> None:
        values = turn.values
        if version == 1:
            count = int(values.get("count", 0)) + 1
            values["count"] = count
        else:
            turns = values.get("turns")
            count = (int(turns.get("count", 0)) if isinstance(turns, dict) else 0) + 1
            values["turns"] = {"count": count}
        await turn.reply(f"[v{version}] #{count} {turn.content}", version=agent.version)

    return agent


@dataclass
class HollowAgent:
    """One pod's agent: its runtime, the task running it, its status endpoints."""

    address: str
    runtime: AgentRuntime
    main: asyncio.Task[int]
    runner: web.AppRunner
    directory: tempfile.TemporaryDirectory[str]

    async def stop(self, timeout_s: float) -> int | None:
        """As a kubelet stops a container: SIGTERM (the runtime finishes its turn,
        drains), then, after ``timeout_s``, killed."""
        if not self.main.done():
            self.runtime.request_stop(self.main)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.main), timeout_s)
        if not self.main.done():
            self.main.cancel()
        code = None
        with contextlib.suppress(asyncio.CancelledError):
            code = await self.main
        await self.close()
        return code

    async def close(self) -> None:
        await self.runner.cleanup()
        self.directory.cleanup()


class HollowAgents:
    """The agents of Shadowpod pods, by image: ``agents`` maps each image this node
    can run to its declaration."""

    def __init__(self, api: KubeApi, agents: Mapping[str, AgentDeclaration]) -> None:
        self.api = api
        self.agents = dict(agents)
        self._next = int(FIRST_ADDRESS)
        self._free: list[str] = []
        # The runtimes log every move of every session: thousands of lines a minute.
        logging.getLogger("shadowpod.agent").setLevel(logging.WARNING)

    def runs(self, pod: Mapping[str, Any]) -> bool:
        containers = pod["spec"]["containers"]
        return len(containers) == 1 and containers[0]["image"] in self.agents

    def _address(self) -> str:
        if self._free:
            return self._free.pop()
        if self._next > int(LAST_ADDRESS):
            raise RuntimeError("no loopback address left for another hollow agent")
        address = str(ipaddress.IPv4Address(self._next))
        self._next += 1
        return address

    def release(self, address: str) -> None:
        self._free.append(address)

    async def start(self, pod: Mapping[str, Any]) -> HollowAgent:
        """The pod's agent, serving on an address of its own (the pod's IP)."""
        meta = pod["metadata"]
        container = pod["spec"]["containers"][0]
        session = meta["labels"][names.SESSION_LABEL]
        secret = await self.api.get(
            f"/api/v1/namespaces/{meta['namespace']}/secrets/{names.token_secret(session)}"
        )
        data = {
            key: base64.b64decode(value).decode()
            for key, value in ((secret or {}).get("data") or {}).items()
        }
        annotations = meta.get("annotations") or {}
        directory = tempfile.TemporaryDirectory(prefix="hollow-agent-")
        Identity.write(
            Path(directory.name),
            session=annotations[names.GATEWAY_SESSION_ANNOTATION],
            instance=meta["name"],
            gateway=data[names.GATEWAY_KEY],
            token=data[names.TOKEN_KEY],
            owner_credential=data.get(names.owner_credential_key(meta["name"])),
        )
        # The container's own values (mode, epoch, snapshot, drain grace); its identity
        # and listen address are this place's.
        env = {
            item["name"]: str(item["value"])
            for item in container.get("env") or []
            if "value" in item and item["name"].startswith("SHADOWPOD_")
        }
        env["SHADOWPOD_IDENTITY_DIR"] = directory.name
        env.pop("SHADOWPOD_CREDENTIALS_DIR", None)
        address, runtime, runner = await self._serve(container["image"], env)
        main = asyncio.create_task(runtime.run(), name=f"hollow-agent-{meta['name']}")
        return HollowAgent(address, runtime, main, runner, directory)

    async def _serve(
        self, image: str, env: dict[str, str]
    ) -> tuple[str, AgentRuntime, web.AppRunner]:
        """The agent's runtime and status endpoints on the next address free on this
        machine: another process (another benchmark, a test's kubelet) may listen on
        some of 127/8 already; those addresses are skipped for good."""
        for _ in range(BIND_ATTEMPTS):
            address = self._address()
            env["SHADOWPOD_LISTEN"] = f"{address}:{names.AGENT_PORT}"
            runtime = AgentRuntime(self.agents[image], AgentSettings.from_env(env))
            runner = web.AppRunner(make_status_app(runtime), access_log=None)
            await runner.setup()
            try:
                await web.TCPSite(runner, address, names.AGENT_PORT, reuse_address=True).start()
            except OSError as exc:
                await runner.cleanup()
                if exc.errno != errno.EADDRINUSE:
                    self.release(address)
                    raise
                continue
            return address, runtime, runner
        raise RuntimeError(f"no free loopback address in {BIND_ATTEMPTS} tried")


def exit_status(pod: Mapping[str, Any], agent: HollowAgent, code: int) -> dict[str, Any]:
    """What a kubelet writes of a pod whose only container exited with ``code``
    (``restartPolicy: Never``): its termination message the runtime's error."""
    container = pod["spec"]["containers"][0]
    terminated: dict[str, Any] = {
        "exitCode": code,
        "reason": "Completed" if code == 0 else "Error",
    }
    if code and agent.runtime.error:
        terminated["message"] = agent.runtime.error[:MAX_BYTES]
    return {
        "phase": "Succeeded" if code == 0 else "Failed",
        "conditions": [
            {"type": "Ready", "status": "False", "reason": "PodCompleted"},
            {"type": "ContainersReady", "status": "False", "reason": "PodCompleted"},
        ],
        "containerStatuses": [
            {
                "name": container["name"],
                "image": container["image"],
                "imageID": "",
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {"terminated": terminated},
            }
        ],
    }
