"""The few raw API calls the kubelet makes (JSON in and out, no client models: the
kubelet reads every pod in the cluster, and model conversion would cost more than
everything else it does)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from kubernetes_asyncio import client

MERGE = "application/merge-patch+json"


async def call(
    api: client.ApiClient,
    method: str,
    path: str,
    *,
    body: Any = None,
    query: Mapping[str, str] | None = None,
    content_type: str = "application/json",
) -> Any:
    response = await api.call_api(
        path,
        method,
        query_params=list((query or {}).items()),
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        body=body,
        _preload_content=False,
        _return_http_data_only=True,
    )
    text = await response.text()
    return json.loads(text) if text else None


async def watch(
    api: client.ApiClient, path: str, query: Mapping[str, str]
) -> AsyncIterator[dict[str, Any]]:
    """The events of one watch request, until the server ends it."""
    response = await api.call_api(
        path,
        "GET",
        query_params=[*query.items(), ("watch", "true")],
        header_params={"Accept": "application/json"},
        _preload_content=False,
        _return_http_data_only=True,
    )
    try:
        async for line in response.content:
            if line.strip():
                yield json.loads(line)
    finally:
        response.release()
