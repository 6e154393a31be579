"""Object lifecycles that live in the API server's controllers: garbage collection of
owned objects, evictions under PodDisruptionBudgets, graceful pod deletion, binding,
namespaces, CRDs and discovery, events."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from tests.kube.connection import KubeConnection
from tests.kube.emulator import ApiServerEmulator
from tests.kube.support import Widgets, ensure_widget_crd, eventually


def pod(
    name: str,
    labels: dict[str, str] | None = None,
    node: str | None = None,
    owner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [owner]
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "pause"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec}


def owner_ref(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
    }


async def gone(read: Any, *args: Any) -> bool:
    try:
        await read(*args)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


async def test_owned_objects_go_with_their_owner(api: client.ApiClient, namespace: str) -> None:
    await ensure_widget_crd(api)
    widgets = Widgets(api, namespace)
    owner = await widgets.create("owner")
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    ref = owner_ref(owner)
    await core.create_namespaced_pod(namespace, pod("owned-pod", owner=ref))
    await core.create_namespaced_secret(
        namespace, {"metadata": {"name": "owned-secret", "ownerReferences": [ref]}}
    )
    await policy.create_namespaced_pod_disruption_budget(
        namespace,
        {
            "metadata": {"name": "owned-pdb", "ownerReferences": [ref]},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "x"}}},
        },
    )
    await core.create_namespaced_secret(namespace, {"metadata": {"name": "unowned"}})

    await widgets.delete("owner")

    await eventually(lambda: gone(core.read_namespaced_pod, "owned-pod", namespace), timeout=60)
    await eventually(
        lambda: gone(core.read_namespaced_secret, "owned-secret", namespace), timeout=60
    )
    await eventually(
        lambda: gone(policy.read_namespaced_pod_disruption_budget, "owned-pdb", namespace),
        timeout=60,
    )
    assert not await gone(core.read_namespaced_secret, "unowned", namespace)


async def test_orphan_propagation_keeps_the_dependents(
    api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    owner = await core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    await core.create_namespaced_secret(
        namespace, {"metadata": {"name": "dependent", "ownerReferences": [ref]}}
    )
    await core.delete_namespaced_config_map("owner", namespace, propagation_policy="Orphan")
    await eventually(lambda: gone(core.read_namespaced_config_map, "owner", namespace))
    secret = await core.read_namespaced_secret("dependent", namespace)
    assert not secret.metadata.owner_references


async def ready(api: client.ApiClient, namespace: str, name: str) -> None:
    """Report a pod Ready, as its kubelet would."""
    await client.CoreV1Api(api).patch_namespaced_pod_status(
        name,
        namespace,
        {
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
            }
        },
    )


def eviction(name: str, namespace: str) -> client.V1Eviction:
    return client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))


async def test_an_eviction_that_would_break_a_budget_is_refused_with_429(
    emulator_kube: KubeConnection,
) -> None:
    async with emulator_kube.api() as api:
        core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
        await policy.create_namespaced_pod_disruption_budget(
            "default",
            {
                "metadata": {"name": "keep-one"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "agent"}}},
            },
        )
        for name in ("a", "b"):
            await core.create_namespaced_pod("default", pod(name, {"app": "agent"}, "node-1"))
            await ready(api, "default", name)

        await core.create_namespaced_pod_eviction("a", "default", eviction("a", "default"))
        evicted = await core.read_namespaced_pod("a", "default")
        assert evicted.metadata.deletion_timestamp is not None  # graceful: the kubelet ends it

        with pytest.raises(ApiException) as caught:
            await core.create_namespaced_pod_eviction("b", "default", eviction("b", "default"))
        assert caught.value.status == 429
        assert "disruption budget" in caught.value.body
        budget = await eventually(
            lambda: policy.read_namespaced_pod_disruption_budget_status("keep-one", "default")
        )
        assert budget.status.disruptions_allowed == 0 and budget.status.current_healthy == 1


@pytest.mark.parametrize(
    ("policy", "allowed"), [(None, False), ("IfHealthyBudget", False), ("AlwaysAllow", True)]
)
async def test_an_unready_pod_is_evicted_only_as_its_budgets_unhealthy_pod_policy_says(
    emulator_kube: KubeConnection, policy: str | None, allowed: bool
) -> None:
    """A running pod that is not Ready, under a budget that is not met (its only pod is
    that one): the default policy, IfHealthyBudget, refuses its eviction; AlwaysAllow
    lets it go. (An owner pod that stopped being ready while a session moves must not be
    evicted by a drain under the default.)"""
    async with emulator_kube.api() as api:
        core, pdbs = client.CoreV1Api(api), client.PolicyV1Api(api)
        spec: dict[str, Any] = {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "x"}}}
        if policy is not None:
            spec["unhealthyPodEvictionPolicy"] = policy
        await pdbs.create_namespaced_pod_disruption_budget(
            "default", {"metadata": {"name": "owner"}, "spec": spec}
        )
        await core.create_namespaced_pod("default", pod("unready", {"app": "x"}, "node-1"))
        await core.patch_namespaced_pod_status(
            "unready",
            "default",
            {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}},
        )
        if allowed:
            await core.create_namespaced_pod_eviction(
                "unready", "default", eviction("unready", "default")
            )
            gone = await core.read_namespaced_pod("unready", "default")
            assert gone.metadata.deletion_timestamp is not None
        else:
            with pytest.raises(ApiException) as caught:
                await core.create_namespaced_pod_eviction(
                    "unready", "default", eviction("unready", "default")
                )
            assert caught.value.status == 429


async def test_a_bound_pod_is_deleted_gracefully_and_an_unbound_one_at_once(
    emulator_kube: KubeConnection,
) -> None:
    async with emulator_kube.api() as api:
        core = client.CoreV1Api(api)
        await core.create_namespaced_pod("default", pod("bound", node="node-1"))
        await core.create_namespaced_pod("default", pod("pending"))

        await core.delete_namespaced_pod("bound", "default", grace_period_seconds=20)
        await core.delete_namespaced_pod("pending", "default")

        terminating = await core.read_namespaced_pod("bound", "default")
        assert terminating.metadata.deletion_grace_period_seconds == 20
        assert await gone(core.read_namespaced_pod, "pending", "default")
        await core.delete_namespaced_pod("bound", "default", grace_period_seconds=0)
        assert await gone(core.read_namespaced_pod, "bound", "default")


async def test_pods_are_bound_through_the_binding_subresource_only(
    emulator_kube: KubeConnection,
) -> None:
    async with emulator_kube.api() as api:
        core = client.CoreV1Api(api)
        await core.create_namespaced_pod("default", pod("p"))
        with pytest.raises(ApiException) as caught:
            await core.patch_namespaced_pod("p", "default", {"spec": {"nodeName": "node-1"}})
        assert caught.value.status == 422

        await core.create_namespaced_binding(
            "default",
            client.V1Binding(
                metadata=client.V1ObjectMeta(name="p"),
                target=client.V1ObjectReference(kind="Node", name="node-1"),
            ),
            _preload_content=False,
        )
        bound = await core.read_namespaced_pod("p", "default")
        assert bound.spec.node_name == "node-1"
        scheduled = {c.type: c.status for c in bound.status.conditions}
        assert scheduled == {"PodScheduled": "True"}


async def test_a_strategic_merge_patch_merges_pod_conditions_by_type(
    emulator_kube: KubeConnection,
) -> None:
    async with emulator_kube.api() as api:
        core = client.CoreV1Api(api)
        await core.create_namespaced_pod("default", pod("p", node="node-1"))
        await core.patch_namespaced_pod_status(
            "p",
            "default",
            {
                "status": {
                    "conditions": [
                        {"type": "Ready", "status": "False"},
                        {"type": "Initialized", "status": "True"},
                    ]
                }
            },
        )
        await core.patch_namespaced_pod_status(
            "p", "default", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
        )
        conditions = {
            c.type: c.status
            for c in (await core.read_namespaced_pod("p", "default")).status.conditions
        }
    assert conditions == {"Ready": "True", "Initialized": "True"}


async def test_deleting_a_namespace_deletes_what_is_in_it(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespace({"metadata": {"name": "t-doomed"}})
    await core.create_namespaced_secret("t-doomed", {"metadata": {"name": "s"}})
    await core.delete_namespace("t-doomed")
    with pytest.raises(ApiException) as caught:
        await core.create_namespaced_secret("t-doomed", {"metadata": {"name": "late"}})
    assert caught.value.status in (403, 404)
    await eventually(lambda: gone(core.read_namespace, "t-doomed"), timeout=120)


async def test_discovery_lists_served_crds_with_their_subresources(
    emulator: ApiServerEmulator, emulator_kube: KubeConnection
) -> None:
    async with emulator_kube.api() as api:
        groups = await client.ApisApi(api).get_api_versions()
        assert "test.shadowpod.dev" in {group.name for group in groups.groups}
        listed = await api.call_api(
            "/apis/test.shadowpod.dev/v1",
            "GET",
            response_types_map={200: "object"},
            _return_http_data_only=True,
        )
    by_name = {resource["name"]: resource for resource in listed["resources"]}
    assert by_name["widgets"]["kind"] == "Widget" and by_name["widgets"]["namespaced"] is True
    assert {"list", "watch", "patch"} <= set(by_name["widgets"]["verbs"])
    assert "widgets/status" in by_name


async def test_a_crd_created_through_the_api_is_served_until_it_is_deleted(
    emulator_kube: KubeConnection,
) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.test.shadowpod.dev"},
        "spec": {
            "group": "test.shadowpod.dev",
            "scope": "Cluster",
            "names": {"plural": "gadgets", "kind": "Gadget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object"}},
                }
            ],
        },
    }
    async with emulator_kube.api() as api:
        crds, objects = client.ApiextensionsV1Api(api), client.CustomObjectsApi(api)
        await crds.create_custom_resource_definition(crd)
        await objects.create_cluster_custom_object(
            "test.shadowpod.dev",
            "v1",
            "gadgets",
            {"apiVersion": "test.shadowpod.dev/v1", "kind": "Gadget", "metadata": {"name": "g"}},
        )
        await crds.delete_custom_resource_definition("gadgets.test.shadowpod.dev")
        await eventually(
            lambda: gone(crds.read_custom_resource_definition, "gadgets.test.shadowpod.dev")
        )
        with pytest.raises(ApiException) as caught:
            await objects.list_cluster_custom_object("test.shadowpod.dev", "v1", "gadgets")
    assert caught.value.status == 404


async def test_events_are_posted_and_found_by_their_object(
    api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_event(
        namespace,
        {
            "metadata": {"generateName": "shadowpod-"},
            "involvedObject": {"kind": "Widget", "name": "w1", "namespace": namespace},
            "reason": "Migrated",
            "message": "moved",
            "type": "Normal",
        },
    )
    found = await core.list_namespaced_event(namespace, field_selector="involvedObject.name=w1")
    assert [(event.reason, event.message) for event in found.items] == [("Migrated", "moved")]


async def test_a_test_reaction_answers_instead_and_nothing_is_written(
    emulator: ApiServerEmulator, emulator_kube: KubeConnection
) -> None:
    """kmock's DSL still works: a test can make the API fail a request."""
    emulator["post", emulator.resource("", "v1", "secrets")] << 503
    async with emulator_kube.api() as api:
        core = client.CoreV1Api(api)
        with pytest.raises(ApiException) as caught:
            await core.create_namespaced_secret("default", {"metadata": {"name": "s"}})
        assert caught.value.status == 503
        assert (await core.list_namespaced_secret("default")).items == []
