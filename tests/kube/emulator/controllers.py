"""The controllers a real cluster runs beside its API server, reduced to what an
operator relies on: the garbage collector (ownerReferences), the namespace and CRD
clean-up, the pod garbage collector (pods of a node that is gone) and the disruption
controller (PodDisruptionBudget status, and the verdict on an eviction).

They react to changes after the write that caused them has been answered (as real
controllers do, never inside the request), in the order the changes were made.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Mapping
from typing import Any

import kmock

from tests.kube.emulator import errors
from tests.kube.emulator.resources import ServedResource
from tests.kube.emulator.selectors import LabelSelector
from tests.kube.emulator.store import ObjectStore, now
from tests.kube.emulator.watching import Change

PODS = kmock.resource("", "v1", "pods")
PDBS = kmock.resource("policy", "v1", "poddisruptionbudgets")
NODES = kmock.resource("", "v1", "nodes")
NAMESPACES = kmock.resource("", "v1", "namespaces")
CRDS = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
CRD_CLEANUP = "customresourcecleanup.apiextensions.k8s.io"


class Controllers:
    def __init__(
        self, store: ObjectStore, served_by_key: Callable[[kmock.resource], ServedResource | None]
    ):
        self.store = store
        self.served_by_key = served_by_key
        self._backlog: list[Change] = []  # changes made before the event loop ran
        store.observers.append(self.observe)

    def observe(self, change: Change) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._backlog.append(change)
            return
        for earlier in self._backlog:
            loop.call_soon(self._react, earlier)
        self._backlog.clear()
        loop.call_soon(self._react, change)

    def _react(self, change: Change) -> None:
        meta = change.new["metadata"]
        namespace = meta.get("namespace")
        with contextlib.suppress(errors.ApiError):
            if change.type == "DELETED":
                self._collect_dependents(meta.get("uid"))
                if change.resource == NODES:
                    self._collect_pods_of(meta["name"])
                if namespace:
                    self._finish_namespace(namespace)
                if change.resource not in (CRDS, NAMESPACES):
                    self._finish_crds_of(change.resource)
            elif meta.get("ownerReferences") and change.type == "ADDED":
                self._collect_if_orphaned(change.resource, change.new)
            if change.resource == NAMESPACES and meta.get("deletionTimestamp"):
                self._empty_namespace(meta["name"])
            if change.resource == CRDS and meta.get("deletionTimestamp"):
                self._empty_crd(change.new)
            if change.resource == PDBS and namespace and change.type != "DELETED":
                self.refresh_budgets(namespace, [change.new])
            if change.resource == PODS and namespace:
                self.refresh_budgets(namespace, [], [change.new, change.old])

    # --- garbage collector ------------------------------------------------------------

    def _collect_dependents(self, uid: str | None) -> None:
        if not uid:
            return
        for key, obj in self.store.everything():
            owners = obj["metadata"].get("ownerReferences") or []
            if any(owner.get("uid") == uid for owner in owners):
                self._collect_if_orphaned(key[0], obj)

    def _collect_if_orphaned(self, resource: kmock.resource, obj: Mapping[str, Any]) -> None:
        """Delete ``obj`` when none of its owners exists any more (background policy)."""
        owners = obj["metadata"].get("ownerReferences") or []
        if any(owner.get("uid") in self.store.uids for owner in owners):
            return
        self._delete(resource, obj)

    def _collect_pods_of(self, node: str) -> None:
        for pod in list(self.store.all_of(self._served(PODS))):
            if (pod.get("spec") or {}).get("nodeName") == node:
                self._delete(PODS, pod, grace=0)

    def _delete(
        self, resource: kmock.resource, obj: Mapping[str, Any], grace: int | None = None
    ) -> None:
        served = self.served_by_key(resource)
        meta = obj["metadata"]
        if served is None or (meta.get("deletionTimestamp") and grace is None):
            return
        options = {} if grace is None else {"gracePeriodSeconds": grace}
        with contextlib.suppress(errors.ApiError):
            self.store.delete(served, meta.get("namespace"), meta["name"], options)

    # --- namespaces and CRDs ----------------------------------------------------------

    def _empty_namespace(self, namespace: str) -> None:
        for key, obj in self.store.everything():
            if key[1] == namespace:
                self._delete(key[0], obj)
        self._finish_namespace(namespace)

    def _finish_namespace(self, namespace: str) -> None:
        ns = self.store.find(self._served(NAMESPACES), None, namespace)
        if ns is None or not ns["metadata"].get("deletionTimestamp"):
            return
        if any(key[1] == namespace for key, _ in self.store.everything()):
            return
        self.store.replace(
            self._served(NAMESPACES),
            None,
            namespace,
            {**ns, "spec": {**ns.get("spec", {}), "finalizers": []}},
            None,
        )

    def _empty_crd(self, crd: Mapping[str, Any]) -> None:
        resource = self._crd_key(crd)
        for key, obj in self.store.everything():
            if key[0] == resource:
                self._delete(key[0], obj)
        self._finish_crds_of(resource)

    def _finish_crds_of(self, resource: kmock.resource) -> None:
        served = self.served_by_key(resource)
        if served is None or served.crd is None:
            return
        crd = self.store.find(self._served(CRDS), None, served.crd)
        if crd is None or not crd["metadata"].get("deletionTimestamp"):
            return
        if any(key[0] == resource for key, _ in self.store.everything()):
            return
        finalizers = [f for f in crd["metadata"].get("finalizers") or [] if f != CRD_CLEANUP]
        self.store.replace(
            self._served(CRDS),
            None,
            served.crd,
            {**crd, "metadata": {**crd["metadata"], "finalizers": finalizers}},
            None,
        )

    @staticmethod
    def _crd_key(crd: Mapping[str, Any]) -> kmock.resource:
        spec = crd["spec"]
        storage = next(v["name"] for v in spec["versions"] if v.get("storage"))
        return kmock.resource(spec["group"], storage, spec["names"]["plural"])

    # --- disruption controller --------------------------------------------------------

    def refresh_budgets(
        self, namespace: str, budgets: list[dict[str, Any]], pods: list[Any] | None = None
    ) -> None:
        """Recompute ``budgets``' status, and that of every budget covering ``pods``."""
        served = self._served(PDBS)
        if pods:
            budgets = [
                pdb
                for pdb in self.store.all_of(served, namespace)
                if any(
                    pod and _selector(pdb).matches(pod["metadata"].get("labels")) for pod in pods
                )
            ]
        if not budgets:
            return
        in_namespace = list(self.store.all_of(self._served(PODS), namespace))
        for pdb in budgets:
            current = self.store.find(served, namespace, pdb["metadata"]["name"])
            if current is None:
                continue
            status = self._budget_status(current, in_namespace)
            pdb = current
            with contextlib.suppress(errors.ApiError):
                self.store.write_status(served, pdb, {**(pdb.get("status") or {}), **status})

    def eviction_verdict(self, pod: Mapping[str, Any]) -> None:
        """Raise the API's 429 when a budget covering ``pod`` allows no disruption now."""
        namespace = pod["metadata"]["namespace"]
        pods = list(self.store.all_of(self._served(PODS), namespace))
        budgets = [
            pdb
            for pdb in self.store.all_of(self._served(PDBS), namespace)
            if _selector(pdb).matches(pod["metadata"].get("labels"))
        ]
        if len(budgets) > 1:
            raise errors.ApiError(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction "
                "subresource does not support.",
                {},
            )
        if pod["metadata"].get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in (
            "Pending",
            "Succeeded",
            "Failed",
        ):
            return  # as the API server: no budget guards a pod that is going or not running
        for pdb in budgets:
            status = self._budget_status(pdb, pods)
            if _healthy(pod):
                refused = status["disruptionsAllowed"] <= 0
            else:
                # An unready pod, by the budget's unhealthyPodEvictionPolicy: AlwaysAllow,
                # or IfHealthyBudget (the default): only while the budget is met.
                policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy")
                met = 0 < status["desiredHealthy"] <= status["currentHealthy"]
                refused = policy != "AlwaysAllow" and not met
            if refused:
                raise errors.too_many_requests(
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    [
                        {
                            "reason": "DisruptionBudget",
                            "message": f"The disruption budget {pdb['metadata']['name']} needs "
                            f"{status['desiredHealthy']} healthy pods and has "
                            f"{status['currentHealthy']} currently",
                        }
                    ],
                )

    def _budget_status(self, pdb: Mapping[str, Any], pods: list[Any]) -> dict[str, Any]:
        """The budget's status, as kube-controller-manager's disruption controller
        writes it: a budget that needs its pods' scale (``maxUnavailable``, or
        ``minAvailable`` as a percentage) whose pods' controller has no scale
        subresource cannot be computed, and is failed safe (no disruption allowed,
        ``SyncFailed``; the real controller retries it, with a Warning event, for as
        long as it exists)."""
        spec = pdb.get("spec") or {}
        minimum = spec.get("minAvailable")
        if spec.get("maxUnavailable") is not None or isinstance(minimum, str):
            covered = [p for p in pods if _selector(pdb).matches(p["metadata"].get("labels"))]
            if (failure := self._unscalable(covered)) is not None:
                return fail_safe(pdb, failure)
        return budget_status(pdb, pods)

    def _unscalable(self, pods: list[Any]) -> str | None:
        """Why the scale of ``pods``' controllers cannot be read, if it cannot (a pod
        with no controller is left out, as the real controller does)."""
        for pod in pods:
            refs = pod["metadata"].get("ownerReferences") or []
            ref = next((r for r in refs if r.get("controller")), None)
            if ref is None:
                continue
            group = ref["apiVersion"].rpartition("/")[0]
            if (group, ref["kind"]) in SCALABLE_BUILT_IN:
                continue
            crd = next(
                (
                    c
                    for c in self.store.all_of(self._served(CRDS))
                    if c["spec"]["group"] == group and c["spec"]["names"]["kind"] == ref["kind"]
                ),
                None,
            )
            versions = [] if crd is None else crd["spec"]["versions"]
            if not any((v.get("subresources") or {}).get("scale") is not None for v in versions):
                plural = (
                    ref["kind"].lower() + "s" if crd is None else crd["spec"]["names"]["plural"]
                )
                return f"{plural}.{group} does not implement the scale subresource"
        return None

    def _served(self, resource: kmock.resource) -> ServedResource:
        served = self.served_by_key(resource)
        assert served is not None, f"{resource} is built in"
        return served


def _selector(pdb: Mapping[str, Any]) -> LabelSelector:
    return LabelSelector.from_object((pdb.get("spec") or {}).get("selector"))


def _healthy(pod: Mapping[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _count(value: Any, expected: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(expected * int(value[:-1]) / 100)
    return int(value)


# The controllers kube-controller-manager reads a scale of without a scale client.
SCALABLE_BUILT_IN = frozenset(
    {
        ("apps", "ReplicaSet"),
        ("apps", "Deployment"),
        ("apps", "StatefulSet"),
        ("", "ReplicationController"),
    }
)


def fail_safe(pdb: Mapping[str, Any], failure: str) -> dict[str, Any]:
    """The disruption controller's ``failSafe``: the status kept, no disruption allowed."""
    status = dict(pdb.get("status") or {})
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != "DisruptionAllowed"]
    conditions.append(
        {
            "type": "DisruptionAllowed",
            "status": "False",
            "reason": "SyncFailed",
            "message": failure,
            "lastTransitionTime": now(),
            "observedGeneration": status.get("observedGeneration", 0),
        }
    )
    return {**status, "disruptionsAllowed": 0, "conditions": conditions}


def budget_status(pdb: Mapping[str, Any], pods: list[Mapping[str, Any]]) -> dict[str, Any]:
    selector = _selector(pdb)
    covered = [
        pod
        for pod in pods
        if selector.matches(pod["metadata"].get("labels"))
        and not pod["metadata"].get("deletionTimestamp")
        and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    ]
    expected = len(covered)
    healthy = sum(1 for pod in covered if _healthy(pod))
    spec = pdb.get("spec") or {}
    if spec.get("minAvailable") is not None:
        desired = _count(spec["minAvailable"], expected)
    elif spec.get("maxUnavailable") is not None:
        desired = max(expected - _count(spec["maxUnavailable"], expected), 0)
    else:
        desired = 0
    allowed = max(healthy - desired, 0)
    previous = {c.get("type"): c for c in (pdb.get("status") or {}).get("conditions") or []}
    state = "True" if allowed > 0 else "False"
    condition = previous.get("DisruptionAllowed") or {}
    if condition.get("status") != state:
        condition = {
            "type": "DisruptionAllowed",
            "status": state,
            "reason": "SufficientPods" if allowed > 0 else "InsufficientPods",
            "message": "",
            "lastTransitionTime": now(),
            "observedGeneration": pdb["metadata"].get("generation", 1),
        }
    return {
        "observedGeneration": pdb["metadata"].get("generation", 1),
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": [condition],
    }
