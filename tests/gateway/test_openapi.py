"""``openapi.yaml`` documents exactly the gateway's routes, in a valid OpenAPI 3.1
shape, with the bodies of ``shadowpod.api.models`` and the tokens the routes check."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from pydantic import BaseModel

from shadowpod.api import models
from shadowpod.domain import payloads
from shadowpod.domain.entries import JournalEntry, NewEntry
from shadowpod.domain.ownership import Ownership
from shadowpod.gateway.app import make_app
from shadowpod.sessions.tokens import token_hash
from tests.gateway.conftest import CONTROL, SESSION, Session, StartGateway, call, gateway_config

METHODS = {"get", "put", "post", "delete", "patch", "options", "head", "trace"}
Operation = tuple[str, str]  # (METHOD, path)


def load_spec() -> dict[str, Any]:
    """The document as the installed package ships it."""
    text = resources.files("shadowpod.gateway").joinpath("openapi.yaml").read_text()
    spec: dict[str, Any] = yaml.safe_load(text)
    return spec


SPEC = load_spec()


def operations(spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            if method in METHODS:
                yield method.upper(), path, operation


def app_routes(tmp_path: Path) -> dict[Operation, str]:
    """(method, path) -> route name, for every route of the running app but HEAD."""
    app = make_app(gateway_config(tmp_path / "j.db"))
    routes: dict[Operation, str] = {}
    for route in app.router.routes():
        if route.method == "HEAD":
            continue
        assert route.resource is not None and route.name is not None
        routes[(route.method, route.resource.canonical)] = route.name
    return routes


def resolve(node: Any, spec: dict[str, Any] = SPEC) -> Any:
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/"), ref
        node = spec
        for part in ref[2:].split("/"):
            node = node[part]
    return node


# --- routes, both directions -----------------------------------------------------------


def test_every_route_of_the_app_is_documented(tmp_path: Path) -> None:
    documented = {(method, path) for method, path, _ in operations(SPEC)}
    missing = set(app_routes(tmp_path)) - documented
    assert not missing, f"routes missing from openapi.yaml: {sorted(missing)}"


def test_every_documented_route_exists_in_the_app(tmp_path: Path) -> None:
    documented = {(method, path) for method, path, _ in operations(SPEC)}
    stale = documented - set(app_routes(tmp_path))
    assert not stale, f"openapi.yaml documents routes the gateway lacks: {sorted(stale)}"


def test_operation_ids_are_the_route_names(tmp_path: Path) -> None:
    names = app_routes(tmp_path)
    wrong = {
        (method, path): (operation.get("operationId"), names.get((method, path)))
        for method, path, operation in operations(SPEC)
        if operation.get("operationId") != names.get((method, path))
    }
    assert not wrong, f"(operationId, route name) differ: {wrong}"


# --- OpenAPI 3.1 shape -----------------------------------------------------------------


def test_the_document_has_the_openapi_3_1_top_level_shape() -> None:
    assert re.fullmatch(r"3\.1\.\d+", str(SPEC["openapi"]))
    assert SPEC["info"]["title"] and SPEC["info"]["version"]
    assert isinstance(SPEC["paths"], dict) and SPEC["paths"]
    assert set(SPEC["components"]) >= {"schemas", "securitySchemes"}
    assert all(path.startswith("/") for path in SPEC["paths"])


def test_every_operation_has_an_id_and_responses() -> None:
    ids = []
    for method, path, operation in operations(SPEC):
        where = f"{method} {path}"
        ids.append(operation.get("operationId"))
        responses = operation.get("responses")
        assert responses, f"{where} has no responses"
        for code, response in responses.items():
            assert re.fullmatch(r"[1-5]\d\d|default", str(code)), f"{where}: code {code!r}"
            assert isinstance(code, str), f"{where}: quote status code {code} in YAML"
            assert resolve(response).get("description"), f"{where} {code} has no description"
        assert any(str(code)[0] in "12" for code in responses), f"{where}: no success"
    assert None not in ids
    assert len(ids) == len(set(ids)), "operationIds must be unique"


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def test_every_reference_resolves() -> None:
    for ref in set(_refs(SPEC)):
        assert ref.startswith("#/components/"), ref
        node: Any = SPEC
        for part in ref[2:].split("/"):
            assert isinstance(node, dict) and part in node, f"unresolved $ref {ref}"
            node = node[part]


def test_path_parameters_match_the_path_templates() -> None:
    for path, item in SPEC["paths"].items():
        templated = set(re.findall(r"{(\w+)}", path))
        for method, _, operation in [o for o in operations(SPEC) if o[1] == path]:
            params = [resolve(p) for p in item.get("parameters", [])]
            params += [resolve(p) for p in operation.get("parameters", [])]
            in_path = {p["name"] for p in params if p["in"] == "path"}
            assert in_path == templated, f"{method} {path}: path parameters {in_path}"
            assert all(p.get("required") for p in params if p["in"] == "path")
            for p in params:
                assert p["in"] in {"path", "query", "header", "cookie"}
                assert "schema" in p, f"{method} {path}: parameter {p['name']} has no schema"


def test_error_responses_are_error_bodies() -> None:
    for method, path, operation in operations(SPEC):
        if not path.startswith("/v1/"):
            continue
        for code, response in operation["responses"].items():
            if int(code) < 400:
                continue
            schema = resolve(response)["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorBody"}, f"{method} {path} {code}"
            if code == "401":
                assert "WWW-Authenticate" in resolve(response)["headers"]


def test_the_statuses_users_rely_on_are_documented() -> None:
    expected = {
        "post_message": {"202", "400", "401", "404", "413", "503"},
        "create_session": {"201", "400", "401", "409", "503"},
        "put_snapshot": {"201", "400", "401", "404", "413"},
        "delete_session": {"204", "401", "404"},
        "request_snapshot": {"202", "401", "404"},
        "append_journal": {"200", "400", "401", "404", "409", "413", "503"},
        "owner_entries": {"200", "400", "409", "410"},
        "get_events": {"200", "400", "410"},
        "get_journal": {"200", "400", "410"},
        "put_ownership": {"200", "409"},
        "fence": {"200", "409"},
        "latest_snapshot": {"200", "404"},
        "latest_snapshot_document": {"200", "404"},
        "get_snapshot_document": {"200", "400", "404"},
        "owner_channel": {"101", "409"},
        "readyz": {"200", "503"},
    }
    by_id = {op["operationId"]: set(op["responses"]) for _, _, op in operations(SPEC)}
    for operation_id, codes in expected.items():
        assert codes <= by_id[operation_id], f"{operation_id} lacks {codes - by_id[operation_id]}"


def test_streams_are_documented_as_event_streams() -> None:
    by_id = {op["operationId"]: op for _, _, op in operations(SPEC)}
    for operation_id in ("stream_events", "stream_journal"):
        ok = by_id[operation_id]["responses"]["200"]
        assert set(ok["content"]) == {"text/event-stream"}
        assert "Last-Event-ID" in {resolve(p)["name"] for p in by_id[operation_id]["parameters"]}
        assert "event: entries" in by_id[operation_id]["description"]
    channel = by_id["owner_channel"]["description"]
    for frame in ('"op": "entries"', '"op": "appended"', '"op": "error"', '"op": "superseded"'):
        assert frame in channel


# --- the bodies: schemas against shadowpod.api.models ----------------------------------

REQUEST_MODELS: dict[str, type[BaseModel]] = {
    "PostMessage": models.PostMessage,
    "AppendRequest": models.AppendRequest,
    "AckRequest": models.AckRequest,
    "DrainReport": models.DrainReport,
    "ProcessReport": models.ProcessReport,
    "CreateSession": models.CreateSession,
    "OwnerCredentialRequest": models.OwnerCredentialRequest,
    "CredentialSpec": models.CredentialSpec,
    "ScheduleSpec": models.ScheduleSpec,
    "OwnershipChange": models.OwnershipChange,
    "FenceRequest": models.FenceRequest,
    "UnfenceRequest": models.UnfenceRequest,
    "SuspendRequest": models.SuspendRequest,
    "ResumeRequest": models.ResumeRequest,
    "SnapshotRequest": models.SnapshotRequest,
    "NewEntry": NewEntry,
    # In a fixed order: every pytest-xdist worker must collect the same tests.
    **{
        model.__name__: model
        for model in sorted(set(payloads.PAYLOAD_MODELS.values()), key=lambda m: m.__name__)
    },
}
RESPONSE_MODELS: dict[str, type[BaseModel]] = {
    "ErrorBody": models.ErrorBody,
    "FieldError": models.FieldError,
    "Accepted": models.Accepted,
    "EventsPage": models.EventsPage,
    "AppendedOut": models.AppendedOut,
    "AppendResponse": models.AppendResponse,
    "Deliveries": models.Deliveries,
    "JournalPage": models.JournalPage,
    "SnapshotInfo": models.SnapshotInfoOut,
    "Snapshot": models.SnapshotOut,
    "SnapshotRequested": models.SnapshotRequested,
    "SessionCreated": models.SessionCreated,
    "OwnerCredential": models.OwnerCredential,
    "SessionSummary": models.SessionSummary,
    "SessionStatus": models.SessionStatus,
    "FenceResult": models.FenceResult,
    "SuspendResult": models.SuspendResult,
    "WakesPage": models.WakesPage,
    "WakeOut": models.WakeOut,
    "SessionActivity": models.SessionActivity,
    "SessionHistory": models.SessionHistory,
    "HistoryEvent": models.HistoryEvent,
    "Ownership": Ownership,
}
CONSTRAINTS = ("minimum", "maximum", "exclusiveMinimum", "minLength", "maxLength", "pattern")


def _model_property(schema: dict[str, Any], prop: dict[str, Any]) -> dict[str, Any]:
    """A pydantic property schema without its ``null`` branch, its enum $refs resolved."""
    if "anyOf" in prop:
        [prop] = [p for p in prop["anyOf"] if p.get("type") != "null"]
    if "$ref" in prop:
        prop = schema["$defs"][prop["$ref"].rsplit("/", 1)[1]]
    return prop


@pytest.mark.parametrize(
    ("name", "model"),
    [*REQUEST_MODELS.items(), *RESPONSE_MODELS.items()],
    ids=[*REQUEST_MODELS, *RESPONSE_MODELS],
)
def test_schemas_match_the_models(name: str, model: type[BaseModel]) -> None:
    documented = SPEC["components"]["schemas"][name]
    request = name in REQUEST_MODELS
    schema = model.model_json_schema(mode="validation" if request else "serialization")
    assert set(documented["properties"]) == set(schema["properties"]), name
    required = set(documented.get("required", []))
    if request:  # what a client must send
        assert required == set(schema.get("required", [])), name
    else:  # what a client can count on; the gateway may always send more
        assert set(schema.get("required", [])) <= required <= set(documented["properties"])
    assert documented.get("additionalProperties") is False, f"{name}: bodies forbid extras"
    for field, prop in schema["properties"].items():
        actual = _model_property(schema, prop)
        doc = resolve(documented["properties"][field])
        for key in (*CONSTRAINTS, "enum"):
            if key in actual:
                assert doc.get(key) == actual[key], f"{name}.{field}: {key}"


def test_journal_entries_are_documented_as_the_gateway_writes_them() -> None:
    entry = JournalEntry(1, "id", "message", 0, datetime.now(UTC), {})
    documented = SPEC["components"]["schemas"]["JournalEntry"]
    assert set(documented["properties"]) == set(documented["required"]) == set(entry.to_json())


# --- tokens: what the document says each route needs, against the running gateway -----


def _security(operation: dict[str, Any]) -> set[str]:
    """The schemes an operation accepts; ``""`` when it needs no token."""
    requirements = operation.get("security", SPEC.get("security", []))
    if not requirements:
        return {""}
    return {next(iter(r), "") for r in requirements}


def test_security_schemes_are_bearer_tokens() -> None:
    schemes = SPEC["components"]["securitySchemes"]
    assert set(schemes) == {"controlToken", "agentToken", "clientToken"}
    assert all((s["type"], s["scheme"]) == ("http", "bearer") for s in schemes.values())
    for method, path, operation in operations(SPEC):
        accepted = _security(operation)
        assert accepted <= {*schemes, ""}, f"{method} {path}: {accepted}"
        assert path.startswith("/v1/") or accepted == {""}, f"{method} {path}"


async def test_each_route_needs_the_token_the_document_names(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    gateway = await start_gateway(client_token_hashes=frozenset({token_hash("client")}))
    created = await call(
        http, "POST", f"{gateway.url}/v1/sessions", token=CONTROL, json={"session": SESSION}
    )
    session = Session(SESSION, created.json["agent_token"])
    tokens = {
        "": None,
        "clientToken": "client",
        "agentToken": session.agent_token,
        "controlToken": CONTROL,
    }
    for method, path, operation in operations(SPEC):
        if operation["operationId"] in ("delete_session", "create_session"):
            continue  # checked below, without deleting the session or creating others
        url = gateway.url + path.format(session=SESSION, watermark=0)
        accepted = _security(operation)
        for scheme, token in tokens.items():
            status = await _status(http, method, url, token)
            # The gateway has client tokens: only routes open to all need none.
            opens = (
                bool(scheme and scheme in accepted) or scheme == "controlToken" or accepted == {""}
            )
            where = f"{method} {path} with {scheme or 'no token'}"
            assert (status != 401) == opens, f"{where}: {status}"
    for scheme, token in tokens.items():
        status = await _status(http, "DELETE", f"{gateway.url}/v1/sessions/nobody", token)
        assert status == (404 if scheme == "controlToken" else 401)


async def _status(http: aiohttp.ClientSession, method: str, url: str, token: str | None) -> int:
    """The answer's status, without reading a stream's body."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with http.request(method, url, headers=headers, params={"epoch": "1"}) as response:
        return response.status


async def test_client_tokens_are_optional_where_the_document_says_so(
    http: aiohttp.ClientSession, url: str, session: Session
) -> None:
    """A gateway without client tokens opens the client routes to anyone."""
    for method, path, operation in operations(SPEC):
        if "" not in _security(operation) or operation["operationId"] == "post_message":
            continue
        status = await _status(http, method, url + path.format(session=session.name), None)
        assert status == 200, f"{method} {path}: {status}"
