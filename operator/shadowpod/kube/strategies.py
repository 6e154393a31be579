"""Which path a migration takes: the app-level state path or a CRIU checkpoint.

``State`` and ``CRIU`` are taken as asked (an image change aside: a process image
cannot run on another binary, so a session whose policy says CRIU still changes
images on the state path). ``Auto`` takes CRIU only where it can work, and says why
not otherwise:

- the image is unchanged;
- the operator runs with ``--criu`` (and the chart granted it ``nodes/proxy``) and a
  ``--checkpoint-registry``;
- the source's node and, when the migration names one, the target's node are
  labelled ``shadowpod.dev/checkpoint-restore=true``: the node's runtime checkpoints
  and restores containers from checkpoint images (its admin, or the node agent, says
  so: the API has no field for it);
- the source's node runs a kernel older than 6.16, or is labelled
  ``shadowpod.dev/criu-dumps-tcp=true``: the kubelet has CRIU dump the whole
  container, and CRIU 4.1 cannot dump a TCP socket on Linux 6.16 and later
  (checkpoint-restore/criu#2718); the process half's fork does not help here.

Where the cluster serves KEP-5823's ``PodCheckpoint`` (API discovery), that is the
cluster's word that its nodes checkpoint and restore pods, and CRIU goes through it
(``mechanism`` ``PodCheckpoint``) instead of the kubelet API, the node labels, the
kernel rule and the registry — for a move that stays on the source's node: the KEP's
alpha restores a checkpoint only on the node that took it. A move to another node
takes the kubelet API's path (``KubeletAPI``) as above, saying why not the KEP's.

An ``Auto`` choice of CRIU may still fall back to the state path while it runs (the
kubelet answers 404 or 500, the node cannot restore): ``fallback`` says it may.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final, Literal

from shadowpod.kube import names
from shadowpod.kube.models.v1alpha1 import MigrationStrategy

CHECKPOINT_RESTORE_LABEL: Final = f"{names.PREFIX}/checkpoint-restore"
CRIU_DUMPS_TCP_LABEL: Final = f"{names.PREFIX}/criu-dumps-tcp"
# The first kernel on which CRIU 4.1 cannot dump TCP sockets (criu#2718).
TCP_DUMP_BROKEN_FROM: Final = (6, 16)
_KERNEL: Final = re.compile(r"^(\d+)\.(\d+)")


Mechanism = Literal["PodCheckpoint", "KubeletAPI"]


@dataclass(frozen=True)
class StrategyChoice:
    strategy: Literal["State", "CRIU"]
    reason: str  # one CamelCase word
    message: str
    fallback: bool = False
    mechanism: Mechanism | None = None  # how CRIU checkpoints, when it is CRIU

    @property
    def engine_strategy(self) -> Literal["shadow", "criu"]:
        return "criu" if self.strategy == "CRIU" else "shadow"


def _labelled(node: dict[str, Any] | None, label: str) -> bool:
    if node is None:
        return False
    return str((node["metadata"].get("labels") or {}).get(label, "")).lower() == "true"


def kernel_dumps_tcp(node: dict[str, Any]) -> bool:
    """Whether the kubelet's CRIU on ``node`` can dump the agent's TCP sockets."""
    if _labelled(node, CRIU_DUMPS_TCP_LABEL):
        return True
    kernel = ((node.get("status") or {}).get("nodeInfo") or {}).get("kernelVersion", "")
    found = _KERNEL.match(str(kernel))
    if found is None:
        return True  # not reported: the kubelet's answer will tell
    return (int(found[1]), int(found[2])) < TCP_DUMP_BROKEN_FROM


def choose(
    requested: MigrationStrategy,
    *,
    source_image: str,
    target_image: str,
    criu_enabled: bool,
    registry: str | None,
    source_node: dict[str, Any] | None,
    target_node: dict[str, Any] | None,
    target_node_name: str | None,
    pod_checkpoints: str | None = None,
) -> StrategyChoice:
    """``pod_checkpoints``: the group version serving KEP-5823's PodCheckpoint, if any."""
    same_image = source_image == target_image
    if requested is MigrationStrategy.STATE:
        return StrategyChoice("State", "Requested", "strategy State: the app-level state path")
    if not same_image:
        because = (
            f"the image changes ({source_image} -> {target_image}): a checkpointed process"
            " only runs on its own image, so the app-level state path moves it"
        )
        return StrategyChoice("State", "ImageChange", because)
    if requested is MigrationStrategy.CRIU:
        if not criu_enabled:
            because = (
                "strategy CRIU, but the operator runs without --criu (chart: operator.criu):"
                " it cannot checkpoint, and the migration fails; use Auto or State"
            )
            return StrategyChoice("CRIU", "CheckpointDisabled", because)
        kep = _kep_blocked(pod_checkpoints, source_node, target_node_name)
        if kep is None:
            because = f"strategy CRIU: a pod checkpoint ({pod_checkpoints} PodCheckpoint, KEP-5823)"
            return StrategyChoice("CRIU", "Requested", because, mechanism="PodCheckpoint")
        because = "strategy CRIU: a container checkpoint through the kubelet API"
        return StrategyChoice("CRIU", "Requested", _but(kep, because), mechanism="KubeletAPI")
    source_name = (source_node or {}).get("metadata", {}).get("name", "the source's node")
    if not criu_enabled:
        because = (
            "Auto: the operator runs without --criu (chart: operator.criu), so the app-level"
            " state path"
        )
        return StrategyChoice("State", "CheckpointDisabled", because)
    kep = _kep_blocked(pod_checkpoints, source_node, target_node_name)
    if kep is None:
        because = (
            f"Auto: same image, and the cluster serves PodCheckpoint ({pod_checkpoints},"
            f" KEP-5823), its word that node {source_name} checkpoints and restores pods: a pod"
            " checkpoint, restored on the same node (the app-level state path if the kubelet"
            " or the runtime turns out unable)"
        )
        return StrategyChoice("CRIU", "PodCheckpointServed", because, True, "PodCheckpoint")
    choice = _kubelet_api(
        source_node, target_node, target_node_name, registry=registry, source_name=source_name
    )
    return StrategyChoice(
        choice.strategy,
        choice.reason,
        _but(kep, choice.message),
        choice.fallback,
        choice.mechanism,
    )


def _but(kep: str | None, message: str) -> str:
    return f"{message} ({kep})" if kep else message


def _kep_blocked(
    pod_checkpoints: str | None, source_node: dict[str, Any] | None, target_node_name: str | None
) -> str | None:
    """Why KEP-5823's PodCheckpoint cannot move this session (``""``: not served, nothing
    worth saying); ``None`` when it can."""
    if pod_checkpoints is None:
        return ""
    source_name = (source_node or {}).get("metadata", {}).get("name")
    if target_node_name is not None and target_node_name != source_name:
        return (
            f"the cluster serves PodCheckpoint, but its alpha restores only on the node that"
            f" took the checkpoint ({source_name}), and the target is {target_node_name}"
        )
    if source_node is not None and (source_node.get("spec") or {}).get("unschedulable"):
        return (
            f"the cluster serves PodCheckpoint, but its alpha restores only on the node that"
            f" took the checkpoint, and {source_name} is cordoned"
        )
    return None


def _kubelet_api(
    source_node: dict[str, Any] | None,
    target_node: dict[str, Any] | None,
    target_node_name: str | None,
    *,
    registry: str | None,
    source_name: str,
) -> StrategyChoice:
    """Auto, through the kubelet checkpoint API and checkpoint images."""
    if registry is None:
        because = (
            "Auto: the operator has no --checkpoint-registry (chart:"
            " operator.checkpointRegistry) to take checkpoint images through, so the"
            " app-level state path"
        )
        return StrategyChoice("State", "NoCheckpointRegistry", because)
    if not _labelled(source_node, CHECKPOINT_RESTORE_LABEL):
        because = (
            f"Auto: node {source_name} is not labelled {CHECKPOINT_RESTORE_LABEL}=true (its"
            " runtime is not known to checkpoint containers), so the app-level state path"
        )
        return StrategyChoice("State", "NodeCannotCheckpoint", because)
    if target_node_name is not None and not _labelled(target_node, CHECKPOINT_RESTORE_LABEL):
        because = (
            f"Auto: the target node {target_node_name} is not labelled"
            f" {CHECKPOINT_RESTORE_LABEL}=true (its runtime is not known to restore"
            " checkpoints), so the app-level state path"
        )
        return StrategyChoice("State", "NodeCannotRestore", because)
    assert source_node is not None
    if not kernel_dumps_tcp(source_node):
        kernel = source_node.get("status", {}).get("nodeInfo", {}).get("kernelVersion")
        because = (
            f"Auto: node {source_name} runs Linux {kernel}, where CRIU 4.1 cannot dump the"
            " agent's TCP sockets (checkpoint-restore/criu#2718); label it"
            f" {CRIU_DUMPS_TCP_LABEL}=true once its CRIU has the fix. The app-level state path"
        )
        return StrategyChoice("State", "KernelTooNew", because)
    because = (
        f"Auto: same image, node {source_name} checkpoints containers: a CRIU checkpoint"
        " (the app-level state path if the kubelet or the target's runtime turns out"
        " unable)"
    )
    return StrategyChoice("CRIU", "SameImage", because, fallback=True, mechanism="KubeletAPI")
