"""Errors of the domain: each says what is wrong and what to do about it."""

from __future__ import annotations


class ShadowpodError(Exception):
    """Base of every error Shadowpod raises on purpose.

    ``reason`` is one CamelCase word, as in Kubernetes conditions and HTTP error
    bodies, so callers can branch on it without parsing the message.
    """

    reason = "Error"


class StateDocumentInvalid(ShadowpodError, ValueError):
    reason = "StateInvalid"


class SchemaTooNew(ShadowpodError):
    reason = "SchemaTooNew"

    def __init__(self, *, found: int, supported: int, what: str = "session state") -> None:
        self.found = found
        self.supported = supported
        super().__init__(
            f"{what} has schema v{found}, but this Shadowpod understands up to "
            f"v{supported}; upgrade Shadowpod (or the agent image) to a version that "
            f"reads v{found}"
        )
