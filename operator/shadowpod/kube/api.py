"""The few Kubernetes API calls the operator makes, as JSON in and out.

Objects stay plain dicts (what the API returns, what ``manifests`` builds), read into
the pydantic models where the operator reasons about them. API errors become the
engine's errors: what may pass (the API server unreachable, overloaded, a conflict)
is ``RuntimeUnavailable``, which the engine and Kopf retry; anything else is a
``KubeError`` with the API's own reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from shadowpod.domain.errors import ShadowpodError
from shadowpod.engine.ports import RuntimeUnavailable
from shadowpod.kube.models.v1alpha1 import GROUP, VERSION

MERGE: Final = "application/merge-patch+json"
# Statuses worth asking again: the server is overloaded, busy, or someone wrote first.
_TRANSIENT: Final = frozenset({409, 429, 500, 502, 503, 504})


class KubeError(ShadowpodError):
    """The API server refused a request for good (a 4xx other than a conflict)."""

    reason = "KubeApiError"

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason or self.reason


class AlreadyExists(KubeError):
    pass


def namespaced(plural: str, namespace: str, name: str | None = None) -> str:
    """The path of a kind the operator uses, in ``namespace`` (a collection without name)."""
    prefix = {
        "pods": "/api/v1",
        "secrets": "/api/v1",
        "configmaps": "/api/v1",
        "events": "/api/v1",
        "poddisruptionbudgets": "/apis/policy/v1",
        "agentsessions": f"/apis/{GROUP}/{VERSION}",
        "agentmigrations": f"/apis/{GROUP}/{VERSION}",
        "agentdeployments": f"/apis/{GROUP}/{VERSION}",
    }[plural]
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    return path if name is None else f"{path}/{name}"


class KubeApi:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        # Requests sent (the operator's idle cost is counted by them; Kopf's own
        # watches and patches are not made here).
        self.requests = 0

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        self.requests += 1
        try:
            response = await self.api.call_api(
                path,
                method,
                query_params=list((query or {}).items()),
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body,
                _preload_content=False,
                _return_http_data_only=True,
                auth_settings=["BearerToken"],
            )
            text = await response.text()
            status = response.status
        except ApiException as exc:
            raise _error(exc.status or 0, exc.body, f"{method} {path}") from exc
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise RuntimeUnavailable(
                f"the API server did not answer {method} {path}: {exc}"
            ) from exc
        if status >= 400:  # with _preload_content=False the client raises nothing itself
            raise _error(status, text, f"{method} {path}")
        return json.loads(text) if text else None

    async def post_raw(self, path: str, *, query: Mapping[str, str]) -> tuple[int, str]:
        """A POST whose every answer is the caller's to read (a node proxy's: the kubelet
        answers with its own codes and plain-text errors): the status and the body."""
        self.requests += 1
        try:
            response = await self.api.call_api(
                path,
                "POST",
                query_params=list(query.items()),
                header_params={"Accept": "application/json"},
                _preload_content=False,
                _return_http_data_only=True,
                auth_settings=["BearerToken"],
            )
            return response.status, await response.text()
        except ApiException as exc:
            return exc.status or 0, str(exc.body or exc.reason or "")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise RuntimeUnavailable(f"the API server did not answer POST {path}: {exc}") from exc

    async def get(self, path: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await self._call("GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return found

    async def list(self, path: str, *, labels: Mapping[str, str] | None = None) -> list[Any]:
        query = {}
        if labels:
            query["labelSelector"] = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        listed = await self._call("GET", path, query=query)
        items: list[Any] = listed.get("items", [])
        return items

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = await self._call("POST", path, body=dict(body))
        return created

    async def patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """A merge patch; ``None`` when the object is gone."""
        try:
            patched: dict[str, Any] = await self._call(
                "PATCH", path, body=dict(body), content_type=MERGE
            )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return patched

    async def delete(self, path: str, *, grace_s: int | None = None) -> bool:
        """Delete (gracefully, with ``grace_s``); ``False`` when it was already gone."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_s is not None:
            body["gracePeriodSeconds"] = grace_s
        try:
            await self._call("DELETE", path, body=body)
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True


def _error(status: int, raw: Any, what: str) -> ShadowpodError:
    reason, message = "", ""
    try:
        parsed = json.loads(raw) if raw else {}
        reason, message = str(parsed.get("reason", "")), str(parsed.get("message", ""))
    except (ValueError, TypeError, AttributeError):
        message = str(raw or "")
    text = f"{what}: {status} {reason} {message}".strip()
    if status == 409 and reason == "AlreadyExists":
        return AlreadyExists(status, reason, text)
    if status in _TRANSIENT or status == 0:
        return RuntimeUnavailable(text)
    return KubeError(status, reason, text)
