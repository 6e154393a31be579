"""The CRDs in crds/: generated from the models, structural, and as kubectl shows them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, Field, ValidationError

from shadowpod.engine.record import Phase
from shadowpod.kube.models.crd import custom_resource_definition, manifests
from shadowpod.kube.models.openapi import SchemaConversionError, structural_schema
from shadowpod.kube.models.structural import crd_problems
from shadowpod.kube.models.v1alpha1 import (
    RESOURCES,
    AgentMigration,
    AgentMigrationStatus,
    AgentSession,
    AgentSessionSpec,
    MigrationPolicy,
    SessionPhase,
    ValidationPolicy,
)

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "crds"


def shadowpod(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shadowpod", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
    )


def version_of(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    return version  # type: ignore[no-any-return]


def test_checked_in_crds_are_what_the_models_generate() -> None:
    generated = manifests(RESOURCES)
    checked_in = {path.name for path in CRDS.glob("*.yaml")}
    assert checked_in == set(generated), (
        f"crds/ holds {sorted(checked_in)}, the models generate {sorted(generated)}:"
        " run `shadowpod crds` from the repository root and commit the result"
    )
    for name, text in generated.items():
        assert (CRDS / name).read_text() == text, (
            f"crds/{name} differs from the models: run `shadowpod crds` from the repository"
            " root and commit the result"
        )


def test_generated_crds_are_structural_and_valid() -> None:
    for resource in RESOURCES:
        crd = yaml.safe_load(
            manifests([resource])[f"shadowpod.dev_{resource.definition.plural}.yaml"]
        )
        assert crd_problems(crd) == [], resource.definition.kind


def test_the_command_writes_the_crds(tmp_path: Path) -> None:
    result = shadowpod("crds", "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    for name, text in manifests(RESOURCES).items():
        assert (tmp_path / "out" / name).read_text() == text
    assert result.stdout.split() == [str(tmp_path / "out" / name) for name in manifests(RESOURCES)]


def test_check_says_what_to_run_when_a_file_is_stale(tmp_path: Path) -> None:
    assert shadowpod("crds", "-o", str(tmp_path)).returncode == 0
    assert shadowpod("crds", "-o", str(tmp_path), "--check").returncode == 0
    stale = tmp_path / "shadowpod.dev_agentsessions.yaml"
    stale.write_text(stale.read_text().replace("maxLength: 512", "maxLength: 511"))
    result = shadowpod("crds", "-o", str(tmp_path), "--check")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: shadowpod.dev_agentsessions.yaml in {tmp_path} differ(s) from the models:"
        " run `shadowpod crds` and commit the result"
    ]
    assert "Traceback" not in result.stderr


def test_an_unwritable_directory_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = shadowpod("crds", "-o", str(blocker / "crds"))
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith(f"error: cannot write to {blocker / 'crds'}")


# --- how kubectl shows the kinds ----------------------------------------------------------


def test_names_short_names_and_categories() -> None:
    session = custom_resource_definition(AgentSession)
    migration = custom_resource_definition(AgentMigration)
    assert session["metadata"]["name"] == "agentsessions.shadowpod.dev"
    assert migration["metadata"]["name"] == "agentmigrations.shadowpod.dev"
    assert session["spec"]["names"] == {
        "kind": "AgentSession",
        "listKind": "AgentSessionList",
        "plural": "agentsessions",
        "singular": "agentsession",
        "shortNames": ["ags"],
        "categories": ["shadowpod"],
    }
    assert migration["spec"]["names"]["shortNames"] == ["agm"]
    assert migration["spec"]["names"]["categories"] == ["shadowpod"]
    for crd in (session, migration):
        assert crd["spec"]["group"] == "shadowpod.dev"
        assert crd["spec"]["scope"] == "Namespaced"
        version = version_of(crd)
        assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
        assert version["subresources"] == {"status": {}}


def columns(crd: dict[str, Any]) -> dict[str, tuple[str, str, int]]:
    return {
        column["name"]: (column["jsonPath"], column["type"], column.get("priority", 0))
        for column in version_of(crd)["additionalPrinterColumns"]
    }


def test_session_columns() -> None:
    shown = columns(custom_resource_definition(AgentSession))
    assert shown == {
        "Phase": (".status.phase", "string", 0),
        "Image": (".status.image", "string", 0),
        "Epoch": (".status.epoch", "integer", 0),
        "Owner": (".status.ownerPod", "string", 0),
        "Ready": ('.status.conditions[?(@.type=="Ready")].status', "string", 0),
        "Age": (".metadata.creationTimestamp", "date", 0),
        "Node": (".status.nodeName", "string", 1),
        "Desired": (".spec.image", "string", 1),
        "Message": ('.status.conditions[?(@.type=="Ready")].message', "string", 1),
    }


def test_migration_columns() -> None:
    shown = columns(custom_resource_definition(AgentMigration))
    assert shown == {
        "Session": (".spec.sessionRef.name", "string", 0),
        "Image": (".spec.target.image", "string", 0),
        "Node": (".spec.target.nodeName", "string", 0),
        "Phase": (".status.phase", "string", 0),
        "Age": (".metadata.creationTimestamp", "date", 0),
        "Reason": (".spec.reason", "string", 1),
        "Fence Pause (ms)": (".status.fencePauseMilliseconds", "integer", 1),
        "Message": (".status.message", "string", 1),
    }


def resolve(schema: dict[str, Any], json_path: str) -> dict[str, Any]:
    """The schema node a printer column's path reads (filters pick a list item)."""
    node = schema
    for step in json_path.strip(".").split("."):
        name, _, _ = step.partition("[")
        if name == "metadata":
            return {"type": "object"}
        node = node["properties"][name]
        if "[" in step:
            node = node["items"]
    return node


def test_every_column_reads_a_field_of_its_type() -> None:
    as_schema = {"integer": "integer", "string": "string", "date": "string"}
    for resource in RESOURCES:
        crd = custom_resource_definition(resource)
        schema = version_of(crd)["schema"]["openAPIV3Schema"]
        for column in version_of(crd)["additionalPrinterColumns"]:
            if column["jsonPath"].startswith(".metadata."):
                continue
            path = re.sub(r'\[\?\(@\.type=="\w+"\)\]', "[]", column["jsonPath"])
            node = resolve(schema, path)
            assert node["type"] == as_schema[column["type"]], column


# --- the schema's contents ----------------------------------------------------------------


def walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)]
    for name, child in node.get("properties", {}).items():
        found += walk(child, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        found += walk(node["additionalProperties"], f"{path}{{}}")
    if isinstance(node.get("items"), dict):
        found += walk(node["items"], f"{path}[]")
    return found


def is_unbounded(node: dict[str, Any]) -> bool:
    kind = node.get("type")
    if node.get("x-kubernetes-int-or-string") or kind == "string":
        return not ({"maxLength", "enum", "format"} & set(node))
    if kind == "array":
        return "maxItems" not in node
    if kind == "object":
        return "additionalProperties" in node and "maxProperties" not in node
    if kind == "integer":
        return "minimum" not in node or ("maximum" not in node and node.get("format") != "int64")
    return False


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.definition.kind)
def test_every_field_is_bounded(resource: Any) -> None:
    """CEL's cost estimate assumes the worst for anything unbounded (a rule over an
    unbounded list is refused at CRD creation), etcd holds objects of 1.5 MiB at most,
    and a count the operator reads has a range: every string, list, map and integer of
    the API declares its bounds."""
    schema = version_of(custom_resource_definition(resource))["schema"]["openAPIV3Schema"]
    # apiVersion, kind and metadata are the API server's own
    skipped = ("", ".metadata", ".apiVersion", ".kind")
    unbounded = [path for path, node in walk(schema) if path not in skipped and is_unbounded(node)]
    assert unbounded == []


def test_keyed_lists_merge_by_their_keys() -> None:
    session = version_of(custom_resource_definition(AgentSession))["schema"]["openAPIV3Schema"]
    spec = session["properties"]["spec"]["properties"]
    for field, key in (("env", "name"), ("credentials", "name"), ("schedules", "name")):
        assert spec[field]["x-kubernetes-list-type"] == "map"
        assert spec[field]["x-kubernetes-list-map-keys"] == [key]
    assert spec["command"]["x-kubernetes-list-type"] == "atomic"
    conditions = session["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert conditions["items"]["properties"]["type"]["enum"] == ["Ready", "Migrating", "Degraded"]
    assert conditions["maxItems"] == 3


def test_defaults_in_the_crd_are_the_models_defaults() -> None:
    """The API server fills in the CRD's defaults; the operator reads objects with the
    models: both must arrive at the same values."""
    spec = version_of(custom_resource_definition(AgentSession))["schema"]["openAPIV3Schema"][
        "properties"
    ]["spec"]["properties"]
    policy = spec["migration"]["properties"]
    model = MigrationPolicy()
    defaulted = {name: field["default"] for name, field in policy.items() if "default" in field}
    assert defaulted == model.to_kube()
    assert set(policy) - set(defaulted) == {"validation", "persona"}  # gates are asked for
    # An object's default is written out whole: a real API server checks it (CEL rules
    # included) as written, without filling in the defaults nested in it.
    assert spec["migration"]["default"] == defaulted
    gate = policy["validation"]["properties"]
    # Lists default to absent in the CRD and to empty in the models: the same to both.
    defaults = ValidationPolicy().to_kube()
    judge_defaults = {k: v for k, v in defaults["gate"].items() if v != []}
    assert {k: v["default"] for k, v in gate.items() if "default" in v} == {
        k: v for k, v in defaults.items() if k != "gate" and v != []
    } | {"gate": judge_defaults}
    judge = gate["gate"]["properties"]
    assert {k: v["default"] for k, v in judge.items() if "default" in v} == judge_defaults
    assert spec["checkpoint"]["properties"]["intervalEntries"]["default"] == 10_000
    assert spec["journalRetentionPolicy"]["properties"]["whenDeleted"]["default"] == "Retain"


def test_migration_phases_are_the_engines() -> None:
    status = version_of(custom_resource_definition(AgentMigration))["schema"]["openAPIV3Schema"][
        "properties"
    ]["status"]["properties"]
    assert status["phase"]["enum"] == [phase.value for phase in Phase]
    assert status["phases"]["items"]["properties"]["phase"]["enum"] == [p.value for p in Phase]
    assert status["phases"]["maxItems"] == len(Phase)


# --- the models ---------------------------------------------------------------------------


def test_models_take_camel_case_and_write_it_back() -> None:
    spec = AgentSessionSpec.model_validate(
        {"image": "refagent:v1", "migration": {"fenceTimeoutSeconds": 5}}
    )
    assert spec.migration.fence_timeout_seconds == 5
    assert spec.migration.max_duration_seconds == 120
    written = spec.to_kube()
    assert written["migration"]["fenceTimeoutSeconds"] == 5
    assert "imagePullPolicy" not in written  # unset optional fields are left out
    assert AgentSessionSpec(image="refagent:v1").to_kube()["image"] == "refagent:v1"


@pytest.mark.parametrize(
    ("spec", "location"),
    [
        (
            {"image": "refagent:v1", "migration": {"fenceTimeoutSeconds": "2"}},
            "fenceTimeoutSeconds",
        ),
        (
            {"image": "refagent:v1", "migration": {"fenceTimeoutSeconds": 601}},
            "fenceTimeoutSeconds",
        ),
        ({"image": "refagent:v1", "rollout": {}}, "rollout"),
        ({"image": "ref agent"}, "image"),
        ({"image": "refagent:v1", "resources": {"limits": {"cpu": "-1"}}}, "limits.cpu"),
        ({"image": "refagent:v1", "resources": {"limits": {"cpu": True}}}, "limits.cpu"),
    ],
)
def test_models_refuse_what_the_api_server_refuses(spec: dict[str, Any], location: str) -> None:
    with pytest.raises(ValidationError) as error:
        AgentSessionSpec.model_validate(spec)
    assert location in str(error.value)


def test_status_keeps_one_condition_per_type() -> None:
    condition = {
        "type": "Succeeded",
        "status": "False",
        "lastTransitionTime": "2026-11-24T10:00:00Z",
        "reason": "Running",
        "message": "",
    }
    with pytest.raises(ValidationError, match="one condition per type: Succeeded"):
        AgentMigrationStatus.model_validate({"conditions": [condition, condition]})


def test_times_are_written_as_rfc3339_utc() -> None:
    status = AgentMigrationStatus.model_validate(
        {
            "phase": "Snapshotting",
            "startTime": "2026-11-24T11:00:00.123456+01:00",
            "phases": [{"phase": "Pending", "startTime": "2026-11-24T10:00:00.5Z"}],
            "conditions": [
                {
                    "type": "Failed",
                    "status": "False",
                    "lastTransitionTime": "2026-11-24T10:00:00.9Z",
                    "reason": "Running",
                    "message": "",
                }
            ],
        }
    ).to_kube()
    assert status["startTime"] == "2026-11-24T10:00:00.123456Z"  # MicroTime
    assert status["phases"][0]["startTime"] == "2026-11-24T10:00:00.500000Z"
    assert status["conditions"][0]["lastTransitionTime"] == "2026-11-24T10:00:00Z"  # Time


def test_a_time_without_zone_is_refused() -> None:
    with pytest.raises(ValidationError, match="a time needs its zone"):
        AgentMigrationStatus.model_validate({"startTime": "2026-11-24T10:00:00"})


def test_whole_objects_read_back() -> None:
    session = AgentSession.model_validate(
        {
            "apiVersion": "shadowpod.dev/v1alpha1",
            "kind": "AgentSession",
            "metadata": {"name": "s", "namespace": "default", "uid": "u", "generation": 2},
            "spec": {"image": "refagent:v1"},
            "status": {"phase": "Running", "epoch": 3, "ownerPod": "s-3"},
        }
    )
    assert session.status is not None and session.status.phase is SessionPhase.RUNNING
    assert session.metadata.generation == 2
    with pytest.raises(ValidationError, match="apiVersion|api_version"):
        AgentSession.model_validate(
            {"apiVersion": "shadowpod.dev/v1", "kind": "AgentSession", "spec": {"image": "x"}}
        )


def test_what_a_crd_cannot_express_is_refused_when_generating() -> None:
    class Union(BaseModel):
        value: int | str

    class Exclusive(BaseModel):
        value: int = Field(gt=0)

    with pytest.raises(SchemaConversionError, match=r"Union\.value: a union other than"):
        structural_schema(Union)
    with pytest.raises(SchemaConversionError, match="'exclusiveMinimum' is not carried"):
        structural_schema(Exclusive)


def _object_defaults(node: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any], Any]]:
    """Every object schema with a default, with that default (depth first)."""
    found = []
    if isinstance(node.get("default"), dict) and "properties" in node:
        found.append((path, node, node["default"]))
    for name, child in (node.get("properties") or {}).items():
        found += _object_defaults(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        found += _object_defaults(node["items"], f"{path}[]")
    return found


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.__name__)
def test_an_object_default_holds_the_defaults_of_its_fields(resource: Any) -> None:
    """A real API server checks a default as written, CEL rules included, without
    filling in the defaults nested in it: `default: {}` on spec.migration failed every
    rule reading one of its fields ("no such key: fenceTimeoutSeconds") and the CRD was
    refused, so `helm install` failed on a real cluster."""
    crd = custom_resource_definition(resource)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node, default in _object_defaults(schema, "openAPIV3Schema"):
        for name, field in node["properties"].items():
            if "default" in field:
                assert default.get(name) == field["default"], f"{path}.default.{name}"
