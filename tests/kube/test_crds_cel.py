"""Objects checked against the CRDs as the API server checks them, CEL rules included.

``admit`` does what the API server does with a create or an update: drop nulls, fill
in defaults, validate against the schema (``values``) and evaluate every
``x-kubernetes-validations`` rule with cel-python — a transition rule (one that reads
``oldSelf``) only on an update, where the old value can be correlated (map-list items
by their keys; never items of other lists). Every rule of the CRDs is compiled, its
field references checked against the schema (as the API server's type check does), and
evaluated on objects it must admit and objects it must refuse; the examples in
examples/02-kubernetes must be admitted.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import celpy
import pytest
import yaml
from celpy import celtypes

from shadowpod.kube.models import values
from shadowpod.kube.models.crd import custom_resource_definition
from shadowpod.kube.models.resource import CustomResource
from shadowpod.kube.models.v1alpha1 import RESOURCES

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "02-kubernetes"
RULES: Final = "x-kubernetes-validations"
MISSING: Final[Any] = object()
_STRING_LITERAL = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_REFERENCE = re.compile(r"\b(self|oldSelf)((?:\.[A-Za-z_][A-Za-z0-9_]*)+)(\s*\()?")

KINDS: dict[str, type[CustomResource]] = {r.definition.kind: r for r in RESOURCES}


@functools.cache
def schema_of(kind: str) -> dict[str, Any]:
    crd = custom_resource_definition(KINDS[kind])
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


# --- CEL ----------------------------------------------------------------------------------

_CEL = celpy.Environment()


@functools.cache
def program(rule: str) -> celpy.Runner:
    return _CEL.program(_CEL.compile(rule))


def uses_old_self(rule: str) -> bool:
    return "oldSelf" in re.findall(r"\b\w+\b", _STRING_LITERAL.sub("''", rule))


def holds(rule: str, value: Any, old: Any = MISSING) -> bool:
    """The rule's verdict on ``value``; an evaluation error fails the test, because the
    API server would answer it with a message that is not the rule's."""
    activation = {"self": celpy.json_to_cel(value)}
    if old is not MISSING:
        activation["oldSelf"] = celpy.json_to_cel(old)
    result = program(rule).evaluate(activation)
    assert isinstance(result, celtypes.BoolType), f"{rule!r} gave {result!r}, not a bool"
    return bool(result)


@dataclass(frozen=True)
class Site:
    """A rule, where it applies in an object, and the values it sees there."""

    path: str
    schema_path: str
    rule: dict[str, str]
    value: Any
    old: Any


def sites(
    schema: dict[str, Any], value: Any, old: Any, path: str = "", schema_path: str = ""
) -> Iterator[Site]:
    for rule in schema.get(RULES, []):
        yield Site(path or "<root>", schema_path or "<root>", rule, value, old)
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for name, item in value.items():
            child = properties.get(name, extra if isinstance(extra, dict) else None)
            if child is None:
                continue
            before = old.get(name, MISSING) if isinstance(old, dict) else MISSING
            step = name if name in properties else "{}"
            yield from sites(
                child,
                item,
                before,
                f"{path}.{name}".lstrip("."),
                f"{schema_path}.{step}".lstrip("."),
            )
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        keys = schema.get("x-kubernetes-list-map-keys", [])
        for index, item in enumerate(value):
            before = MISSING
            if schema.get("x-kubernetes-list-type") == "map" and isinstance(old, list):
                matches = [o for o in old if all(o.get(k) == item.get(k) for k in keys)]
                before = matches[0] if matches else MISSING
            yield from sites(schema["items"], item, before, f"{path}[{index}]", f"{schema_path}[]")


def broken_rules(obj: dict[str, Any], old: dict[str, Any] | None = None) -> Iterator[Site]:
    """The rules ``obj`` (defaulted, as stored) breaks, in a create or an update from ``old``."""
    schema = schema_of(obj["kind"])
    before = values.with_defaults(schema, old) if old is not None else MISSING
    for site in sites(schema, values.with_defaults(schema, obj), before):
        rule = site.rule["rule"]
        if uses_old_self(rule) and site.old is MISSING:
            continue  # a transition rule runs only where there was a value before
        if not holds(rule, site.value, site.old if uses_old_self(rule) else MISSING):
            yield site


def admit(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """What the API server would refuse in a create of ``obj`` (or an update from ``old``),
    as ``<path>: <message>``; empty when it would admit it."""
    schema = schema_of(obj["kind"])
    refused = values.object_problems(schema, values.with_defaults(schema, obj))
    refused += [f"{site.path}: {site.rule['message']}" for site in broken_rules(obj, old)]
    return refused


def rule_sites(
    schema: dict[str, Any], path: str = ""
) -> Iterator[tuple[str, dict[str, Any], dict[str, str]]]:
    """Every rule of a schema: (schema path, the node it is on, the rule)."""
    for rule in schema.get(RULES, []):
        yield path or "<root>", schema, rule
    for name, child in schema.get("properties", {}).items():
        yield from rule_sites(child, f"{path}.{name}".lstrip("."))
    if isinstance(schema.get("additionalProperties"), dict):
        yield from rule_sites(schema["additionalProperties"], f"{path}.{{}}".lstrip("."))
    if isinstance(schema.get("items"), dict):
        yield from rule_sites(schema["items"], f"{path}[]")


ALL_RULES = [
    (kind, path, node, rule) for kind in KINDS for path, node, rule in rule_sites(schema_of(kind))
]


# --- objects ------------------------------------------------------------------------------

DELETE: Final[Any] = object()


def edit(obj: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``obj`` with dotted paths (``spec.env.0.value``) set, or deleted."""
    result = copy.deepcopy(obj)
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node: Any = result
        for step in parents:
            node = node[int(step)] if isinstance(node, list) else node.setdefault(step, {})
        key: Any = int(last) if isinstance(node, list) else last
        if value is DELETE:
            del node[key]
        else:
            node[key] = value
    return result


SESSION: Final = {
    "apiVersion": "shadowpod.dev/v1alpha1",
    "kind": "AgentSession",
    "metadata": {"name": "ada"},
    "spec": {
        "image": "refagent:v1",
        "env": [
            {"name": "MODE", "value": "fast"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "t", "key": "token"}}},
        ],
        "memory": {"emptyDir": {}},
        "credentials": [{"name": "weather", "secretRef": {"name": "weather"}}],
    },
    "status": {"phase": "Running", "epoch": 2, "journal": {"headSeq": 10, "ackedSeq": 9}},
}
MIGRATION: Final = {
    "apiVersion": "shadowpod.dev/v1alpha1",
    "kind": "AgentMigration",
    "metadata": {"name": "ada-to-v2"},
    "spec": {"sessionRef": {"name": "ada"}, "target": {"image": "refagent:v2"}},
    "status": {"phase": "CatchingUp", "policy": {}},
}
FINISHED: Final = {"status.phase": "Succeeded", "status.result": "Succeeded"}


@dataclass(frozen=True)
class Case:
    name: str
    new: dict[str, Any]
    old: dict[str, Any] | None = None
    refused: str | None = None  # a piece of the one message expected; None: admitted


CASES: Final = [
    Case("the base session", SESSION),
    Case("the base migration", MIGRATION),
    # AgentSession: the name
    Case("a 63-character name", edit(SESSION, {"metadata.name": "a" * 63})),
    Case(
        "a 64-character name",
        edit(SESSION, {"metadata.name": "a" * 64}),
        refused="<root>: an AgentSession's name is at most 63 characters",
    ),
    # env
    Case(
        "valueFrom with two sources",
        edit(SESSION, {"spec.env.1.valueFrom.fieldRef": {"fieldPath": "spec.nodeName"}}),
        refused="spec.env[1].valueFrom: valueFrom needs exactly one of",
    ),
    Case(
        "valueFrom without a source",
        edit(SESSION, {"spec.env.1.valueFrom": {}}),
        refused="spec.env[1].valueFrom: valueFrom needs exactly one of",
    ),
    Case(
        "value and valueFrom",
        edit(SESSION, {"spec.env.1.value": "x"}),
        refused="spec.env[1]: an env entry takes value or valueFrom, not both",
    ),
    Case(
        "an env name with SHADOWPOD_ inside", edit(SESSION, {"spec.env.0.name": "MY_SHADOWPOD_X"})
    ),
    Case(
        "an env name the operator sets",
        edit(SESSION, {"spec.env.0.name": "SHADOWPOD_EPOCH"}),
        refused="spec.env[0]: env names starting with SHADOWPOD_ are set by the operator",
    ),
    # memory
    Case(
        "memory with two volumes",
        edit(SESSION, {"spec.memory.persistentVolumeClaim": {"claimName": "mem"}}),
        refused="spec.memory: memory takes one volume",
    ),
    Case(
        "memory with no volume",
        edit(SESSION, {"spec.memory": {"mountPath": "/data"}}),
        refused="spec.memory: memory takes one volume",
    ),
    Case(
        "memory on a claim",
        edit(SESSION, {"spec.memory": {"persistentVolumeClaim": {"claimName": "m"}}}),
    ),
    Case(
        "a mount path that climbs",
        edit(SESSION, {"spec.memory.mountPath": "/data/../etc"}),
        refused="spec.memory: memory.mountPath must not contain '..'",
    ),
    Case(
        "a mount path ending in ..",
        edit(SESSION, {"spec.memory.mountPath": "/data/.."}),
        refused="spec.memory: memory.mountPath must not contain '..'",
    ),
    Case(
        "a mount path over the operator's files",
        edit(SESSION, {"spec.memory.mountPath": "/var/run/shadowpod/identity"}),
        refused="nor lie under /var/run/shadowpod",
    ),
    Case(
        "a mount path with dots in a name", edit(SESSION, {"spec.memory.mountPath": "/data/..x/y"})
    ),
    # checkpoints
    Case("checkpoints never", edit(SESSION, {"spec.checkpoint.intervalEntries": 0})),
    Case("checkpoints every 100 entries", edit(SESSION, {"spec.checkpoint.intervalEntries": 100})),
    Case(
        "checkpoints every 50 entries",
        edit(SESSION, {"spec.checkpoint.intervalEntries": 50}),
        refused="spec.checkpoint: checkpoint.intervalEntries is 0 (never) or at least 100",
    ),
    # the migration policy
    Case(
        "a phase as long as the migration",
        edit(SESSION, {"spec.migration.phaseTimeoutSeconds": 120}),
    ),
    Case(
        "a phase longer than the migration",
        edit(SESSION, {"spec.migration.phaseTimeoutSeconds": 121}),
        refused="spec.migration: phaseTimeoutSeconds may not exceed maxDurationSeconds",
    ),
    # the upgrade gate
    Case(
        "a semantic gate on five live turns and a golden",
        edit(
            SESSION,
            {
                "spec.migration.validation": {
                    "turns": 5,
                    "gate": {"judge": "Semantic", "agreementPercent": 90},
                    "goldens": [{"configMap": "goldens", "key": "ada.jsonl"}],
                }
            },
        ),
    ),
    Case(
        "an LLM judge with its key in a Secret",
        edit(
            SESSION,
            {
                "spec.migration.validation.gate": {
                    "judge": "LLM",
                    "llm": {
                        "url": "http://judge:8000/v1",
                        "model": "small",
                        "apiKeySecretRef": {"name": "judge", "key": "key"},
                    },
                }
            },
        ),
    ),
    Case(
        "an LLM judge without its endpoint",
        edit(SESSION, {"spec.migration.validation.gate": {"judge": "LLM"}}),
        refused="spec.migration.validation.gate: judge LLM needs llm",
    ),
    Case(
        "an LLM judge's key written in the policy",
        edit(
            SESSION,
            {
                "spec.migration.validation.gate": {
                    "judge": "LLM",
                    "llm": {"url": "http://judge:8000/v1", "model": "small", "apiKey": "sk-1"},
                }
            },
        ),
        refused="apiKey",
    ),
    Case(
        "a gate that compares nothing",
        edit(SESSION, {"spec.migration.validation": {"turns": 0}}),
        refused="spec.migration.validation: validation compares nothing",
    ),
    Case(
        "a gate waiting longer than the migration may last",
        edit(SESSION, {"spec.migration.validation": {"timeoutSeconds": 121}}),
        refused="spec.migration: validation.timeoutSeconds may not exceed maxDurationSeconds",
    ),
    Case(
        "an agreement over 100 percent",
        edit(SESSION, {"spec.migration.validation": {"gate": {"agreementPercent": 101}}}),
        refused="agreementPercent",
    ),
    Case(
        "a migration's own gate that compares nothing",
        edit(MIGRATION, {"spec.validation": {"turns": 0}}),
        refused="spec.validation: validation compares nothing",
    ),
    Case(
        "a persona check that re-anchors",
        edit(SESSION, {"spec.migration.persona": {"judge": "Semantic", "onDrift": "Reanchor"}}),
    ),
    Case(
        "a persona check that would drift on a whim",
        edit(SESSION, {"spec.migration.persona": {"onDrift": "Ignore"}}),
        refused="onDrift",
    ),
    Case(
        "a migration's persona check changed after its creation",
        edit(MIGRATION, {"spec.persona": {"onDrift": "Rollback"}}),
        old=edit(MIGRATION, {"spec.persona": {"onDrift": "Warn"}}),
        refused="spec: persona is immutable",
    ),
    Case(
        "a migration's gate changed after its creation",
        edit(MIGRATION, {"spec.validation": {"turns": 3}}),
        old=edit(MIGRATION, {"spec.validation": {"turns": 5}}),
        refused="spec: validation is immutable",
    ),
    # forkFrom
    Case(
        "a deleted session's journal kept 7 days",
        edit(SESSION, {"spec.journalRetentionPolicy": {"retainFor": "7d"}}),
    ),
    Case(
        "kept a day and a half",
        edit(
            SESSION,
            {"spec.journalRetentionPolicy": {"whenDeleted": "Retain", "retainFor": "1d12h"}},
        ),
    ),
    Case(
        "kept for a while but deleted at once",
        edit(
            SESSION, {"spec.journalRetentionPolicy": {"whenDeleted": "Delete", "retainFor": "7d"}}
        ),
        refused="spec.journalRetentionPolicy: journalRetentionPolicy.retainFor keeps a",
    ),
    Case(
        "kept for a period that is no duration",
        edit(SESSION, {"spec.journalRetentionPolicy": {"retainFor": "a week"}}),
        refused="spec.journalRetentionPolicy: journalRetentionPolicy.retainFor is a",
    ),
    Case(
        "kept for weeks (no such unit)",
        edit(SESSION, {"spec.journalRetentionPolicy": {"retainFor": "2w"}}),
        refused="spec.journalRetentionPolicy: journalRetentionPolicy.retainFor is a",
    ),
    Case("a fork at a seq", edit(SESSION, {"spec.forkFrom": {"session": "bob", "seq": 5}})),
    Case(
        "a fork at a seq and a snapshot",
        edit(SESSION, {"spec.forkFrom": {"session": "bob", "seq": 5, "snapshot": 4}}),
        refused="spec.forkFrom: forkFrom takes exactly one of seq and snapshot",
    ),
    Case(
        "a fork at neither",
        edit(SESSION, {"spec.forkFrom": {"session": "bob"}}),
        refused="spec.forkFrom: forkFrom takes exactly one of seq and snapshot",
    ),
    Case(
        "a fork point moved after the session was made",
        edit(SESSION, {"spec.forkFrom": {"session": "bob", "seq": 6}}),
        old=edit(SESSION, {"spec.forkFrom": {"session": "bob", "seq": 5}}),
        refused="spec.forkFrom: forkFrom cannot change",
    ),
    Case(
        "fence attempts that just fit",
        edit(
            SESSION,
            {"spec.migration.fenceTimeoutSeconds": 40, "spec.migration.maxFenceAttempts": 3},
        ),
    ),
    Case(
        "fence attempts that do not fit",
        edit(SESSION, {"spec.migration.fenceTimeoutSeconds": 41}),
        refused="spec.migration: fenceTimeoutSeconds x maxFenceAttempts must fit",
    ),
    Case(
        "a fence timeout under 1 s",
        edit(SESSION, {"spec.migration.fenceTimeoutSeconds": 0}),
        refused="spec.migration.fenceTimeoutSeconds: must be at least 1",
    ),
    Case(
        "a fence timeout over 10 min",
        edit(
            SESSION,
            {"spec.migration.fenceTimeoutSeconds": 601, "spec.migration.maxDurationSeconds": 3600},
        ),
        refused="spec.migration.fenceTimeoutSeconds: must be at most 600",
    ),
    Case(
        "a strategy that does not exist",
        edit(SESSION, {"spec.migration.strategy": "auto"}),
        refused="spec.migration.strategy: must be one of 'Auto', 'State', 'CRIU'",
    ),
    Case(
        "no image and no deployment to take it from",
        edit(SESSION, {"spec.image": DELETE}),
        refused="spec.image is required unless the session follows an AgentDeployment",
    ),
    Case(
        "no image: a session that follows an AgentDeployment takes its rollouts'",
        edit(SESSION, {"spec.image": DELETE, "spec.deploymentRef": {"name": "support"}}),
    ),
    Case(
        "two env entries of one name",
        edit(SESSION, {"spec.env.1": {"name": "MODE", "value": "slow"}}),
        refused="spec.env[1]: duplicate entry with name='MODE'",
    ),
    Case(
        "a field the API does not have",
        edit(SESSION, {"spec.replicas": 2}),
        refused="spec.replicas: unknown field",
    ),
    # the session's status
    Case(
        "acked past the head",
        edit(SESSION, {"status.journal.ackedSeq": 11}),
        refused="status.journal: journal.ackedSeq cannot be past journal.headSeq",
    ),
    # AgentMigration: the target
    Case("a move to another node", edit(MIGRATION, {"spec.target": {"nodeName": "node-2"}})),
    Case(
        "a target with neither image nor node",
        edit(MIGRATION, {"spec.target": {}}),
        refused="spec.target: target needs image",
    ),
    Case(
        "CRIU to a new image",
        edit(MIGRATION, {"spec.strategy": "CRIU"}),
        refused="spec: strategy CRIU restores the same process image",
    ),
    Case(
        "CRIU to another node",
        edit(MIGRATION, {"spec.strategy": "CRIU", "spec.target": {"nodeName": "n"}}),
    ),
    # AgentMigration: immutability (updates)
    Case(
        "an update that changes only status",
        edit(MIGRATION, {"status.phase": "Fencing"}),
        old=MIGRATION,
    ),
    Case(
        "a changed target image",
        edit(MIGRATION, {"spec.target.image": "refagent:v3"}),
        old=MIGRATION,
        refused="spec.target: image is immutable",
    ),
    Case(
        "a target image set afterwards",
        edit(MIGRATION, {"spec.target": {"nodeName": "n", "image": "refagent:v2"}}),
        old=edit(MIGRATION, {"spec.target": {"nodeName": "n"}}),
        refused="spec.target: image is immutable",
    ),
    Case(
        "a target image removed",
        edit(MIGRATION, {"spec.target": {"nodeName": "n"}}),
        old=edit(MIGRATION, {"spec.target": {"nodeName": "n", "image": "refagent:v2"}}),
        refused="spec.target: image is immutable",
    ),
    Case(
        "a target node added",
        edit(MIGRATION, {"spec.target.nodeName": "n"}),
        old=MIGRATION,
        refused="spec.target: nodeName is immutable",
    ),
    Case(
        "another session",
        edit(MIGRATION, {"spec.sessionRef.name": "bob"}),
        old=MIGRATION,
        refused="spec.sessionRef: sessionRef is immutable",
    ),
    Case(
        "another reason",
        edit(MIGRATION, {"spec.reason": "NodeDrain"}),
        old=MIGRATION,
        refused="spec.reason: reason is immutable",
    ),
    Case(
        "a strategy set afterwards",
        edit(MIGRATION, {"spec.strategy": "State"}),
        old=MIGRATION,
        refused="spec: strategy is immutable",
    ),
    Case(
        "a strategy changed",
        edit(MIGRATION, {"spec.strategy": "Auto"}),
        old=edit(MIGRATION, {"spec.strategy": "State"}),
        refused="spec: strategy is immutable",
    ),
    Case("a create is no update", edit(MIGRATION, {"spec.strategy": "State"})),
    # AgentMigration: its status
    Case("a finished migration", edit(MIGRATION, FINISHED)),
    Case(
        "a rolled back migration",
        edit(MIGRATION, {"status.phase": "RolledBack", "status.result": "RolledBack"}),
    ),
    Case(
        "a result while it runs",
        edit(MIGRATION, {"status.result": "Succeeded"}),
        refused="status: status.result is the finished phase",
    ),
    Case(
        "a finished phase without result",
        edit(MIGRATION, {"status.phase": "Failed"}),
        refused="status: status.result is the finished phase",
    ),
    Case(
        "a result that is not the phase",
        edit(MIGRATION, {"status.phase": "Failed", "status.result": "RolledBack"}),
        refused="status: status.result is the finished phase",
    ),
    Case("a phase moving on", edit(MIGRATION, {"status.phase": "Fencing"}), old=MIGRATION),
    Case(
        "a finished phase written again", edit(MIGRATION, FINISHED), old=edit(MIGRATION, FINISHED)
    ),
    Case(
        "a finished migration reopened",
        edit(MIGRATION, {"status.phase": "Pending"}),
        old=edit(MIGRATION, FINISHED),
        refused="status: a finished migration stays finished",
    ),
    Case(
        "a policy copy that does not hold",
        edit(MIGRATION, {"status.policy": {"phaseTimeoutSeconds": 300}}),
        refused="status.policy: phaseTimeoutSeconds may not exceed maxDurationSeconds",
    ),
    Case(
        "a policy copy whose fence does not fit",
        edit(MIGRATION, {"status.policy": {"fenceTimeoutSeconds": 600}}),
        refused="status.policy: fenceTimeoutSeconds x maxFenceAttempts must fit",
    ),
    Case(
        "a policy copy whose gate compares nothing",
        edit(MIGRATION, {"status.policy": {"validation": {"turns": 0}}}),
        refused="status.policy.validation: validation compares nothing",
    ),
    Case(
        "a policy copy whose gate outlasts it",
        edit(MIGRATION, {"status.policy": {"validation": {"timeoutSeconds": 3600}}}),
        refused="status.policy: validation.timeoutSeconds may not exceed",
    ),
    Case(
        "a policy copy with an LLM judge and no endpoint",
        edit(MIGRATION, {"status.policy": {"validation": {"gate": {"judge": "LLM"}}}}),
        refused="status.policy.validation.gate: judge LLM needs llm",
    ),
    Case(
        "a migration's own LLM judge without its endpoint",
        edit(MIGRATION, {"spec.validation": {"gate": {"judge": "LLM"}}}),
        refused="spec.validation.gate: judge LLM needs llm",
    ),
    Case(
        "a phase the engine does not have",
        edit(MIGRATION, {"status.phase": "Validated"}),
        refused="status.phase: must be one of",
    ),
]

# --- AgentDeployment ---------------------------------------------------------------------

DEPLOYMENT: Final = {
    "apiVersion": "shadowpod.dev/v1alpha1",
    "kind": "AgentDeployment",
    "metadata": {"name": "support"},
    "spec": {
        "template": {"image": "refagent:v1"},
        "strategy": {"steps": [{"canary": {"sessions": 1}}, {"pause": {}}]},
    },
}
# What a session and its deployment's template share: the same rules apply there.
TEMPLATE_FIELDS: Final = {
    "image",
    "imagePullPolicy",
    "command",
    "args",
    "env",
    "resources",
    "credentials",
    "memory",
    "identity",
    "checkpoint",
}


def as_deployment(case: Case) -> Case | None:
    """A session case about the template's fields or the migration policy, asked of an
    AgentDeployment's template: it must be admitted or refused the same way."""
    spec = case.new["spec"]
    if case.old is not None or case.new["metadata"] != {"name": "ada"}:
        return None
    if case.refused is not None and case.refused.startswith("status."):
        return None
    if case.refused is not None and "unless the session follows" in case.refused:
        return None  # a session's own rule: a template always needs its image
    if not set(spec) <= TEMPLATE_FIELDS | {"migration"}:
        return None
    template = {key: value for key, value in spec.items() if key in TEMPLATE_FIELDS}
    new = edit(DEPLOYMENT, {"spec.template": template})
    if "migration" in spec:
        new = edit(new, {"spec.migration": spec["migration"]})
    refused = case.refused
    if refused is not None:
        for key in TEMPLATE_FIELDS:
            refused = refused.replace(f"spec.{key}", f"spec.template.{key}")
    return Case(f"a deployment: {case.name}", new, refused=refused)


def without_status(obj: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in obj.items() if key != "status"}


CASES += [
    derived
    for case in [replace(c, new=without_status(c.new)) for c in CASES]
    if case.new["kind"] == "AgentSession" and (derived := as_deployment(case)) is not None
]
CASES += [
    Case("the base deployment", DEPLOYMENT),
    Case(
        "a template without an image",
        edit(DEPLOYMENT, {"spec.template.image": DELETE}),
        refused="spec.template.image: required",
    ),
    Case(
        "a 64-character deployment name",
        edit(DEPLOYMENT, {"metadata.name": "a" * 64}),
        refused="<root>: an AgentDeployment's name is at most 63 characters",
    ),
    Case(
        "a canary of both sessions and percent",
        edit(DEPLOYMENT, {"spec.strategy.steps.0.canary.percent": 5}),
        refused="spec.strategy.steps[0].canary: a canary step takes sessions or percent",
    ),
    Case(
        "a canary of nothing",
        edit(DEPLOYMENT, {"spec.strategy.steps.0.canary": {}}),
        refused="spec.strategy.steps[0].canary: a canary step takes sessions or percent",
    ),
    Case(
        "a step that is a canary and a pause",
        edit(DEPLOYMENT, {"spec.strategy.steps.0.pause": {}}),
        refused="spec.strategy.steps[0]: a step is a canary or a pause",
    ),
    Case(
        "a step that is neither",
        edit(DEPLOYMENT, {"spec.strategy.steps.1.pause": DELETE}),
        refused="spec.strategy.steps[1]: a step is a canary or a pause",
    ),
    Case(
        "more per node than in all",
        edit(DEPLOYMENT, {"spec.strategy.maxConcurrentPerNode": 11}),
        refused="spec.strategy: maxConcurrentPerNode may not exceed maxConcurrentMigrations",
    ),
    Case(
        "a percentage over 100",
        edit(DEPLOYMENT, {"spec.strategy.steps.0.canary": {"percent": 101}}),
        refused="spec.strategy.steps[0].canary.percent: must be at most 100",
    ),
    Case(
        "a pause of two weeks",
        edit(DEPLOYMENT, {"spec.strategy.steps.1.pause.durationSeconds": 14 * 86400}),
        refused="spec.strategy.steps[1].pause.durationSeconds: must be at most 604800",
    ),
    Case(
        "a session following a deployment, pinned",
        edit(SESSION, {"spec.deploymentRef": {"name": "support"}, "spec.pinned": True}),
    ),
    Case(
        "a deployment reference that is no name",
        edit(SESSION, {"spec.deploymentRef": {"name": "Support!"}}),
        refused="spec.deploymentRef.name: must match",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_admission(case: Case) -> None:
    refused = admit(case.new, case.old)
    if case.refused is None:
        assert refused == []
    else:
        assert len(refused) == 1, refused
        assert case.refused in refused[0]


def refusing_rules(case: Case) -> set[tuple[str, str, str]]:
    kind = case.new["kind"]
    return {
        (kind, site.schema_path, site.rule["rule"]) for site in broken_rules(case.new, case.old)
    }


def test_every_rule_has_a_case_it_refuses() -> None:
    refused = set().union(*(refusing_rules(case) for case in CASES if case.refused))
    every = {(kind, path, rule["rule"]) for kind, path, _, rule in ALL_RULES}
    assert every - refused == set(), "rules no case shows refusing an object"


@pytest.mark.parametrize(
    ("kind", "path", "node", "rule"),
    ALL_RULES,
    ids=[f"{kind}:{path}:{index}" for index, (kind, path, _, _) in enumerate(ALL_RULES)],
)
def test_every_rule_compiles_and_names_fields_that_exist(
    kind: str, path: str, node: dict[str, Any], rule: dict[str, str]
) -> None:
    program(rule["rule"])  # a syntax error raises here
    if path == "<root>":  # the API server declares metadata.name at the root
        metadata = {"type": "object", "properties": {"name": {"type": "string"}}}
        node = {**node, "properties": {**node["properties"], "metadata": metadata}}
    for missing in unknown_references(node, rule["rule"]):
        pytest.fail(f"{kind} {path}: {rule['rule']!r} reads {missing}, which the schema lacks")


def unknown_references(node: dict[str, Any], rule: str) -> list[str]:
    """``self.a.b`` and ``oldSelf.a.b`` the schema at ``node`` has no field for."""
    unknown = []
    for match in _REFERENCE.finditer(_STRING_LITERAL.sub("''", rule)):
        steps = match.group(2).lstrip(".").split(".")
        if match.group(3):  # the last step is a method: self.name.startsWith(...)
            steps = steps[:-1]
        current = node
        for step in steps:
            if step in current.get("properties", {}):
                current = current["properties"][step]
            elif isinstance(current.get("additionalProperties"), dict):
                current = current["additionalProperties"]
            else:
                unknown.append(f"{match.group(1)}.{'.'.join(steps)}")
                break
    return unknown


def test_the_reference_check_can_fail() -> None:
    node = {"type": "object", "properties": {"image": {"type": "string"}}}
    assert unknown_references(node, "self.image.startsWith('a') && has(self.imag)") == ["self.imag"]
    assert unknown_references(node, "self.image == 'self.nope'") == []


def test_transition_rules_skip_creates_and_uncorrelated_items() -> None:
    schema = {
        "type": "object",
        "properties": {
            "keyed": {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "items": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {"name": {"type": "string"}, "v": {"type": "integer"}},
                    RULES: [{"rule": "self.v >= oldSelf.v", "message": "v only grows"}],
                },
            }
        },
    }
    new = {"keyed": [{"name": "b", "v": 1}, {"name": "a", "v": 1}]}
    old = {"keyed": [{"name": "a", "v": 2}]}
    seen = [(site.path, site.old) for site in sites(schema, new, old)]
    assert seen == [("keyed[0]", MISSING), ("keyed[1]", {"name": "a", "v": 2})]


def nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path or "<root>", schema
    for name, child in schema.get("properties", {}).items():
        yield from nodes(child, f"{path}.{name}".lstrip("."))
    for key, step in (("additionalProperties", "{}"), ("items", "[]")):
        if isinstance(schema.get(key), dict):
            yield from nodes(schema[key], f"{path}{step}")


def test_every_default_passes_the_rules_below_it() -> None:
    """The API server checks defaults against the schema's rules too."""
    checked = []
    for kind in KINDS:
        for path, node in nodes(schema_of(kind)):
            if "default" not in node:
                continue
            value = values.with_defaults(node, node["default"])
            for site in sites(node, value, MISSING):
                if not uses_old_self(site.rule["rule"]):
                    assert holds(site.rule["rule"], site.value), (kind, path, site.rule)
                    checked.append(path)
    assert {"spec.migration", "spec.checkpoint"} <= set(checked)


# --- the examples -------------------------------------------------------------------------

EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))
# Each manifest of the examples (a file may hold several: followers.yaml), by name.
EXAMPLE_MANIFESTS = {
    f"{path.name}/{manifest['metadata']['name']}": manifest
    for path in EXAMPLE_FILES
    for manifest in yaml.safe_load_all(path.read_text())
}


def without_empty(value: Any) -> Any:
    """``value`` without empty lists and maps: the models write them, the API server not."""
    if isinstance(value, dict):
        kept = {key: without_empty(item) for key, item in value.items()}
        return {key: item for key, item in kept.items() if item not in ({}, [])}
    if isinstance(value, list):
        return [without_empty(item) for item in value]
    return value


def test_there_is_an_example_of_each_kind() -> None:
    kinds = {manifest["kind"] for manifest in EXAMPLE_MANIFESTS.values()}
    assert kinds == set(KINDS)


@pytest.mark.parametrize("name", list(EXAMPLE_MANIFESTS))
def test_an_example_is_admitted_and_reads_as_the_api_server_stores_it(name: str) -> None:
    manifest = EXAMPLE_MANIFESTS[name]
    assert admit(manifest) == []
    model = KINDS[manifest["kind"]].model_validate(manifest)
    stored = values.with_defaults(schema_of(manifest["kind"]), manifest)
    written = model.to_kube()
    written["metadata"] = manifest["metadata"]
    assert without_empty(written) == without_empty(stored)


def test_bumping_the_example_sessions_image_is_an_update_the_api_server_takes() -> None:
    session = yaml.safe_load((EXAMPLES / "agentsession.yaml").read_text())
    assert admit(edit(session, {"spec.image": "refagent:v2"}), old=session) == []


def test_retargeting_the_example_migration_is_refused() -> None:
    migration = yaml.safe_load((EXAMPLES / "agentmigration.yaml").read_text())
    refused = admit(edit(migration, {"spec.target.image": "refagent:v3"}), old=migration)
    assert refused == [
        "spec.target: image is immutable: an AgentMigration is one request; delete it (a"
        " running one rolls back) and create another"
    ]
