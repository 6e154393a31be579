"""Calling an agent instance's own endpoints: its ``/v1/status`` as the engine's
``InstanceStatus`` (shared by the runtimes that run instances: local processes, pods),
and its sandbox, where upgrade gates have it answer turns it will never own.
"""

from __future__ import annotations

from typing import Any, Final

import aiohttp
import orjson
from pydantic import ValidationError

from shadowpod.api.agent import AgentStatus
from shadowpod.domain.errors import ShadowpodError
from shadowpod.engine.ports import InstanceStatus
from shadowpod.gates.replay import SandboxReport

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


# --- the sandbox: upgrade gates ask an instance to answer in it -----------------------

SANDBOX_TIMEOUT: Final = aiohttp.ClientTimeout(total=300.0)
NDJSON: Final = "application/x-ndjson"


class AgentAPIError(ShadowpodError):
    """An instance's agent API refused a request (``error`` is its one-word reason,
    ``status`` the HTTP status), or could not be reached (``status`` 0)."""

    reason = "AgentAPIError"

    def __init__(self, message: str, *, status: int = 0, error: str = "Unreachable") -> None:
        super().__init__(message)
        self.status = status
        self.error = error


async def _answer(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    timeout: aiohttp.ClientTimeout,
    **kwargs: Any,
) -> bytes:
    try:
        async with http.request(method, url, timeout=timeout, **kwargs) as response:
            body = await response.read()
            if response.status >= 400:
                try:
                    doc = orjson.loads(body)
                except orjson.JSONDecodeError:
                    doc = {}
                doc = doc if isinstance(doc, dict) else {}
                error = str(doc.get("error") or doc.get("reason") or f"HTTP{response.status}")
                said = str(doc.get("message") or body[:200].decode(errors="replace"))
                raise AgentAPIError(
                    f"{url} answered {response.status} {error}: {said}",
                    status=response.status,
                    error=error,
                )
            return body
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise AgentAPIError(f"{url} cannot be reached: {type(exc).__name__}: {exc}") from exc


async def sandbox_replay(
    http: aiohttp.ClientSession,
    base_url: str,
    golden_text: str,
    *,
    timeout: aiohttp.ClientTimeout = SANDBOX_TIMEOUT,
) -> SandboxReport:
    """The instance answers a golden file (its JSON Lines text) in its sandbox."""
    body = await _answer(
        http,
        "POST",
        f"{base_url}/v1/sandbox/replay",
        timeout=timeout,
        data=golden_text.encode(),
        headers={"Content-Type": NDJSON},
    )
    try:
        return SandboxReport.model_validate_json(body)
    except ValidationError as exc:
        raise AgentAPIError(f"{base_url} answered with no sandbox report: {exc}") from exc


async def open_compare_window(
    http: aiohttp.ClientSession,
    base_url: str,
    after: int,
    *,
    turns: int | None = None,
    timeout: aiohttp.ClientTimeout,
) -> int:
    """Open the shadow's compare window after ``after`` (for its first ``turns``
    turns); where it starts."""
    asked: dict[str, int] = {"after": after} if turns is None else {"after": after, "turns": turns}
    body = await _answer(http, "POST", f"{base_url}/v1/compare/window", timeout=timeout, json=asked)
    opened = orjson.loads(body).get("after")
    if not isinstance(opened, int):
        raise AgentAPIError(f"{base_url} opened a compare window but did not say where")
    return opened


async def compare_report(
    http: aiohttp.ClientSession,
    base_url: str,
    *,
    after: int,
    to: int,
    timeout: aiohttp.ClientTimeout,
) -> SandboxReport:
    """The window's answers to the turns after ``after`` acked at or below ``to``;
    ``AgentAPIError`` with ``error`` ``Pending`` (not there yet) or ``WindowLost``."""
    body = await _answer(
        http,
        "GET",
        f"{base_url}/v1/compare",
        timeout=timeout,
        params={"after": str(after), "to": str(to)},
    )
    try:
        return SandboxReport.model_validate_json(body)
    except ValidationError as exc:
        raise AgentAPIError(f"{base_url} answered with no sandbox report: {exc}") from exc


PROBE_TIMEOUT: Final = aiohttp.ClientTimeout(total=60.0)


async def persona_probe(
    http: aiohttp.ClientSession,
    base_url: str,
    message: str,
    *,
    timeout: aiohttp.ClientTimeout = PROBE_TIMEOUT,
) -> str:
    """The instance's reply to ``message``, answered in its sandbox from its state."""
    body = await _answer(
        http, "POST", f"{base_url}/v1/sandbox/probe", timeout=timeout, json={"message": message}
    )
    reply = orjson.loads(body).get("reply")
    if not isinstance(reply, str):
        raise AgentAPIError(f"{base_url} answered the probe with no reply")
    return reply


async def persona_reanchor(
    http: aiohttp.ClientSession,
    base_url: str,
    *,
    timeout: aiohttp.ClientTimeout = PROBE_TIMEOUT,
) -> None:
    """Have the instance call its agent's re-anchor hook."""
    await _answer(http, "POST", f"{base_url}/v1/persona/reanchor", timeout=timeout)
