"""Owner credentials on Kubernetes: each agent pod holds its own.

Every instance of a session (owner, shadow, a fenced-out owner still draining) holds
the session's agent token. What lets only the owner the gateway's ownership record
names write at its epoch is the owner credential of that instance — an HMAC of the
session and the pod's name under the session's owner key (``sessions.tokens``), as
the local runtime gives its processes. The owner key lives in the session's Secret,
never mounted; before creating a pod, the operator writes that pod's credential into
the Secret under a key of its own, which only that pod's identity volume projects
(``manifests``). A pod fenced out keeps a credential for its own name only, which the
store refuses at any epoch that names another owner.
"""

from __future__ import annotations

import base64
from typing import Any

from shadowpod.kube import names
from shadowpod.kube.api import KubeApi, namespaced
from shadowpod.sessions.tokens import owner_credential


def owner_key_of(secret: dict[str, Any]) -> str | None:
    """The session's owner key in its Secret (``None`` for a Secret made before keys)."""
    raw = (secret.get("data") or {}).get(names.OWNER_KEY_KEY)
    return base64.b64decode(raw).decode() if raw else None


async def give_owner_credential(
    api: KubeApi, namespace: str, session: str, gateway_session: str, instance: str
) -> None:
    """Write ``instance``'s owner credential into ``session``'s Secret (before its pod
    is created: the pod projects it as a file). A session without an owner key is
    left alone (its pods are held to the epoch alone).

    Credentials of pods that are gone are kept: dropping them here could race with
    another pod of the session being created (its key written, its pod not yet
    listed). About 90 bytes each: a Secret's 1 MiB holds ~10,000 pods of a session."""
    path = namespaced("secrets", namespace, names.token_secret(session))
    secret = await api.get(path)
    owner_key = owner_key_of(secret) if secret is not None else None
    if secret is None or owner_key is None:
        return
    key = names.owner_credential_key(instance)
    credential = owner_credential(owner_key, gateway_session, instance)
    wanted = base64.b64encode(credential.encode()).decode()
    if (secret.get("data") or {}).get(key) != wanted:
        await api.patch(path, {"data": {key: wanted}})
