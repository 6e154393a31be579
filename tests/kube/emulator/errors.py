"""API errors as a real API server answers them: a ``Status`` with its HTTP code and
one of the API's own ``reason`` words (``NotFound``, ``Conflict``, ``Invalid`` …), which
the official clients and Kopf map onto their exception classes."""

from __future__ import annotations

from typing import Any

import attrs
import kmock


@attrs.frozen
class ApiError(kmock.KubernetesError):
    """An error answered as a ``Status``; ``details`` names what it is about."""

    status: int = 500
    reason: str | None = "InternalError"
    message: str | None = None
    details: Any | None = None


def details(kind: str, name: str | None, group: str = "") -> dict[str, Any]:
    found: dict[str, Any] = {"kind": kind, "group": group}
    if name:
        found["name"] = name
    return found


def not_found(plural: str, name: str, group: str = "") -> ApiError:
    what = f"{plural}.{group}" if group else plural
    return ApiError(404, "NotFound", f'{what} "{name}" not found', details(plural, name, group))


def unknown_resource(path: str) -> ApiError:
    return ApiError(
        404, "NotFound", f"the server could not find the requested resource ({path})", {}
    )


def already_exists(plural: str, name: str, group: str = "") -> ApiError:
    what = f"{plural}.{group}" if group else plural
    return ApiError(
        409, "AlreadyExists", f'{what} "{name}" already exists', details(plural, name, group)
    )


def conflict(plural: str, name: str, group: str = "", why: str = "") -> ApiError:
    what = f"{plural}.{group}" if group else plural
    why = why or (
        "the object has been modified; please apply your changes to the latest version "
        "and try again"
    )
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {what} "{name}": {why}',
        details(plural, name, group),
    )


def invalid(kind: str, name: str, causes: list[tuple[str, str]], group: str = "") -> ApiError:
    """422: ``causes`` are (field path, what is wrong with it)."""
    text = "; ".join(f"{field}: {message}" for field, message in causes)
    found = details(kind, name, group)
    found["causes"] = [
        {"reason": "FieldValueInvalid", "field": field, "message": f"{field}: {message}"}
        for field, message in causes
    ]
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {text}', found)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message, {})


def forbidden(message: str) -> ApiError:
    return ApiError(403, "Forbidden", message, {})


def method_not_allowed(method: str, path: str) -> ApiError:
    return ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path}", {})


def unsupported_media_type(content_type: str, supported: list[str]) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format ({content_type!r}); "
        f"accepted media types include: {', '.join(supported)}",
        {},
    )


def too_many_requests(message: str, causes: list[dict[str, str]]) -> ApiError:
    return ApiError(429, "TooManyRequests", message, {"causes": causes})


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message, {})
