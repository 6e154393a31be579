"""The kubelet checkpoint API through the emulated API server's node proxy, read with
the operator's own client (``KubeApi.post_raw``): each answer a real kubelet gives.
And the pure parts of the CRIU path: which strategy ``Auto`` takes, the image name
of an archive."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shadowpod.kube.api import KubeApi
from shadowpod.kube.checkpoints import checkpoint_path
from shadowpod.kube.models.v1alpha1 import MigrationStrategy
from shadowpod.kube.names import checkpoint_image
from shadowpod.kube.strategies import CHECKPOINT_RESTORE_LABEL, CRIU_DUMPS_TCP_LABEL, choose
from tests.kube.connection import KubeConnection
from tests.kube.emulator import ApiServerEmulator
from tests.kube.emulator.kubelets import CHECKPOINTS, RUNTIME_UNIMPLEMENTED


async def _node_and_pod(api: KubeApi) -> None:
    await api.create("/api/v1/nodes", {"metadata": {"name": "n1"}})
    pod = {
        "metadata": {"name": "p1"},
        "spec": {"nodeName": "n1", "containers": [{"name": "agent", "image": "a:1"}]},
    }
    await api.create("/api/v1/namespaces/default/pods", pod)


async def test_each_node_answers_the_checkpoint_api_as_configured(
    emulator: ApiServerEmulator, emulator_kube: KubeConnection
) -> None:
    async with emulator_kube.api() as client:
        api = KubeApi(client)
        await _node_and_pod(api)
        path = checkpoint_path("n1", "default", "p1", "agent")

        # Not configured: a kubelet whose ContainerCheckpoint gate is off serves no path.
        status, body = await api.post_raw(path, query={"timeout": "30"})
        assert (status, body) == (404, "404 page not found\n")

        emulator.kubelet_checkpoints["n1"] = RUNTIME_UNIMPLEMENTED
        status, body = await api.post_raw(path, query={})
        assert status == 500
        assert body.startswith("checkpointing of default/p1/agent failed (rpc error")

        emulator.kubelet_checkpoints["n1"] = CHECKPOINTS
        status, body = await api.post_raw(path, query={"timeout": "30"})
        assert status == 200
        [archive] = json.loads(body)["items"]
        assert archive.startswith("/var/lib/kubelet/checkpoints/checkpoint-p1_default-agent-")
        assert archive.endswith("Z.tar")

        # A container the node does not run: 404 from the kubelet itself.
        status, body = await api.post_raw(
            checkpoint_path("n1", "default", "p1", "sidecar"), query={}
        )
        assert status == 404 and "not found" in body
        # A node that does not exist: the API server's own 404.
        status, _ = await api.post_raw(checkpoint_path("n9", "default", "p1", "agent"), query={})
        assert status == 404
    assert [r.timeout for r in emulator.checkpoint_requests] == ["30", None, "30", None]


def test_a_checkpoint_image_is_named_after_its_archive() -> None:
    archive = "/var/lib/kubelet/checkpoints/checkpoint-p1_default-agent-2026-11-25T21:50:00Z.tar"
    assert checkpoint_image("127.0.0.1:5000/ckpt/", archive) == (
        "127.0.0.1:5000/ckpt/checkpoint:checkpoint-p1_default-agent-2026-11-25t21-50-00z"
    )
    long = f"/x/checkpoint-{'p' * 63}_{'n' * 63}-agent-2026-11-25T21:50:00Z.tar"
    tag = checkpoint_image("r", long).split(":", 1)[1]
    assert len(tag) == 128
    other = checkpoint_image("r", long.replace("50:00", "50:01")).split(":", 1)[1]
    assert tag != other  # the cut keeps archives apart


def _node(name: str, *, labelled: bool = True, kernel: str | None = None, tcp: bool = False) -> Any:
    labels = {CHECKPOINT_RESTORE_LABEL: "true"} if labelled else {}
    if tcp:
        labels[CRIU_DUMPS_TCP_LABEL] = "true"
    node: dict[str, Any] = {"metadata": {"name": name, "labels": labels}, "status": {}}
    if kernel is not None:
        node["status"]["nodeInfo"] = {"kernelVersion": kernel}
    return node


@pytest.mark.parametrize(
    ("requested", "kwargs", "wanted"),
    [
        (MigrationStrategy.STATE, {}, ("State", "Requested", False)),
        (MigrationStrategy.CRIU, {}, ("CRIU", "Requested", False)),
        (MigrationStrategy.CRIU, {"criu_enabled": False}, ("CRIU", "CheckpointDisabled", False)),
        (MigrationStrategy.CRIU, {"target_image": "a:2"}, ("State", "ImageChange", False)),
        (MigrationStrategy.AUTO, {"target_image": "a:2"}, ("State", "ImageChange", False)),
        (MigrationStrategy.AUTO, {"criu_enabled": False}, ("State", "CheckpointDisabled", False)),
        (MigrationStrategy.AUTO, {"registry": None}, ("State", "NoCheckpointRegistry", False)),
        (
            MigrationStrategy.AUTO,
            {"source_node": _node("n1", labelled=False)},
            ("State", "NodeCannotCheckpoint", False),
        ),
        (
            MigrationStrategy.AUTO,
            {"target_node": _node("n2", labelled=False)},
            ("State", "NodeCannotRestore", False),
        ),
        (
            MigrationStrategy.AUTO,
            {"source_node": _node("n1", kernel="6.18.0-1-amd64")},
            ("State", "KernelTooNew", False),
        ),
        (
            MigrationStrategy.AUTO,
            {"source_node": _node("n1", kernel="6.18.0", tcp=True)},
            ("CRIU", "SameImage", True),
        ),
        (
            MigrationStrategy.AUTO,
            {"source_node": _node("n1", kernel="6.12.48+deb13-amd64")},
            ("CRIU", "SameImage", True),
        ),
        (MigrationStrategy.AUTO, {}, ("CRIU", "SameImage", True)),
    ],
)
def test_auto_takes_criu_only_where_it_can_work(
    requested: MigrationStrategy, kwargs: dict[str, Any], wanted: tuple[str, str, bool]
) -> None:
    given: dict[str, Any] = {
        "source_image": "a:1",
        "target_image": "a:1",
        "criu_enabled": True,
        "registry": "registry.internal/ckpt",
        "source_node": _node("n1"),
        "target_node": _node("n2"),
        "target_node_name": "n2",
        **kwargs,
    }
    choice = choose(requested, **given)
    assert (choice.strategy, choice.reason, choice.fallback) == wanted
    assert choice.message  # always says why
    if choice.reason == "KernelTooNew":
        assert "criu#2718" in choice.message and CRIU_DUMPS_TCP_LABEL in choice.message


KEP = "node.k8s.io/v1alpha1"


@pytest.mark.parametrize(
    ("requested", "kwargs", "wanted"),
    [
        # The served API is the cluster's word: no labels, registry or kernel rule.
        (
            MigrationStrategy.AUTO,
            {
                "target_node_name": None,
                "registry": None,
                "source_node": _node("n1", labelled=False),
            },
            ("CRIU", "PodCheckpointServed", "PodCheckpoint"),
        ),
        (
            MigrationStrategy.AUTO,
            {"target_node_name": "n1", "source_node": _node("n1", kernel="6.18.0")},
            ("CRIU", "PodCheckpointServed", "PodCheckpoint"),
        ),
        (
            MigrationStrategy.CRIU,
            {"target_node_name": "n1"},
            ("CRIU", "Requested", "PodCheckpoint"),
        ),
        # Its alpha restores only on the checkpoint's node: elsewhere, the kubelet API.
        (MigrationStrategy.AUTO, {}, ("CRIU", "SameImage", "KubeletAPI")),
        (MigrationStrategy.CRIU, {}, ("CRIU", "Requested", "KubeletAPI")),
        (
            MigrationStrategy.AUTO,
            {
                "target_node_name": None,
                "source_node": {**_node("n1"), "spec": {"unschedulable": True}},
            },
            ("CRIU", "SameImage", "KubeletAPI"),
        ),
        (
            MigrationStrategy.AUTO,
            {"registry": None},
            ("State", "NoCheckpointRegistry", None),
        ),
        # Never without --criu, never across images.
        (MigrationStrategy.AUTO, {"criu_enabled": False}, ("State", "CheckpointDisabled", None)),
        (
            MigrationStrategy.AUTO,
            {"target_image": "a:2", "target_node_name": None},
            ("State", "ImageChange", None),
        ),
    ],
)
def test_a_served_pod_checkpoint_api_is_preferred_for_a_move_on_the_same_node(
    requested: MigrationStrategy, kwargs: dict[str, Any], wanted: tuple[str, str, str | None]
) -> None:
    given: dict[str, Any] = {
        "source_image": "a:1",
        "target_image": "a:1",
        "criu_enabled": True,
        "registry": "registry.internal/ckpt",
        "source_node": _node("n1"),
        "target_node": _node("n2"),
        "target_node_name": "n2",
        "pod_checkpoints": KEP,
        **kwargs,
    }
    choice = choose(requested, **given)
    assert (choice.strategy, choice.reason, choice.mechanism) == wanted
    if choice.mechanism == "PodCheckpoint":
        assert KEP in choice.message
    elif choice.reason in ("SameImage", "Requested", "NoCheckpointRegistry"):
        # Why not the KEP's, said alongside the kubelet API's own reasons.
        assert "restores only on the node that took the checkpoint" in choice.message


def test_without_the_pod_checkpoint_api_nothing_is_said_of_it() -> None:
    choice = choose(
        MigrationStrategy.AUTO,
        source_image="a:1",
        target_image="a:1",
        criu_enabled=True,
        registry="registry.internal/ckpt",
        source_node=_node("n1"),
        target_node=None,
        target_node_name=None,
    )
    assert (choice.strategy, choice.mechanism) == ("CRIU", "KubeletAPI")
    assert "PodCheckpoint" not in choice.message
