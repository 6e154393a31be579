"""Names, labels and annotations the operator gives what it makes.

Everything the operator creates for a session carries the session's label, so that it
can be found (and ``kubectl get pods -l shadowpod.dev/session=NAME`` shows it), and an
ownerReference to the AgentSession, so that deleting the session takes it along.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import string
from pathlib import PurePosixPath
from typing import Final

PREFIX: Final = "shadowpod.dev"
FINALIZER: Final = f"{PREFIX}/finalizer"

# Labels of agent pods.
SESSION_LABEL: Final = f"{PREFIX}/session"
ROLE_LABEL: Final = f"{PREFIX}/role"
MIGRATION_LABEL: Final = f"{PREFIX}/migration"
OWNER_ROLE: Final = "owner"
SHADOW_ROLE: Final = "shadow"
NAME_LABEL: Final = "app.kubernetes.io/name"
INSTANCE_LABEL: Final = "app.kubernetes.io/instance"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
AGENT_APP: Final = "shadowpod-agent"
MANAGED_BY: Final = "shadowpod-operator"

# On a hand-made AgentMigration: the generation of its session's spec when it started.
# A move to another image it makes is kept until spec.image changes (a later one).
SESSION_GENERATION_ANNOTATION: Final = f"{PREFIX}/session-generation"
# The gateway's id of the session, on every pod: the agent reads it as a file (downward API).
GATEWAY_SESSION_ANNOTATION: Final = f"{PREFIX}/gateway-session"

# The agent container and what the operator mounts into it.
AGENT_CONTAINER: Final = "agent"
AGENT_PORT: Final = 8080
RUNTIME_DIR: Final = "/var/run/shadowpod"
IDENTITY_DIR: Final = f"{RUNTIME_DIR}/identity"
CREDENTIALS_DIR: Final = f"{RUNTIME_DIR}/credentials"
TERMINATION_LOG: Final = "/dev/termination-log"

# Keys of the per-session Secret: the agent token and the gateway's address.
TOKEN_KEY: Final = "token"
GATEWAY_KEY: Final = "gateway"
# ... the session's owner key (never mounted into a pod), and each instance's owner
# credential under its own key (mounted into that instance's pod only).
OWNER_KEY_KEY: Final = "owner-key"
OWNER_CREDENTIAL_PREFIX: Final = "owner-credential."
# The identity file the agent reads its credential from (``agent.identity``).
OWNER_CREDENTIAL_FILE: Final = "owner-credential"

_SUFFIX_ALPHABET: Final = string.ascii_lowercase + string.digits
# The API server refuses a label value longer than this (a pod, a ConfigMap, anything).
LABEL_VALUE_MAX: Final = 63


def gateway_session(namespace: str, name: str) -> str:
    """The session's id in the gateway: namespaces share one gateway, names may repeat.

    A namespace and a session name are DNS labels of at most 63 characters: joined by a
    dot they fit the gateway's 128, and a dot never appears inside either.
    """
    return f"{namespace}.{name}"


def token_secret(session: str) -> str:
    return f"{session}-agent"


def owner_credential_key(instance: str) -> str:
    """The key of ``instance``'s owner credential in the session's Secret."""
    return f"{OWNER_CREDENTIAL_PREFIX}{instance}"


def disruption_budget(session: str) -> str:
    return f"{session}-owner"


def new_instance(session: str) -> str:
    """A fresh pod name for an instance (owner or shadow) of ``session``.

    Random, as a ReplicaSet's pods are: an instance is recorded (in the gateway's
    ownership or the migration's status) before its pod is created, so a retried step
    finds the name it chose rather than choosing again.
    """
    suffix = "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(5))
    return f"{session}-{suffix}"


def image_migration(session: str, generation: int) -> str:
    """The AgentMigration an image change of ``generation`` starts: one per generation,
    so a failed one is not retried until the spec changes again."""
    return f"{session}-g{generation}"


def drain_migration(session: str, node: str, owner_pod: str) -> str:
    """The AgentMigration that moves ``owner_pod`` off the cordoned ``node``."""
    digest = hashlib.sha256(f"{node}/{owner_pod}".encode()).hexdigest()[:8]
    return f"{session}-drain-{digest}"


def validation_answers(migration: str) -> str:
    """The ConfigMap holding the answers a migration's upgrade gate compared."""
    name = f"{migration}-answers"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(migration.encode()).hexdigest()[:10]
    return f"{migration[: 253 - len(digest) - 9].rstrip('-.')}-{digest}-answers"


def label_value(name: str) -> str:
    """``name`` as a label value: itself when it fits in ``LABEL_VALUE_MAX``, else its
    head and a digest of the whole. A migration's name may not fit: the operator's are
    the session's name (up to 63) and a suffix, a hand-made one's up to 253."""
    if len(name) <= LABEL_VALUE_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[: LABEL_VALUE_MAX - len(digest) - 1].rstrip('-._')}-{digest}"


def session_selector(session: str) -> dict[str, str]:
    return {SESSION_LABEL: session}


def owner_selector(session: str) -> dict[str, str]:
    return {SESSION_LABEL: session, ROLE_LABEL: OWNER_ROLE}


def label_selector(labels: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


# The OCI image annotation CRI-O reads to restore a container from a checkpoint image
# (its value: the name of the checkpointed container).
CHECKPOINT_IMAGE_ANNOTATION: Final = "io.kubernetes.cri-o.annotations.checkpoint.name"
_TAG_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_.-]")
_TAG_MAX: Final = 128


def checkpoint_image(registry: str, archive: str) -> str:
    """The image the node agent pushes for ``archive`` (a kubelet checkpoint archive's
    path), and the restored pod runs: ``REGISTRY/checkpoint:TAG``, the tag made of the
    archive's name (``checkpoint-<pod>_<ns>-<container>-<time>``)."""
    stem = PurePosixPath(archive).name.removesuffix(".tar")
    tag = _TAG_UNSAFE.sub("-", stem).lower().lstrip(".-") or "checkpoint"
    if len(tag) > _TAG_MAX:
        digest = hashlib.sha256(stem.encode()).hexdigest()[:16]
        tag = f"{tag[: _TAG_MAX - 17]}-{digest}"
    return f"{registry.rstrip('/')}/checkpoint:{tag}"
