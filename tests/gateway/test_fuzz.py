"""Schemathesis against the gateway's own ``openapi.yaml``: every route, with the
tokens the document names, valid and invalid requests. No answer is a 5xx, and every
answer conforms to the document: a documented status, its content type, its headers
and its body (errors are the JSON error body). Valid data is taken (2xx), or refused
only for the state it meets (404 a session or snapshot that is not there, 409 a
conflict with the session's epoch or journal) — never with a 400; invalid data is
refused with a 4xx that says so.

Bounded to stay cheap in ``make test`` (a few examples per route, well under a
minute); ``SHADOWPOD_FUZZ_LONG=1`` runs many more (by hand, or in CI).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.gateway.conftest import CONTROL
from tests.gateway.test_openapi import load_spec
from tests.gateway.threaded import Gateway

LONG = os.environ.get("SHADOWPOD_FUZZ_LONG") == "1"
EXAMPLES = 300 if LONG else 6
SESSION = "fuzzed"
STREAMS = {"stream_events", "stream_journal", "owner_channel"}
# Routes that wait for the owner up to the body's ``timeout_s`` (at most 300 s).
OWNER_WAITS = {"fence", "suspend"}
# The client's read timeout: above the server's longest wait on those routes, so a
# wait the server was asked for is never taken for a hang.
READ_TIMEOUT_S = 10
OWNER_WAIT_READ_TIMEOUT_S = 300 + 30
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    positive_data_acceptance,
    negative_data_rejection,
]

# ``SHADOWPOD_FUZZ_OPERATIONS=fence,suspend``: only these operations (by operationId),
# to re-run a long run's failures without its hour.
OPERATIONS = [op for op in os.environ.get("SHADOWPOD_FUZZ_OPERATIONS", "").split(",") if op]

schema = schemathesis.openapi.from_dict(
    load_spec(),
    config=SchemathesisConfig.from_dict(
        {
            "generation": {"mode": "all", "max-examples": EXAMPLES},
            # The coverage phase sends each route its boundary values (2^63 for an
            # epoch, an empty name), missing and unknown fields, other methods.
            "phases": {"stateful": {"enabled": False}},
            "checks": {
                "positive_data_acceptance": {"expected-statuses": ["2XX", "404", "409"]},
                "negative_data_rejection": {
                    "expected-statuses": ["400", "401", "403", "404", "405", "413", "415", "422"]
                },
            },
        }
    ),
)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    journal = tmp_path_factory.mktemp("fuzz") / "j.db"
    with Gateway(journal, SESSION, max_wait_s=0.2, max_body_bytes=64 * 1024) as running:
        yield running


def token_for(operation: dict[str, Any], gateway: Gateway) -> str | None:
    schemes = {next(iter(r), "") for r in operation.get("security", [{}])}
    if "controlToken" in schemes:
        return CONTROL
    if "agentToken" in schemes:
        return gateway.agent_token
    return None  # client routes: this gateway has no client tokens


def negated(case: Any) -> set[str]:
    """Where a negative case's invalid part is ("path", "query", "header", "body"):
    steering must not mend it, or the check would see valid data accepted."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_negative:
        return set()
    data = meta.phase.data
    found = [getattr(data, "parameter_location", None)]
    found += [m.parameter_location for m in getattr(data, "mutations", ())]
    places = {str(place.value) for place in found if place is not None and place.value}
    return places or {"path", "query", "header", "body"}  # not said: mend nothing


def steer(case: Any) -> None:
    """Keep generated requests on the session that exists most of the time (random
    names only reach 404s), and within the test's time."""
    raw = case.operation.definition.raw
    invalid = negated(case)
    path = case.path_parameters or {}
    session = path.get("session")
    deleting = raw.get("operationId") == "delete_session"
    # Three in four generated names are replaced (deterministically: not hash()).
    if (
        "path" not in invalid
        and isinstance(session, str)
        and not deleting
        and zlib.crc32(session.encode()) % 4
    ):
        path["session"] = SESSION
    query = case.query or {}
    if "wait" in query and "query" not in invalid:
        query["wait"] = 0.1
    body = case.body
    snapshot = path.get("watermark")
    if raw.get("operationId") == "put_snapshot" and isinstance(body, dict) and not invalid:
        # The document must be the state at the URL's watermark, which JSON Schema
        # cannot say (one value equal to another): the test makes a valid pair.
        body["watermark"] = snapshot
    if raw.get("operationId") == "restore_session" and isinstance(body, dict) and not invalid:
        # A restore may give the session a new agent token and owner key: the session
        # every other route uses keeps the ones the test holds.
        body.pop("agent_token_sha256", None)
        body.pop("owner_key", None)
    # The fence and the suspend wait up to the request's ``timeout_s`` (5 s when it is
    # left out, 300 at most) for the owner, which this test never runs: the server is
    # right to take that long. So the test asks for a short wait: a valid timeout is
    # shortened (a shorter one is valid too), a missing one supplied where the body is
    # not the invalid part; an invalid one is kept (refused at once).
    timeout = body.get("timeout_s") if isinstance(body, dict) else None
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 < timeout <= 300:
        body["timeout_s"] = min(max(timeout, 0.01), 0.05)
    elif (
        raw.get("operationId") in OWNER_WAITS
        and isinstance(body, dict)
        and "timeout_s" not in body
        and "body" not in invalid
    ):
        body["timeout_s"] = 0.05


if OPERATIONS:
    schema = schema.include(operation_id=OPERATIONS)


@schema.parametrize()
@pytest.mark.timeout(1800 if LONG else 120)
@settings(
    deadline=None,
    suppress_health_check=list(HealthCheck),
    max_examples=EXAMPLES,
    database=None,
)
def test_every_answer_conforms_to_the_document(case: Any, gateway: Gateway) -> None:
    steer(case)
    at_current_epoch(case, gateway)
    raw = case.operation.definition.raw
    token = None if "header" in negated(case) else token_for(raw, gateway)
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    if raw.get("operationId") in STREAMS:
        _check_stream(case, gateway, headers)
        return
    timeout = OWNER_WAIT_READ_TIMEOUT_S if raw.get("operationId") in OWNER_WAITS else READ_TIMEOUT_S
    case.call_and_validate(base_url=gateway.url, headers=headers, checks=CHECKS, timeout=timeout)


def at_current_epoch(case: Any, gateway: Gateway) -> None:
    """A snapshot PUT on the test's session is made at its current epoch, where the
    query is not the invalid part. A writer at another epoch is refused 409 `Fenced`
    before its body is read, whatever the body (the gateway does not read up to
    256 MiB it would refuse anyway), and rightly: a random epoch would leave an
    invalid body unchecked."""
    raw = case.operation.definition.raw
    query = case.query or {}
    if (
        raw.get("operationId") != "put_snapshot"
        or "query" in negated(case)
        or (case.path_parameters or {}).get("session") != SESSION
        or "epoch" not in query
    ):
        return
    ownership = requests.get(
        f"{gateway.url}/v1/sessions/{SESSION}/ownership",
        headers={"Authorization": f"Bearer {CONTROL}"},
        timeout=READ_TIMEOUT_S,
    )
    query["epoch"] = ownership.json()["epoch"]


def _check_stream(case: Any, gateway: Gateway, headers: dict[str, str]) -> None:
    """A stream never ends: its status and headers are checked, then it is closed."""
    kwargs = case.as_transport_kwargs(base_url=gateway.url, headers=headers)
    kwargs.pop("timeout", None)
    with requests.request(**kwargs, stream=True, timeout=5) as response:
        assert response.status_code < 500, response.text
        if case.method.upper() != case.operation.method.upper():  # a method it does not take
            assert response.status_code == 405, response.status_code
            assert case.operation.method.upper() in response.headers["Allow"].split(",")
            assert response.json()["reason"] == "MethodNotAllowed"
            return
        documented = case.operation.definition.raw["responses"]
        assert str(response.status_code) in documented, response.status_code
        if response.status_code >= 400:
            assert response.headers["Content-Type"].startswith("application/json")
            assert set(response.json()) == {"reason", "message", "errors"}
        elif response.status_code == 200:
            assert response.headers["Content-Type"].startswith("text/event-stream")
