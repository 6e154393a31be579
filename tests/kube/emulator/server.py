"""``ApiServerEmulator``: kmock's ``KubernetesEmulator`` made to answer as a real API
server does, for Kopf, the official clients and an operator's tests.

kmock keeps its part: the HTTP server, the request log and its DSL (a test can still
intercept any request: ``emulator['patch', kmock.resource('', 'v1', 'pods')] << 500``),
API discovery, and ``emulator.objects`` for looking at stored objects. What kmock 0.8's
emulator leaves out (see ``test_kmock_gaps.py``) is done here: the store
(``store.py``), the watch cache (``watching.py``), the controllers
(``controllers.py``) and the request handling below.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock
import yaml
from kmock._internal.rendering import StreamingError

from tests.kube.emulator import errors, paths
from tests.kube.emulator.controllers import Controllers
from tests.kube.emulator.resources import BUILTINS, ServedResource, from_crd
from tests.kube.emulator.selectors import FieldSelector, LabelSelector
from tests.kube.emulator.store import ObjectStore
from tests.kube.emulator.watching import Change, WatchCache, Watcher

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
# With keep_requests off, the request log kmock matches reactions against is cut to this.
# One is enough: a request is matched as soon as it is logged, with no await between
# (kmock checks each reaction by scanning the log: the matching costs its length).
RECENT_REQUESTS = 1


def _status_ok(code: int = 201) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Success", "code": code}


@attrs.define(kw_only=True)
class ApiServerEmulator(kmock.KubernetesEmulator):
    """The API server stand-in. ``crds``: files or directories of CRD YAML to serve."""

    crds: tuple[Path, ...] = attrs.field(default=(), converter=lambda v: tuple(map(Path, v)))
    history_limit: int = 5  # versions kept per object in ``objects`` (memory stays bounded)
    watch_window: int = 100_000  # changes a watch can resume from; older ones get 410 Gone
    bookmark_interval: float = 10.0  # seconds between BOOKMARKs on an idle watch
    keep_requests: bool = True  # kmock's whole request log (off: only the recent ones)
    kubernetes_version: str = "1.33.0"  # what GET /version reports

    _served: dict[tuple[str, str, str], ServedResource] = attrs.field(factory=dict, init=False)
    _by_key: dict[kmock.resource, ServedResource] = attrs.field(factory=dict, init=False)
    _cache: WatchCache = attrs.field(init=False)
    _store: ObjectStore = attrs.field(init=False)
    _controllers: Controllers = attrs.field(init=False)
    # Exceptions that are the emulator's own failures (answered 500), not API errors.
    internal_errors: list[BaseException] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        # The scaffold serves discovery; the stock emulator's handlers are not registered:
        # every API request goes to ``_serve`` instead.
        kmock.KubernetesScaffold.__attrs_post_init__(self)
        self.fallback[self._is_api_request] << self._serve
        self._cache = WatchCache(self.watch_window)
        self._store = ObjectStore(self.objects, self._cache, self.history_limit)
        self._store.observers.append(self._track_crds)
        self._controllers = Controllers(self._store, self._by_key.get)
        for builtin in BUILTINS:
            self._register(builtin)
        namespaces = self._served[("", "v1", "namespaces")]
        for name in DEFAULT_NAMESPACES:
            self._store.create(namespaces, None, {"metadata": {"name": name}})
        for path in self.crds:
            self.load_crds(path)

    # --- what tests call directly ------------------------------------------------------

    def load_crds(self, path: Path) -> list[str]:
        """Create (or update) the CRDs in a YAML file or a directory of them; their names."""
        files = (
            sorted(file for pattern in ("*.yaml", "*.yml", "*.json") for file in path.glob(pattern))
            if path.is_dir()
            else [path]
        )
        served = self._served[("apiextensions.k8s.io", "v1", "customresourcedefinitions")]
        loaded = []
        for file in files:
            for doc in yaml.safe_load_all(file.read_text()):
                if not isinstance(doc, Mapping) or doc.get("kind") != "CustomResourceDefinition":
                    continue
                name = doc["metadata"]["name"]
                current = self._store.find(served, None, name)
                if current is None:
                    self._store.create(served, None, doc)
                else:
                    finalizers = current["metadata"].get("finalizers")
                    update = {
                        **doc,
                        "metadata": {
                            **doc["metadata"],
                            "finalizers": finalizers,
                            "resourceVersion": None,
                        },
                    }
                    self._store.replace(served, None, name, update, None)
                loaded.append(name)
        return loaded

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion handed out."""
        return self._store.rv

    @property
    def watchers(self) -> int:
        """Watch streams open now (a client that went away closes its stream)."""
        return self._cache.watchers

    def served(self, group: str, version: str, plural: str) -> ServedResource | None:
        return self._served.get((group, version, plural))

    # --- HTTP: kmock's entry point, with the paths parsed right --------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        raw_response: aiohttp.web.StreamResponse | None = None
        try:
            request = await self._parse(raw_request)
            self._requests.append(request)
            if not self.keep_requests and len(self._requests) > RECENT_REQUESTS:
                # kmock finds a request's reaction by looking for it in its log, from
                # the start: a log that only grows makes every request slower.
                del self._requests[:-RECENT_REQUESTS]
            try:
                return await self._handle(request)
            except StreamingError as exc:
                raw_response = exc.args[0]
                raise exc.__cause__ or exc from None
        except Exception as exc:  # noqa: BLE001 - any failure is answered as a Status, as kmock does
            if not isinstance(exc, errors.ApiError | kmock.KubernetesError):
                self.internal_errors.append(exc)
            if raw_response is None or not raw_response.prepared:
                return await self._render_error(exc)
            await self._stream_error(exc, raw_response)
            await raw_response.write_eof()
            return raw_response

    async def _parse(self, raw_request: aiohttp.web.BaseRequest) -> kmock.Request:
        body = await raw_request.read()
        text = body.decode("utf-8", errors="replace")
        try:
            data = json.loads(text) if text else None
        except ValueError:
            data = None
        api = paths.parse(raw_request.path)
        query = dict(raw_request.query)
        method = kmock.method(raw_request.method)
        action: kmock.action | None = None
        resource = None
        if api is not None:
            resource = kmock.resource(group=api.group, version=api.version, plural=api.plural)
            if api.plural is not None:
                action = self._action(method, api, query)
        return kmock.Request(
            id=len(self._requests),
            raw_request=raw_request,
            # A real server answers /apis/ as /apis (kubernetes_asyncio asks for /apis/).
            url=raw_request.url.with_path(raw_request.path.rstrip("/") or "/"),
            method=raw_request.method,
            params=query,
            headers=dict(raw_request.headers),
            cookies=dict(raw_request.cookies),
            body=body,
            text=text,
            data=data,
            action=action,
            resource=resource,
            namespace=api.namespace if api else None,
            name=api.name if api else None,
            subresource=api.subresource if api else None,
        )

    @staticmethod
    def _action(
        method: kmock.method, api: paths.ApiPath, query: Mapping[str, str]
    ) -> kmock.action | None:
        if method == kmock.method.GET and paths.truthy(query.get("watch")):
            return kmock.action.WATCH
        if api.name is None:
            return {
                kmock.method.GET: kmock.action.LIST,
                kmock.method.POST: kmock.action.CREATE,
            }.get(method)
        return {
            kmock.method.GET: kmock.action.FETCH,
            kmock.method.PATCH: kmock.action.UPDATE,
            kmock.method.PUT: kmock.action.UPDATE,
            kmock.method.DELETE: kmock.action.DELETE,
        }.get(method)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        # Not the stock emulator's: it writes objects before any reaction is consulted.
        # Here a write happens only when no test reaction answered the request instead.
        return await kmock.RawHandler._handle(self, request)

    async def _serve_server_version(self, request: kmock.Request) -> kmock.Payload:
        # kmock says 1.26; what is emulated here (CEL rules with fieldPath, policy/v1) is
        # newer, and Helm checks a chart's kubeVersion against this.
        major, minor, _patch = self.kubernetes_version.split(".")
        return {
            "major": major,
            "minor": minor,
            "gitVersion": f"v{self.kubernetes_version}",
            "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "go1.24.0",
            "compiler": "gc",
            "platform": "linux/amd64",
        }

    async def _serve_version(self, request: kmock.Request) -> kmock.Payload:
        found: dict[str, Any] = await kmock.KubernetesScaffold._serve_version(self, request)
        found["groupVersion"] = found["groupVersion"].removeprefix("/")  # "v1", not "/v1"
        return found

    def _get_resources(self) -> list[kmock.resource]:
        return [kmock.resource(*key) for key in self._served]

    # --- the API ------------------------------------------------------------------------

    @staticmethod
    def _is_api_request(request: kmock.Request) -> bool:
        return request.resource is not None and request.resource.plural is not None

    def _serve(self, request: kmock.Request) -> kmock.Response:
        assert request.resource is not None and request.resource.plural is not None
        group, version, plural = (
            request.resource.group or "",
            request.resource.version or "",
            request.resource.plural,
        )
        where = request.url.path
        served = self._served.get((group, version, plural))
        if served is None or (request.namespace and not served.namespaced):
            raise errors.unknown_resource(where)
        sub = request.subresource
        if sub is not None and (sub not in served.subresources or request.name is None):
            raise errors.unknown_resource(where)
        params = request.params
        if params.get("dryRun"):
            raise errors.bad_request("dryRun is not supported by the emulator")
        namespace, name, method = request.namespace, request.name, request.method.value
        if method == "GET":
            if paths.truthy(params.get("watch")):
                return self._watch(served, request, namespace, name)
            if name is None:
                return self._answer(200, self._list(served, namespace, params))
            return self._answer(
                200, self._present(served, self._store.get(served, namespace, name))
            )
        if method == "POST" and name is None and served.plural == "bindings":
            name = str(((request.data or {}).get("metadata") or {}).get("name"))
            return self._bind(self._served[("", "v1", "pods")], namespace, name, request.data)
        if method == "POST" and name is None:
            return self._answer(
                201, self._present(served, self._store.create(served, namespace, request.data))
            )
        if method == "POST" and sub == "eviction":
            return self._answer(201, self._evict(served, namespace, name, request.data))
        if method == "POST" and sub == "binding":
            return self._bind(served, namespace, name, request.data)
        if method == "PUT" and name is not None:
            updated = self._store.replace(served, namespace, name, request.data, sub)
            return self._answer(200, self._present(served, updated))
        if method == "PATCH" and name is not None:
            content_type = next(
                (v for k, v in request.headers.items() if k.lower() == "content-type"), ""
            )
            patched = self._store.patch(served, namespace, name, content_type, request.data, sub)
            return self._answer(200, self._present(served, patched))
        if method == "DELETE" and sub is None:
            options = self._delete_options(request)
            if name is None:
                return self._answer(
                    200, self._delete_collection(served, namespace, params, options)
                )
            obj, gone = self._delete(served, namespace, name, options)
            return self._answer(200 if gone else 202, self._present(served, obj))
        raise errors.method_not_allowed(method, where)

    def _bind(
        self, pods: ServedResource, namespace: str | None, name: str, body: Any
    ) -> kmock.Response:
        target = (body or {}).get("target") or {} if isinstance(body, Mapping) else {}
        if target.get("kind", "Node") != "Node" or not target.get("name"):
            raise errors.bad_request("a binding's target must name a Node")
        self._store.bind(pods, self._store.get(pods, namespace, name), target["name"])
        return self._answer(201, _status_ok())

    @staticmethod
    def _answer(status: int, payload: Any) -> kmock.Response:
        return kmock.Response(status=status, payload=payload)

    def _present(self, served: ServedResource, obj: dict[str, Any]) -> dict[str, Any]:
        if obj.get("apiVersion") == served.api_version:
            return obj
        return {**obj, "apiVersion": served.api_version}

    def _list(
        self, served: ServedResource, namespace: str | None, params: Mapping[str, str]
    ) -> dict[str, Any]:
        labels = LabelSelector.parse(params.get("labelSelector"))
        fields = FieldSelector.parse(params.get("fieldSelector"), served.plural)
        items = sorted(
            (
                obj
                for obj in self._store.all_of(served, namespace)
                if labels.matches(obj["metadata"].get("labels")) and fields.matches(obj)
            ),
            key=lambda obj: (obj["metadata"].get("namespace") or "", obj["metadata"]["name"]),
        )
        meta: dict[str, Any] = {"resourceVersion": str(self._store.rv)}
        if params.get("continue"):
            try:
                after = json.loads(base64.urlsafe_b64decode(params["continue"]))
            except ValueError as exc:
                raise errors.bad_request(f"invalid continue token: {exc}") from exc
            items = [
                obj
                for obj in items
                if [obj["metadata"].get("namespace") or "", obj["metadata"]["name"]] > after
            ]
        limit = int(params.get("limit") or 0)
        if 0 < limit < len(items):
            last = items[limit - 1]["metadata"]
            token = json.dumps([last.get("namespace") or "", last["name"]])
            meta["continue"] = base64.urlsafe_b64encode(token.encode()).decode()
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        return {
            "apiVersion": served.api_version,
            "kind": f"{served.kind}List",
            "metadata": meta,
            "items": [self._present(served, obj) for obj in items],
        }

    def _watch(
        self,
        served: ServedResource,
        request: kmock.Request,
        namespace: str | None,
        name: str | None,
    ) -> kmock.Response:
        params = request.params
        labels = LabelSelector.parse(params.get("labelSelector"))
        fields = FieldSelector.parse(params.get("fieldSelector"), served.plural)
        pinned = name or fields.name()

        def matches(obj: Mapping[str, Any]) -> bool:
            meta = obj["metadata"]
            return (
                (namespace is None or meta.get("namespace") == namespace)
                and (pinned is None or meta["name"] == pinned)
                and labels.matches(meta.get("labels"))
                and fields.matches(obj)
            )

        raw_rv = params.get("resourceVersion") or "0"
        try:
            since = int(raw_rv)
        except ValueError:
            raise errors.bad_request(f"invalid resourceVersion {raw_rv!r}") from None
        initial_events = paths.truthy(params.get("sendInitialEvents"))
        bookmarks = paths.truthy(params.get("allowWatchBookmarks"))
        if initial_events and (
            params.get("resourceVersionMatch") != "NotOlderThan" or not bookmarks
        ):
            raise errors.invalid(
                "ListOptions",
                "",
                [
                    (
                        "sendInitialEvents",
                        "Forbidden: "
                        "sendInitialEvents needs resourceVersionMatch=NotOlderThan and "
                        "allowWatchBookmarks=true",
                    )
                ],
            )
        timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        watcher = Watcher(served.key, matches)
        first: list[dict[str, Any]]
        if since and self._cache.too_old(since):
            first = [
                {
                    "type": "ERROR",
                    "object": {
                        "apiVersion": "v1",
                        "kind": "Status",
                        "metadata": {},
                        "status": "Failure",
                        "reason": "Expired",
                        "code": 410,
                        "message": f"too old resource version: {since} "
                        f"({self._cache.compacted + 1})",
                    },
                }
            ]
            return self._answer(200, self._events(request, served, None, first, False, 0.0, False))
        if since == 0 or initial_events:
            first = [
                {"type": "ADDED", "object": obj}
                for obj in sorted(
                    (o for o in self._store.all_of(served, namespace) if matches(o)),
                    key=lambda o: int(o["metadata"]["resourceVersion"]),
                )
            ]
            first += self._cache.subscribe(watcher, None)
        else:
            first = self._cache.subscribe(watcher, since)
        return kmock.Response(
            status=200,
            headers={"Content-Type": "application/json"},
            payload=self._events(
                request, served, watcher, first, bookmarks, timeout, initial_events
            ),
        )

    async def _events(
        self,
        request: kmock.Request,
        served: ServedResource,
        watcher: Watcher | None,
        first: list[dict[str, Any]],
        bookmarks: bool,
        timeout: float | None,
        initial_end: bool,
    ) -> AsyncIterator[Any]:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        last_bookmark = loop.time()
        raw = request._raw_request
        try:
            yield b""  # the headers go out now, as a real server sends them at once
            for event in first:
                yield self._present_event(served, event)
            if watcher is None:
                return
            if initial_end:
                yield self._bookmark(served, {"k8s.io/initial-events-end": "true"})
            while deadline is None or loop.time() < deadline:
                if raw is None or raw.transport is None or raw.transport.is_closing():
                    return  # the client went away
                wait = 1.0 if deadline is None else max(min(1.0, deadline - loop.time()), 0.0)
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    if bookmarks and loop.time() - last_bookmark >= self.bookmark_interval:
                        last_bookmark = loop.time()
                        yield self._bookmark(served)
                    continue
                yield self._present_event(served, event)
        finally:
            if watcher is not None:
                self._cache.unsubscribe(watcher)

    def _present_event(self, served: ServedResource, event: dict[str, Any]) -> dict[str, Any]:
        if event["type"] == "ERROR":
            return event
        return {"type": event["type"], "object": self._present(served, event["object"])}

    def _bookmark(
        self, served: ServedResource, annotations: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {"resourceVersion": str(self._store.rv)}
        if annotations:
            meta["annotations"] = dict(annotations)
        return {
            "type": "BOOKMARK",
            "object": {"apiVersion": served.api_version, "kind": served.kind, "metadata": meta},
        }

    @staticmethod
    def _delete_options(request: kmock.Request) -> dict[str, Any]:
        options = dict(request.data) if isinstance(request.data, Mapping) else {}
        for field in ("gracePeriodSeconds", "propagationPolicy"):
            if request.params.get(field) is not None:
                options[field] = request.params[field]
        return options

    def _delete(
        self, served: ServedResource, namespace: str | None, name: str, options: Mapping[str, Any]
    ) -> tuple[dict[str, Any], bool]:
        if options.get("propagationPolicy") == "Orphan":
            uid = self._store.get(served, namespace, name)["metadata"]["uid"]
            self._orphan_dependents(uid)
        return self._store.delete(served, namespace, name, options)

    def _orphan_dependents(self, uid: str) -> None:
        for key, obj in self._store.everything():
            owners = obj["metadata"].get("ownerReferences") or []
            kept = [owner for owner in owners if owner.get("uid") != uid]
            if len(kept) != len(owners):
                dependent = self._by_key[key[0]]
                meta = {**obj["metadata"], "ownerReferences": kept or None}
                self._store.replace(dependent, key[1], key[2], {**obj, "metadata": meta}, None)

    def _delete_collection(
        self,
        served: ServedResource,
        namespace: str | None,
        params: Mapping[str, str],
        options: Mapping[str, Any],
    ) -> dict[str, Any]:
        listed = self._list(served, namespace, params)
        items = []
        for obj in listed["items"]:
            meta = obj["metadata"]
            items.append(self._delete(served, meta.get("namespace"), meta["name"], options)[0])
        return {**listed, "items": items}

    def _evict(
        self, served: ServedResource, namespace: str | None, name: str, body: Any
    ) -> dict[str, Any]:
        pod = self._store.get(served, namespace, name)
        if pod["metadata"].get("deletionTimestamp"):
            return _status_ok()
        self._controllers.eviction_verdict(pod)
        options = (body or {}).get("deleteOptions") or {} if isinstance(body, Mapping) else {}
        self._store.delete(served, namespace, name, options)
        return _status_ok()

    # --- served resources ---------------------------------------------------------------

    def _register(self, served: ServedResource) -> None:
        self._served[(served.group, served.version, served.plural)] = served
        self._by_key.setdefault(served.key, served)
        self.resources[kmock.resource(served.group, served.version, served.plural)] = served.info()

    def _unregister(self, crd: str) -> None:
        for key, served in list(self._served.items()):
            if served.crd == crd:
                del self._served[key]
                self._by_key.pop(served.key, None)
                del self.resources[kmock.resource(*key)]

    def _track_crds(self, change: Change) -> None:
        if change.resource != kmock.resource(
            "apiextensions.k8s.io", "v1", "customresourcedefinitions"
        ):
            return
        name = change.new["metadata"]["name"]
        self._unregister(name)
        if change.type != "DELETED":
            for served in from_crd(change.new):
                self._register(served)
