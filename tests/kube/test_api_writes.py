"""What an operator relies on from the API server when it writes, checked through
kubernetes_asyncio on the emulator (and on a real cluster, when one is given)."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from tests.kube.support import Widgets


async def test_a_create_answers_the_stored_object_with_its_server_fields(
    widgets: Widgets, namespace: str
) -> None:
    created = await widgets.create("w1", {"size": 1})

    assert created is not None, "a create must answer 201 with the object"
    meta = created["metadata"]
    assert meta["name"] == "w1" and meta["namespace"] == namespace
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert meta["resourceVersion"] and meta["generation"] == 1
    assert created["apiVersion"] == "test.shadowpod.dev/v1" and created["kind"] == "Widget"
    assert await widgets.get("w1") == created


async def test_generate_name_makes_a_unique_name(widgets: Widgets) -> None:
    made = [
        await widgets.objects.create_namespaced_custom_object(
            "test.shadowpod.dev",
            "v1",
            widgets.namespace,
            "widgets",
            {
                "apiVersion": "test.shadowpod.dev/v1",
                "kind": "Widget",
                "metadata": {"generateName": "w-"},
                "spec": {},
            },
        )
        for _ in range(2)
    ]

    names = {widget["metadata"]["name"] for widget in made}
    assert len(names) == 2 and all(name.startswith("w-") and len(name) > 2 for name in names)


async def test_creating_an_existing_name_is_a_conflict(widgets: Widgets) -> None:
    await widgets.create("w1")
    with pytest.raises(ApiException) as caught:
        await widgets.create("w1")
    assert caught.value.status == 409
    assert '"AlreadyExists"' in caught.value.body


async def test_every_write_gets_a_new_resource_version_and_a_stale_one_conflicts(
    widgets: Widgets,
) -> None:
    created = await widgets.create("w1", {"size": 1})
    stale = created["metadata"]["resourceVersion"]
    patched = await widgets.patch("w1", {"spec": {"size": 2}})
    assert patched["metadata"]["resourceVersion"] != stale

    with pytest.raises(ApiException) as on_replace:
        await widgets.replace("w1", {**created, "spec": {"size": 3}})
    with pytest.raises(ApiException) as on_patch:
        await widgets.patch("w1", {"metadata": {"resourceVersion": stale}, "spec": {"size": 3}})

    assert on_replace.value.status == on_patch.value.status == 409
    assert (await widgets.get("w1"))["spec"] == {"size": 2}
    fresh = await widgets.get("w1")
    replaced = await widgets.replace("w1", {**fresh, "spec": {"size": 4}})
    assert replaced["spec"] == {"size": 4}


async def test_a_failed_json_patch_test_is_unprocessable(widgets: Widgets) -> None:
    """Kopf guards its JSON patches with a ``test`` of the resourceVersion."""
    await widgets.create("w1", {"size": 1})
    with pytest.raises(ApiException) as caught:
        await widgets.patch(
            "w1",
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": "no-such-version"},
                {"op": "replace", "path": "/spec/size", "value": 9},
            ],
        )
    assert caught.value.status == 422
    assert (await widgets.get("w1"))["spec"] == {"size": 1}


async def test_a_label_value_over_63_characters_is_refused_on_create_and_on_patch(
    widgets: Widgets,
) -> None:
    """As on a real API server: an operator whose labels are built from names longer
    than the limit has its pods refused there, and must be here too."""
    fits, too_long = "m" * 63, "m" * 64
    await widgets.create("w1", {"size": 1}, labels={"shadowpod.dev/migration": fits})
    with pytest.raises(ApiException) as created:
        await widgets.create("w2", {"size": 1}, labels={"shadowpod.dev/migration": too_long})
    assert created.value.status == 422
    assert "must be no more than 63 bytes" in created.value.body
    with pytest.raises(ApiException) as patched:
        await widgets.patch("w1", {"metadata": {"labels": {"shadowpod.dev/migration": too_long}}})
    assert patched.value.status == 422
    with pytest.raises(ApiException) as odd:
        await widgets.patch("w1", {"metadata": {"labels": {"role": "-owner"}}})
    assert odd.value.status == 422
    assert (await widgets.get("w1"))["metadata"]["labels"] == {"shadowpod.dev/migration": fits}


async def test_generation_counts_spec_changes_only(widgets: Widgets) -> None:
    await widgets.create("w1", {"size": 1})
    labelled = await widgets.patch("w1", {"metadata": {"labels": {"a": "b"}}})
    statused = await widgets.patch_status("w1", {"status": {"phase": "Ready"}})
    assert labelled["metadata"]["generation"] == statused["metadata"]["generation"] == 1

    changed = await widgets.patch("w1", {"spec": {"size": 2}})
    assert changed["metadata"]["generation"] == 2


async def test_the_status_subresource_writes_status_only_and_the_main_resource_no_status(
    widgets: Widgets,
) -> None:
    await widgets.create("w1", {"size": 1})
    via_status = await widgets.patch_status(
        "w1", {"spec": {"size": 100}, "status": {"phase": "Ready"}}
    )
    via_main = await widgets.patch("w1", {"spec": {"size": 2}, "status": {"phase": "Broken"}})

    assert via_status["spec"] == {"size": 1} and via_status["status"] == {"phase": "Ready"}
    assert via_main["spec"] == {"size": 2} and via_main["status"] == {"phase": "Ready"}


async def test_a_write_that_changes_nothing_keeps_the_resource_version(widgets: Widgets) -> None:
    created = await widgets.create("w1", {"size": 1})
    again = await widgets.patch("w1", {"spec": {"size": 1}})
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


async def test_finalizers_hold_a_deletion_until_they_are_removed(widgets: Widgets) -> None:
    await widgets.create("w1", finalizers=["shadowpod.dev/test"])
    await widgets.delete("w1")

    held = await widgets.get("w1")
    assert held["metadata"]["deletionTimestamp"]
    with pytest.raises(ApiException) as caught:
        await widgets.patch("w1", {"metadata": {"finalizers": ["shadowpod.dev/test", "more"]}})
    assert caught.value.status == 422  # no new finalizers once deletion started

    await widgets.patch("w1", {"metadata": {"finalizers": []}})
    assert await widgets.gone("w1")


async def test_a_deletion_without_finalizers_is_immediate(widgets: Widgets) -> None:
    await widgets.create("w1")
    await widgets.delete("w1")
    assert await widgets.gone("w1")


async def test_a_missing_object_is_not_found(widgets: Widgets) -> None:
    for call in (widgets.get("nope"), widgets.patch("nope", {"spec": {}}), widgets.delete("nope")):
        with pytest.raises(ApiException) as caught:
            await call
        assert caught.value.status == 404


async def test_custom_resources_refuse_strategic_merge_patches(
    api: client.ApiClient, widgets: Widgets
) -> None:
    await widgets.create("w1", {"size": 1})
    with pytest.raises(ApiException) as caught:
        await api.call_api(
            f"/apis/test.shadowpod.dev/v1/namespaces/{widgets.namespace}/widgets/w1",
            "PATCH",
            header_params={"Content-Type": "application/strategic-merge-patch+json"},
            body={"spec": {"size": 2}},
            _return_http_data_only=True,
        )
    assert caught.value.status == 415


async def test_a_list_pages_through_limit_and_continue(widgets: Widgets) -> None:
    for index in range(5):
        await widgets.create(f"w{index}")
    seen, token = [], None
    while True:
        page = await widgets.list(limit=2, **({"_continue": token} if token else {}))
        seen += [item["metadata"]["name"] for item in page["items"]]
        token = page["metadata"].get("continue")
        if not token:
            break
    assert sorted(seen) == [f"w{index}" for index in range(5)]


async def test_objects_in_a_namespace_that_does_not_exist_are_refused(
    api: client.ApiClient,
) -> None:
    with pytest.raises(ApiException) as caught:
        await client.CoreV1Api(api).create_namespaced_secret(
            "no-such-namespace-here", {"metadata": {"name": "s"}}
        )
    assert caught.value.status == 404


async def test_a_secret_folds_string_data_into_data(api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_secret(
        namespace, {"metadata": {"name": "s"}, "stringData": {"token": "abc"}}
    )
    secret = await core.read_namespaced_secret("s", namespace)
    assert secret.data == {"token": "YWJj"} and secret.string_data is None


async def test_an_event_with_an_event_time_must_say_who_reported_it_and_what_was_done(
    api: client.ApiClient, namespace: str
) -> None:
    """A real API server refuses (422) an Event that has an eventTime and lacks its
    reportingInstance or action; a legacy Event (no eventTime) needs neither. The
    emulator stored both, and hid that every event of the operator was refused."""
    core = client.CoreV1Api(api)
    event: dict[str, object] = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "e1"},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": namespace},
        "reason": "Tested",
        "message": "a test",
        "type": "Normal",
        "eventTime": "2026-11-27T02:00:00.000000Z",
        "reportingComponent": "tests",
    }
    with pytest.raises(ApiException) as caught:
        await core.create_namespaced_event(namespace, event)
    assert caught.value.status == 422
    assert "reportingInstance" in caught.value.body and "action" in caught.value.body

    event["reportingInstance"], event["action"] = "tests-1", "Test"
    await core.create_namespaced_event(namespace, event)
    legacy = {
        key: value
        for key, value in event.items()
        if key not in ("eventTime", "reportingComponent", "reportingInstance", "action")
    }
    legacy["metadata"] = {"name": "e2"}
    await core.create_namespaced_event(namespace, legacy)
