"""``GatewayClient``: every gateway route, for agents, engines and load generators."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import aiohttp
import orjson
from pydantic import BaseModel, JsonValue

from shadowpod.api.models import (
    SNAPSHOT_SCHEMA_VERSION_HEADER,
    SNAPSHOT_WATERMARK_HEADER,
    Accepted,
    AppendedOut,
    CreateSession,
    DrainReport,
    EventsPage,
    FenceRequest,
    FenceResult,
    OwnerCredential,
    OwnerCredentialRequest,
    OwnershipChange,
    PostMessage,
    ResumeRequest,
    RetentionApplied,
    RetentionPolicy,
    SessionActivity,
    SessionCreated,
    SessionHistory,
    SessionPositions,
    SessionStatus,
    SnapshotInfoOut,
    SnapshotOut,
    SnapshotRequested,
    SuspendRequest,
    SuspendResult,
    UnfenceRequest,
    WakesPage,
)
from shadowpod.client.sse import iter_sse
from shadowpod.domain.entries import JournalEntry, NewEntry, entry_from_json
from shadowpod.domain.errors import ShadowpodError
from shadowpod.domain.ownership import Ownership
from shadowpod.sessions.tokens import INSTANCE_HEADER, OWNER_CREDENTIAL_HEADER

M = TypeVar("M", bound=BaseModel)
REQUEST_TIMEOUT_S: Final = 30.0
_STREAM_TIMEOUT: Final = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=None)


class GatewayError(ShadowpodError):
    """A gateway answer other than success, with its status and ``reason``."""

    def __init__(
        self, status: int, reason: str, message: str, errors: list[Any] | None = None
    ) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.errors = errors or []


@dataclass(frozen=True, slots=True)
class SnapshotDocument:
    """A stored state document as its JSON text, with what a loader needs to read it."""

    watermark: int
    schema_version: int
    document_json: bytes


def _entries(data: str) -> list[JournalEntry]:
    return [entry_from_json(item) for item in orjson.loads(data)]


class GatewayClient:
    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout_s: float = REQUEST_TIMEOUT_S,
        owner: tuple[str, str] | None = None,
    ) -> None:
        """``owner``: the instance's name and owner credential, presented with every
        request (the owner routes of a session made with credentials need them)."""
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        if owner is not None:
            self._headers[INSTANCE_HEADER], self._headers[OWNER_CREDENTIAL_HEADER] = owner
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._http: aiohttp.ClientSession | None = None
        self.requests = 0  # calls made (an operator's idle cost is counted by them)

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=256, force_close=False),
                json_serialize=lambda value: orjson.dumps(value).decode(),
            )
        return self._http

    # --- plumbing ---------------------------------------------------------------------

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: BaseModel | None = None,
        plain: dict[str, Any] | None = None,
        data: bytes | None = None,
        params: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        self.requests += 1
        if body is not None:
            plain = body.model_dump(mode="json")
        if plain is not None:
            data = orjson.dumps(plain)
        headers = {"Content-Type": "application/json"} if data is not None else None
        timeout = self._timeout if timeout_s is None else aiohttp.ClientTimeout(total=timeout_s)
        async with self.http.request(
            method, self.base_url + path, data=data, params=params, headers=headers, timeout=timeout
        ) as response:
            raw = await response.read()
            if response.status >= 400:
                raise _error(response.status, raw)
            return orjson.loads(raw) if raw else None

    async def _stream(self, path: str, params: dict[str, Any]) -> AsyncIterator[list[JournalEntry]]:
        async with self.http.get(
            self.base_url + path,
            params=params,
            timeout=_STREAM_TIMEOUT,
            headers={"Accept": "text/event-stream"},
        ) as response:
            if response.status >= 400:
                raise _error(response.status, await response.read())
            async for event in iter_sse(response.content):
                if event.event == "entries":
                    yield _entries(event.data)

    # --- clients ----------------------------------------------------------------------

    async def post_message(
        self,
        session: str,
        content: str,
        *,
        id: str | None = None,
        role: str = "user",
        meta: dict[str, JsonValue] | None = None,
        wait_s: float = 0,
    ) -> Accepted:
        """``wait_s``: when the message wakes a suspended session, wait up to this long
        for its owner to be up (``Accepted.waking`` says whether it was not)."""
        body = PostMessage.model_validate(
            {"id": id, "content": content, "role": role, "meta": meta or {}}
        )
        params = {"wait": wait_s} if wait_s else None
        # The client's own timeout, unless it waits for an owner longer than that.
        timeout_s = REQUEST_TIMEOUT_S + wait_s if wait_s else None
        return Accepted.model_validate(
            await self._call(
                "POST",
                f"/v1/sessions/{session}/messages",
                body=body,
                params=params,
                timeout_s=timeout_s,
            )
        )

    async def events(
        self,
        session: str,
        *,
        after: int = 0,
        limit: int = 1000,
        wait_s: float = 0,
        kinds: Sequence[str] = (),
    ) -> EventsPage:
        params: dict[str, Any] = {"after": after, "limit": limit, "wait": wait_s}
        if kinds:
            params["kinds"] = ",".join(kinds)
        return EventsPage.model_validate(
            await self._call("GET", f"/v1/sessions/{session}/events", params=params)
        )

    def event_stream(
        self, session: str, *, after: int = 0, kinds: Sequence[str] = ()
    ) -> AsyncIterator[list[JournalEntry]]:
        params: dict[str, Any] = {"after": after}
        if kinds:
            params["kinds"] = ",".join(kinds)
        return self._stream(f"/v1/sessions/{session}/events/stream", params)

    async def status(self, session: str) -> SessionStatus:
        return SessionStatus.model_validate(await self._call("GET", f"/v1/sessions/{session}"))

    # --- owners and shadows -----------------------------------------------------------

    async def owner_entries(
        self,
        session: str,
        *,
        epoch: int,
        after: int,
        released: int = 0,
        wait_s: float = 0,
        limit: int = 1000,
    ) -> tuple[list[JournalEntry], int]:
        """The journal after ``after`` and the release watermark for the owner at ``epoch``;
        409 ``Fenced`` once replaced."""
        answer = await self._call(
            "GET",
            f"/v1/sessions/{session}/owner/entries",
            params={
                "epoch": epoch,
                "after": after,
                "released": released,
                "wait": wait_s,
                "limit": limit,
            },
            timeout_s=wait_s + REQUEST_TIMEOUT_S,
        )
        return [entry_from_json(e) for e in answer["entries"]], int(answer["released"])

    async def append(
        self, session: str, *, epoch: int, entries: Sequence[NewEntry], after: int | None = None
    ) -> tuple[list[AppendedOut], list[JournalEntry], int | None]:
        """Append at ``epoch``; with ``after``, also get the journal since and the
        release watermark."""
        # The hot path of every turn: the body is built from the (already valid)
        # entries directly rather than through ``AppendRequest``.
        body = {
            "epoch": epoch,
            "entries": [{"id": e.id, "kind": e.kind, "payload": e.payload} for e in entries],
            "after": after,
        }
        answer = await self._call("POST", f"/v1/sessions/{session}/journal", plain=body)
        appended = [AppendedOut.model_construct(**a) for a in answer["appended"]]
        released = answer.get("released")
        return appended, [entry_from_json(e) for e in answer.get("entries", ())], released

    async def drained(self, session: str, report: DrainReport) -> None:
        await self._call("POST", f"/v1/sessions/{session}/drained", body=report)

    async def journal(
        self, session: str, *, after: int, limit: int = 5000, wait_s: float = 0
    ) -> tuple[list[JournalEntry], int]:
        answer = await self._call(
            "GET",
            f"/v1/sessions/{session}/journal",
            params={"after": after, "limit": limit, "wait": wait_s},
        )
        return [entry_from_json(e) for e in answer["entries"]], int(answer["head"])

    def journal_stream(self, session: str, *, after: int) -> AsyncIterator[list[JournalEntry]]:
        return self._stream(f"/v1/sessions/{session}/journal/stream", {"after": after})

    # --- snapshots --------------------------------------------------------------------

    async def put_snapshot(
        self,
        session: str,
        *,
        epoch: int,
        watermark: int,
        schema_version: int,
        document: dict[str, Any] | None = None,
        document_json: bytes | None = None,
    ) -> SnapshotInfoOut:
        """Store a snapshot as the owner at ``epoch``; ``document_json`` (the document
        already serialised) spares a second encoding of what may be megabytes."""
        if document_json is None:
            document_json = orjson.dumps(document or {})
        answer = await self._call(
            "PUT",
            f"/v1/sessions/{session}/snapshots/{int(watermark)}",
            data=document_json,
            params={"schema_version": int(schema_version), "epoch": int(epoch)},
        )
        return SnapshotInfoOut.model_validate(answer)

    async def latest_snapshot(self, session: str) -> SnapshotOut | None:
        try:
            answer = await self._call("GET", f"/v1/sessions/{session}/snapshots/latest")
        except GatewayError as exc:
            if exc.reason == "SnapshotNotFound":
                return None
            raise
        return SnapshotOut.model_validate(answer)

    async def snapshot(self, session: str, watermark: int) -> SnapshotOut:
        return SnapshotOut.model_validate(
            await self._call("GET", f"/v1/sessions/{session}/snapshots/{watermark}")
        )

    async def snapshot_document(
        self, session: str, watermark: int | None = None
    ) -> SnapshotDocument | None:
        """The snapshot at ``watermark`` (the latest when ``None``; then ``None`` when
        there is none) as its JSON text, for a loader that parses it once, itself."""
        which = "latest" if watermark is None else str(int(watermark))
        url = f"{self.base_url}/v1/sessions/{session}/snapshots/{which}/document"
        async with self.http.get(url, timeout=self._timeout) as response:
            raw = await response.read()
            if response.status >= 400:
                error = _error(response.status, raw)
                if watermark is None and error.reason == "SnapshotNotFound":
                    return None
                raise error
            return SnapshotDocument(
                watermark=int(response.headers[SNAPSHOT_WATERMARK_HEADER]),
                schema_version=int(response.headers[SNAPSHOT_SCHEMA_VERSION_HEADER]),
                document_json=raw,
            )

    async def snapshots(self, session: str) -> list[SnapshotInfoOut]:
        answer = await self._call("GET", f"/v1/sessions/{session}/snapshots")
        return [SnapshotInfoOut.model_validate(s) for s in answer]

    # --- control ----------------------------------------------------------------------

    async def create_session(self, request: CreateSession) -> SessionCreated:
        return SessionCreated.model_validate(await self._call("POST", "/v1/sessions", body=request))

    async def set_retention(self, session: str, keep_snapshots: int) -> RetentionApplied:
        """Set the session's retention policy (control token); applied at once."""
        return RetentionApplied.model_validate(
            await self._call(
                "PUT",
                f"/v1/sessions/{session}/retention",
                body=RetentionPolicy(keep_snapshots=keep_snapshots),
            )
        )

    async def mint_owner_credential(self, session: str, instance: str) -> str | None:
        """The owner credential of ``instance`` (control token); ``None`` for a session
        made without owner credentials."""
        try:
            answer = await self._call(
                "POST",
                f"/v1/sessions/{session}/owner-credentials",
                body=OwnerCredentialRequest(instance=instance),
            )
        except GatewayError as exc:
            if exc.reason == "NoOwnerCredentials":
                return None
            raise
        return OwnerCredential.model_validate(answer).credential

    async def delete_session(self, session: str) -> None:
        await self._call("DELETE", f"/v1/sessions/{session}")

    async def ownership(self, session: str) -> Ownership:
        return Ownership.model_validate(
            await self._call("GET", f"/v1/sessions/{session}/ownership")
        )

    async def set_ownership(self, session: str, change: OwnershipChange) -> Ownership:
        return Ownership.model_validate(
            await self._call("PUT", f"/v1/sessions/{session}/ownership", body=change)
        )

    async def fence(self, session: str, request: FenceRequest) -> FenceResult:
        # The gateway may legitimately take the whole fence timeout before answering.
        timeout_s = request.timeout_s + REQUEST_TIMEOUT_S
        return FenceResult.model_validate(
            await self._call(
                "POST", f"/v1/sessions/{session}/fence", body=request, timeout_s=timeout_s
            )
        )

    async def unfence(self, session: str, *, expect_epoch: int) -> Ownership:
        body = UnfenceRequest(expect_epoch=expect_epoch)
        return Ownership.model_validate(
            await self._call("POST", f"/v1/sessions/{session}/unfence", body=body)
        )

    async def request_snapshot(self, session: str) -> int:
        answer = await self._call("POST", f"/v1/sessions/{session}/snapshot-requests")
        return SnapshotRequested.model_validate(answer).seq

    # --- lifecycle --------------------------------------------------------------------

    async def suspend(self, session: str, request: SuspendRequest) -> SuspendResult:
        timeout_s = request.timeout_s + REQUEST_TIMEOUT_S
        return SuspendResult.model_validate(
            await self._call(
                "POST", f"/v1/sessions/{session}/suspend", body=request, timeout_s=timeout_s
            )
        )

    async def resume(self, session: str, *, expect_epoch: int) -> Ownership:
        body = ResumeRequest(expect_epoch=expect_epoch)
        return Ownership.model_validate(
            await self._call("POST", f"/v1/sessions/{session}/resume", body=body)
        )

    async def positions(self) -> SessionPositions:
        """Every session's head, acked turn and ownership, in one request."""
        return SessionPositions.model_validate(await self._call("GET", "/v1/positions"))

    async def wakes(self, *, after: int = 0, wait_s: float = 0) -> WakesPage:
        params = {"after": after, "wait": wait_s}
        answer = await self._call(
            "GET", "/v1/wakes", params=params, timeout_s=REQUEST_TIMEOUT_S + wait_s
        )
        return WakesPage.model_validate(answer)

    async def history(self, session: str, *, after: int = 0) -> SessionHistory:
        answer = await self._call("GET", f"/v1/sessions/{session}/history", params={"after": after})
        return SessionHistory.model_validate(answer)

    async def activity(self, session: str) -> SessionActivity:
        answer = await self._call("GET", f"/v1/sessions/{session}/activity")
        return SessionActivity.model_validate(answer)


def error_from_body(status: int, body: Any) -> GatewayError:
    try:
        return GatewayError(status, body["reason"], body["message"], body.get("errors"))
    except (KeyError, TypeError):
        return GatewayError(status, "HTTPError", str(body)[:500])


def _error(status: int, raw: bytes) -> GatewayError:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return GatewayError(status, "HTTPError", raw.decode(errors="replace")[:500])
    return error_from_body(status, body)
