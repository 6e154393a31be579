"""Reading many objects from a real API server as its own clients do, for the
benchmarks: LISTs in pages, retried while the server is too busy to answer, and
watches taken up where they stopped (listed again when the server no longer keeps that
version).

One LIST of thousands of objects at once is what a loaded API server answers last:
run 3 of ``shadowpod bench cluster`` stopped on a 504 to its own unpaged LIST of
AgentMigrations, with ~50 moves starting. client-go's reflector pages (500 a page) and
relists on 410 Gone; so does this.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any, Final

from shadowpod.kube.api import KubeApi, KubeError

PAGE: Final = 500
# A busy server's transient answers (its 60 s timeout, too many requests, restarting).
TRANSIENT: Final = frozenset({429, 500, 502, 503, 504})
RETRIES: Final = 6
RETRY_S: Final = 2.0

OnEvent = Callable[[str, dict[str, Any], float], None]


async def _get(api: KubeApi, path: str, query: Mapping[str, str]) -> dict[str, Any]:
    """One GET's JSON; a transient answer or a dropped connection retried (doubling
    waits), any other error raised as ``KubeError``."""
    for attempt in range(RETRIES + 1):
        try:
            response = await api.api.call_api(
                path,
                "GET",
                query_params=list(query.items()),
                header_params={"Accept": "application/json"},
                _preload_content=False,
                _return_http_data_only=True,
                _request_timeout=120,
                auth_settings=["BearerToken"],
            )
            status, text = response.status, await response.text()
        # The client's ApiException (an error answer), which this layer may not import,
        # or the connection dropped: all worth one more try.
        except Exception as exc:  # noqa: BLE001
            status, text = int(getattr(exc, "status", 0) or 0), str(exc)
        if status < 400 and text:
            found: dict[str, Any] = json.loads(text)
            return found
        if (status not in TRANSIENT and status != 0) or attempt == RETRIES:
            raise KubeError(status, "", f"GET {path}: {status} {text[:300]}")
        await asyncio.sleep(RETRY_S * 2**attempt)
    raise AssertionError("unreachable")


async def list_all(
    api: KubeApi, path: str, *, query: Mapping[str, str] | None = None, page: int = PAGE
) -> tuple[list[dict[str, Any]], str]:
    """Every object at ``path``, ``page`` at a time, and the list's resourceVersion (to
    watch from). A continue token that expired (410) starts the list again."""
    while True:
        items: list[dict[str, Any]] = []
        token = ""
        try:
            while True:
                asked = {**(query or {}), "limit": str(page)}
                if token:
                    asked["continue"] = token
                listed = await _get(api, path, asked)
                items.extend(listed.get("items") or [])
                token = (listed.get("metadata") or {}).get("continue") or ""
                if not token:
                    return items, str((listed.get("metadata") or {}).get("resourceVersion", ""))
        except KubeError as exc:
            if exc.status != 410:
                raise


async def follow(
    api: KubeApi,
    path: str,
    on_event: OnEvent,
    *,
    query: Mapping[str, str] | None = None,
    breaks: dict[str, int] | None = None,
) -> None:
    """Every object at ``path`` then every change, until cancelled: ``on_event(type,
    object, monotonic time)``, with ``LISTED`` for what a (re)list found. A watch that
    ends is taken up from the last version seen; one whose version is gone (410, or an
    ERROR event) lists again, so nothing is missed. Each break is counted in
    ``breaks``."""
    version = ""
    while True:
        try:
            if not version:
                items, version = await list_all(api, path, query=query)
                now = time.monotonic()
                for item in items:
                    on_event("LISTED", item, now)
            async with contextlib.aclosing(watch_events(api, path, version, query)) as events:
                async for event in events:
                    kind = event.get("type")
                    body = event.get("object") or {}
                    if kind == "ERROR":
                        version = ""  # gone: list again
                        break
                    version = (body.get("metadata") or {}).get("resourceVersion", version)
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        on_event(kind, body, time.monotonic())
        # Any failure of one request (the client's ApiException for an error answer
        # too, which this layer may not import) is counted and taken up again.
        except Exception as exc:  # noqa: BLE001
            if breaks is not None:
                key = f"{path}: {type(exc).__name__}"
                breaks[key] = breaks.get(key, 0) + 1
            if getattr(exc, "status", None) == 410:
                version = ""
            await asyncio.sleep(1.0)


async def watch_events(
    api: KubeApi, path: str, version: str, query: Mapping[str, str] | None = None
) -> AsyncGenerator[dict[str, Any]]:
    """The events of one watch request on ``path`` from ``version`` (``""``: from
    now), bookmarks included, until the server ends it (its 300 s timeout)."""
    asked = [
        *(query or {}).items(),
        ("watch", "1"),
        ("timeoutSeconds", "300"),
        ("allowWatchBookmarks", "true"),
    ]
    if version:
        asked.append(("resourceVersion", version))
    response = await api.api.call_api(
        path,
        "GET",
        query_params=asked,
        header_params={"Accept": "application/json"},
        _preload_content=False,
        _return_http_data_only=True,
        _request_timeout=900,
        auth_settings=["BearerToken"],
    )
    async with contextlib.aclosing(_lines(response)) as lines:
        async for line in lines:
            event: dict[str, Any] = json.loads(line)
            yield event


async def _lines(response: Any) -> AsyncGenerator[bytes]:
    try:
        while line := await response.content.readline():
            if line.strip():
                yield line
    finally:
        response.release()
