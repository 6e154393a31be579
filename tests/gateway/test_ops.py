"""Operations: health, readiness and Prometheus metrics."""

from __future__ import annotations

import re

import aiohttp

from shadowpod.api.models import OwnershipChange
from shadowpod.client.gateway import GatewayClient
from tests.gateway.conftest import Session, call, reply


async def test_health_and_readiness_need_no_token(http: aiohttp.ClientSession, url: str) -> None:
    health = await call(http, "GET", f"{url}/healthz")
    ready = await call(http, "GET", f"{url}/readyz")
    assert (health.status, health.json) == (200, {"status": "ok"})
    assert (ready.status, ready.json) == (200, {"status": "ready"})


def sample(metrics: str, name: str, labels: str = "") -> float:
    """The value of one sample in Prometheus text (0 when absent)."""
    pattern = rf"^{re.escape(name)}{re.escape(labels)} (\S+)$"
    found = re.search(pattern, metrics, re.MULTILINE)
    return 0.0 if found is None else float(found.group(1))


async def test_metrics_count_appends_duplicates_fenced_writes_and_requests(
    http: aiohttp.ClientSession,
    url: str,
    agent: GatewayClient,
    client: GatewayClient,
    control: GatewayClient,
    owned: Session,
) -> None:
    hi = await client.post_message(owned.name, "hi", id="m-1")
    await client.post_message(owned.name, "hi", id="m-1")
    await agent.append(owned.name, epoch=1, entries=[reply(hi.seq, "hello")])
    await control.set_ownership(owned.name, OwnershipChange(expect_epoch=1, epoch=2, owner="pod-b"))
    refused = await call(
        http,
        "POST",
        f"{url}/v1/sessions/{owned.name}/journal",
        token=owned.agent_token,
        json={"epoch": 1, "entries": [{"kind": "memory", "payload": {"key": "k"}}]},
    )
    assert refused.status == 409

    response = await call(http, "GET", f"{url}/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    metrics = response.text
    assert sample(metrics, "shadowpod_journal_appends_total", '{source="client"}') == 1
    assert sample(metrics, "shadowpod_journal_appends_total", '{source="owner"}') == 1
    assert sample(metrics, "shadowpod_duplicate_ids_total", '{source="client"}') == 1
    assert sample(metrics, "shadowpod_fenced_writes_refused_total") == 1
    assert sample(metrics, "shadowpod_deliveries_total") == 0  # the owner never asked
    requests = sample(
        metrics,
        "shadowpod_http_requests_total",
        '{code="409",route="/v1/sessions/{session}/journal"}',
    )
    assert requests == 1
    assert owned.agent_token not in metrics and owned.name not in metrics  # bounded labels
