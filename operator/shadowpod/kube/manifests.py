"""The objects the operator creates, built from an AgentSession: pure functions, no I/O.

An agent pod is one instance of the session (the owner, or a migration's shadow):
- its identity (session id, instance name, gateway address, agent token) as files in
  one projected volume — the downward API and the session's Secret — which the agent
  re-reads whenever it reconnects (a CRIU-restored process finds itself in a new pod);
- every declared credential mounted from its Secret, never in the environment;
- readiness on the agent runtime's ``/readyz``; its status endpoint on the pod's IP;
- ``restartPolicy: Never``: a pod is one instance at one epoch. A dead owner is
  replaced by a new pod at a new epoch, never restarted in place under its old one.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Final, Literal

from shadowpod.kube import names
from shadowpod.kube.models.v1alpha1 import API_VERSION, AgentSession

Mode = Literal["owner", "shadow"]
POD_IP_ENV: Final = "SHADOWPOD_POD_IP"
# Annotations the identity volume projects as files, for the agent's persona.
AGENT_NAME_ANNOTATION: Final = f"{names.PREFIX}/agent-name"
AGENT_PRINCIPLES_ANNOTATION: Final = f"{names.PREFIX}/agent-principles"
# Beyond the drain grace the agent gets, for flushing and reporting its drain.
EXIT_MARGIN_S: Final = 10
# The mode of the identity and credential files in an agent pod. The kubelet writes them
# as root, and gives them a group only where the pod sets an fsGroup; the agent runs as
# its image's user (the reference agent's is 65532), which the operator cannot know. So
# they are readable by every user of the container, as Kubernetes' own default (0644)
# and its ServiceAccount tokens are; 0400 left the agent unable to read its session id.
READABLE_FILE: Final = 0o444


def owner_reference(obj: dict[str, Any] | AgentSession) -> dict[str, Any]:
    """An ownerReference to ``obj`` as the controller: deleting it deletes what it owns."""
    if isinstance(obj, AgentSession):
        api_version, kind = obj.api_version, obj.kind
        name, uid = obj.metadata.name, obj.metadata.uid
    else:
        api_version, kind = obj["apiVersion"], obj["kind"]
        name, uid = obj["metadata"]["name"], obj["metadata"]["uid"]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _name(session: AgentSession) -> str:
    name = session.metadata.name
    if name is None:
        raise ValueError("an AgentSession read from the API has a name")
    return name


def session_labels(session: AgentSession) -> dict[str, str]:
    name = _name(session)
    return {
        names.NAME_LABEL: names.AGENT_APP,
        names.INSTANCE_LABEL: name,
        names.MANAGED_BY_LABEL: names.MANAGED_BY,
        names.SESSION_LABEL: name,
    }


def agent_pod(
    session: AgentSession,
    *,
    instance: str,
    gateway_session: str,
    mode: Mode,
    epoch: int | None = None,
    snapshot: int | None = None,
    node: str | None = None,
    migration: str | None = None,
    image: str | None = None,
) -> dict[str, Any]:
    """The pod of ``instance``: the session's owner at ``epoch``, or a shadow restoring
    from ``snapshot`` (the latest when ``None``) for ``migration``. ``image`` is the
    session's unless given (a migration's target); ``node`` pins it to one node."""
    if mode == "owner" and epoch is None:
        raise ValueError("an owner pod needs the epoch it owns")
    spec = session.spec
    labels = {
        **session_labels(session),
        names.ROLE_LABEL: names.OWNER_ROLE if mode == "owner" else names.SHADOW_ROLE,
    }
    if migration is not None:
        labels[names.MIGRATION_LABEL] = names.label_value(migration)
    annotations = {names.GATEWAY_SESSION_ANNOTATION: gateway_session}
    if spec.identity is not None:
        annotations[AGENT_NAME_ANNOTATION] = spec.identity.name
        annotations[AGENT_PRINCIPLES_ANNOTATION] = json.dumps(spec.identity.principles)
    volumes, mounts = _volumes(session, instance)
    container: dict[str, Any] = {
        "name": names.AGENT_CONTAINER,
        "image": image or spec.image,
        "env": [e.to_kube() for e in spec.env] + _runtime_env(session, mode, epoch, snapshot),
        "ports": [{"name": "http", "containerPort": names.AGENT_PORT, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": names.AGENT_PORT},
            "periodSeconds": 1,
            "failureThreshold": 3,
        },
        "volumeMounts": mounts,
        "terminationMessagePath": names.TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if spec.command:
        container["command"] = list(spec.command)
    if spec.args:
        container["args"] = list(spec.args)
    if spec.image_pull_policy is not None:
        container["imagePullPolicy"] = spec.image_pull_policy
    resources = spec.resources.to_kube()
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": spec.migration.drain_grace_period_seconds + EXIT_MARGIN_S,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
    }
    if node is not None:
        pod_spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": instance,
            "namespace": session.metadata.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner_reference(session)],
        },
        "spec": pod_spec,
    }


def _runtime_env(
    session: AgentSession, mode: Mode, epoch: int | None, snapshot: int | None
) -> list[dict[str, Any]]:
    """What the agent runtime reads (``shadowpod.agent.settings``)."""
    spec = session.spec
    env: list[dict[str, Any]] = [
        {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        # On the pod's own address: pods that share a host address (host networking,
        # or a test's kubelet) must not share a listening socket.
        {"name": "SHADOWPOD_LISTEN", "value": f"$({POD_IP_ENV}):{names.AGENT_PORT}"},
        {"name": "SHADOWPOD_IDENTITY_DIR", "value": names.IDENTITY_DIR},
        {"name": "SHADOWPOD_CREDENTIALS_DIR", "value": names.CREDENTIALS_DIR},
        {"name": "SHADOWPOD_MODE", "value": mode},
        {"name": "SHADOWPOD_SNAPSHOT_EVERY", "value": str(spec.checkpoint.interval_entries)},
        {
            "name": "SHADOWPOD_DRAIN_GRACE_S",
            "value": str(spec.migration.drain_grace_period_seconds),
        },
    ]
    if epoch is not None:
        env.append({"name": "SHADOWPOD_EPOCH", "value": str(epoch)})
    if snapshot is not None:
        env.append({"name": "SHADOWPOD_SNAPSHOT", "value": str(snapshot)})
    return env


def _volumes(
    session: AgentSession, instance: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    spec = session.spec
    name = _name(session)
    downward = [
        {"path": "instance", "fieldRef": {"fieldPath": "metadata.name"}},
        {
            "path": "session",
            "fieldRef": {
                "fieldPath": f"metadata.annotations['{names.GATEWAY_SESSION_ANNOTATION}']"
            },
        },
    ]
    if spec.identity is not None:
        for path, key in (
            ("agent-name", AGENT_NAME_ANNOTATION),
            ("agent-principles", AGENT_PRINCIPLES_ANNOTATION),
        ):
            downward.append(
                {"path": path, "fieldRef": {"fieldPath": f"metadata.annotations['{key}']"}}
            )
    volumes: list[dict[str, Any]] = [
        {
            "name": "identity",
            "projected": {
                "sources": [
                    {"downwardAPI": {"items": downward}},
                    {
                        "secret": {
                            "name": names.token_secret(name),
                            "items": [
                                {"key": names.TOKEN_KEY, "path": names.TOKEN_KEY},
                                {"key": names.GATEWAY_KEY, "path": names.GATEWAY_KEY},
                            ],
                        }
                    },
                    {
                        # This instance's owner credential, and no other's (the operator
                        # writes it before the pod). Optional: a session made before
                        # owner credentials has none, and is held to the epoch alone.
                        "secret": {
                            "name": names.token_secret(name),
                            "items": [
                                {
                                    "key": names.owner_credential_key(instance),
                                    "path": names.OWNER_CREDENTIAL_FILE,
                                }
                            ],
                            "optional": True,
                        }
                    },
                ],
                "defaultMode": READABLE_FILE,
            },
        }
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "identity", "mountPath": names.IDENTITY_DIR, "readOnly": True}
    ]
    for index, credential in enumerate(spec.credentials):
        volume = f"credential-{index}"
        ref = credential.secret_ref
        source: dict[str, Any] = {"secretName": ref.name, "defaultMode": READABLE_FILE}
        mount: dict[str, Any] = {
            "name": volume,
            "mountPath": f"{names.CREDENTIALS_DIR}/{credential.name}",
            "readOnly": True,
        }
        if ref.key is not None:
            # One key, as a file named after the credential.
            source["items"] = [{"key": ref.key, "path": ref.key}]
            mount["subPath"] = ref.key
        volumes.append({"name": volume, "secret": source})
        mounts.append(mount)
    if spec.memory is not None:
        memory: dict[str, Any] = {"name": "memory"}
        if spec.memory.persistent_volume_claim is not None:
            memory["persistentVolumeClaim"] = {
                "claimName": spec.memory.persistent_volume_claim.claim_name
            }
        else:
            empty = spec.memory.empty_dir
            memory["emptyDir"] = {} if empty is None else empty.to_kube()
        volumes.append(memory)
        mounts.append({"name": "memory", "mountPath": spec.memory.mount_path})
    return volumes, mounts


def token_secret(
    session: AgentSession, *, token: str, gateway_url: str, owner_key: str
) -> dict[str, Any]:
    """The session's Secret: the agent token its pods present to the gateway, where the
    gateway is, and the session's owner key (from which the operator derives each
    pod's owner credential; never mounted)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": names.token_secret(_name(session)),
            "namespace": session.metadata.namespace,
            "labels": session_labels(session),
            "ownerReferences": [owner_reference(session)],
        },
        "data": {
            names.TOKEN_KEY: base64.b64encode(token.encode()).decode(),
            names.GATEWAY_KEY: base64.b64encode(gateway_url.encode()).decode(),
            names.OWNER_KEY_KEY: base64.b64encode(owner_key.encode()).decode(),
        },
    }


def owner_budget(session: AgentSession) -> dict[str, Any]:
    """A PodDisruptionBudget that no eviction of the owner pod may pass: ``kubectl
    drain`` waits until the operator has moved the session live (as KubeVirt's
    ``evictionStrategy: LiveMigrate`` does)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": names.disruption_budget(_name(session)),
            "namespace": session.metadata.namespace,
            "labels": session_labels(session),
            "ownerReferences": [owner_reference(session)],
        },
        "spec": {
            "maxUnavailable": 0,
            "selector": {"matchLabels": names.owner_selector(_name(session))},
        },
    }


def agent_migration(
    session: AgentSession,
    *,
    name: str,
    reason: str,
    image: str | None = None,
    node: str | None = None,
) -> dict[str, Any]:
    """An AgentMigration of ``session`` the operator starts (an image change, a drain)."""
    if image is None and node is None:
        raise ValueError("a migration moves to a new image, another node, or both")
    target: dict[str, str] = {}
    if image is not None:
        target["image"] = image
    if node is not None:
        target["nodeName"] = node
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentMigration",
        "metadata": {
            "name": name,
            "namespace": session.metadata.namespace,
            "labels": {
                names.MANAGED_BY_LABEL: names.MANAGED_BY,
                names.SESSION_LABEL: _name(session),
            },
            "ownerReferences": [owner_reference(session)],
        },
        "spec": {"sessionRef": {"name": _name(session)}, "target": target, "reason": reason},
    }
