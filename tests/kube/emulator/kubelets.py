"""The kubelet's checkpoint API behind the API server's node proxy, as a real kubelet
answers it (https://kubernetes.io/docs/reference/node/kubelet-checkpoint-api/):

``POST /api/v1/nodes/{node}/proxy/checkpoint/{namespace}/{pod}/{container}?timeout=N``

- 200 ``{"items": ["/var/lib/kubelet/checkpoints/checkpoint-<pod>_<ns>-<container>-
  <RFC 3339 time>.tar"]}`` where the runtime checkpointed the container;
- 404 ``404 page not found`` (plain text) where the ``ContainerCheckpoint`` feature
  gate is off: the kubelet serves no such path; also 404 for a pod or container it
  does not run;
- 500 ``checkpointing of <ns>/<pod>/<container> failed (<the runtime's error>)`` where
  the runtime does not implement the CRI's CheckpointContainer, or CRIU failed;
- 403 (the API server's own ``Forbidden`` Status, before any kubelet is asked) where the
  caller has no RBAC ``nodes/proxy`` create.

Each node answers as ``ApiServerEmulator.kubelet_checkpoints[node]`` says; a node not
in it answers 404, as a kubelet with the gate off.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

import attrs

CHECKPOINTS_DIR: Final = "/var/lib/kubelet/checkpoints"
UNIMPLEMENTED: Final = (
    "rpc error: code = Unimplemented desc = unknown method CheckpointContainer for service"
    " runtime.v1.RuntimeService"
)


@attrs.frozen
class CheckpointAnswer:
    """How one node's kubelet answers a checkpoint request."""

    status: int = 200
    error: str = UNIMPLEMENTED  # the runtime's error, in a 500


FEATURE_GATE_OFF: Final = CheckpointAnswer(404)
NODE_PROXY_FORBIDDEN: Final = CheckpointAnswer(403)
OPERATOR_USER: Final = "system:serviceaccount:shadowpod:shadowpod-operator"
RUNTIME_UNIMPLEMENTED: Final = CheckpointAnswer(500)
CHECKPOINTS: Final = CheckpointAnswer(200)


@attrs.frozen
class CheckpointRequest:
    node: str
    namespace: str
    pod: str
    container: str
    timeout: str | None


def answer(
    given: CheckpointAnswer, request: CheckpointRequest, pod: dict[str, Any] | None
) -> tuple[int, Any]:
    """The status and the body (a dict is JSON, a str plain text) of ``request``."""
    if given.status == 404:
        return 404, "404 page not found\n"
    if given.status == 403:
        return 403, {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f'nodes "{request.node}" is forbidden: User "{OPERATOR_USER}" cannot create'
            ' resource "nodes/proxy" in API group "" at the cluster scope',
            "reason": "Forbidden",
            "details": {"name": request.node, "kind": "nodes"},
            "code": 403,
        }
    where = f"{request.namespace}/{request.pod}/{request.container}"
    runs = pod is not None and (pod.get("spec") or {}).get("nodeName") == request.node
    containers = [] if pod is None else [c["name"] for c in pod["spec"].get("containers", [])]
    if not runs or request.container not in containers:
        return 404, f"container {where} not found on this node\n"
    if given.status >= 500:
        return given.status, f"checkpointing of {where} failed ({given.error})\n"
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    archive = (
        f"{CHECKPOINTS_DIR}/checkpoint-{request.pod}_{request.namespace}-{request.container}"
        f"-{stamp}.tar"
    )
    return 200, {"items": [archive]}
