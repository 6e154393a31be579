"""Deleting a checkpoint image from its registry (Docker Registry HTTP API v2).

A checkpoint image is every memory page of an agent: once its migration has ended it
is deleted, as the API says a manifest is: ``HEAD /v2/<name>/manifests/<tag>`` (with
every manifest type in ``Accept``) for its digest (``Docker-Content-Digest``), then
``DELETE /v2/<name>/manifests/<digest>``. The registry must allow deletes (Distribution:
``storage.delete.enabled: true``; it answers 405 otherwise) and frees the blobs at its
next garbage collection. Credentials, where the registry wants them, come from a
``dockerconfigjson`` file (the node agent's); a ``Basic`` or ``Bearer`` challenge
(token from the realm it names) is answered with them.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Final

import aiohttp

from shadowpod.domain.errors import ShadowpodError

MANIFEST_TYPES: Final = ", ".join(
    [
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    ]
)
_CHALLENGE_PARAM: Final = re.compile(r'(\w+)="([^"]*)"')
TIMEOUT: Final = aiohttp.ClientTimeout(total=30)


class RegistryError(ShadowpodError):
    reason = "CheckpointImageNotDeleted"


def split_image(image: str) -> tuple[str, str, str]:
    """``host[:port]/path/name:tag`` as (host, repository, tag)."""
    host, _, rest = image.partition("/")
    repository, colon, tag = rest.rpartition(":")
    if not host or not colon or not repository or "/" in tag:
        raise RegistryError(f"{image!r} is not host/repository:tag")
    return host, repository, tag


def _credentials(authfile: Path | None, host: str) -> str | None:
    """``user:password`` (base64) for ``host`` in a dockerconfigjson file."""
    if authfile is None:
        return None
    try:
        auths = json.loads(authfile.read_text()).get("auths") or {}
    except (OSError, ValueError) as exc:
        raise RegistryError(f"cannot read the registry credentials {authfile}: {exc}") from exc
    for key in (host, f"https://{host}", f"http://{host}"):
        entry = auths.get(key) or {}
        if entry.get("auth"):
            return str(entry["auth"])
        if entry.get("username"):
            pair = f"{entry['username']}:{entry.get('password', '')}"
            return base64.b64encode(pair.encode()).decode()
    return None


class CheckpointImages:
    def __init__(
        self, http: aiohttp.ClientSession, *, insecure: bool = False, authfile: Path | None = None
    ) -> None:
        self.http = http
        self.scheme = "http" if insecure else "https"
        self.authfile = authfile

    async def delete(self, image: str) -> bool:
        """Delete ``image``'s manifest; ``False`` when the registry has no such image."""
        host, repository, tag = split_image(image)
        base = f"{self.scheme}://{host}/v2/{repository}/manifests"
        status, digest, said = await self._request(
            "HEAD", f"{base}/{tag}", host, {"Accept": MANIFEST_TYPES}
        )
        if status == 404:
            return False
        if status != 200 or not digest:
            raise RegistryError(f"HEAD {base}/{tag} answered {status} {said}".strip())
        status, _, said = await self._request("DELETE", f"{base}/{digest}", host, {})
        if status in (200, 202):
            return True
        if status == 404:
            return False
        if status == 405:
            raise RegistryError(
                f"the registry {host} does not allow deletes (405 {said}): enable them"
                " (Distribution: storage.delete.enabled: true) or let its retention remove"
                f" {image}".strip()
            )
        raise RegistryError(f"DELETE {base}/{digest} answered {status} {said}".strip())

    async def _request(
        self, method: str, url: str, host: str, headers: dict[str, str]
    ) -> tuple[int, str | None, str]:
        """The status, ``Docker-Content-Digest`` and error text; a 401 is answered once
        with the credentials for ``host``."""
        try:
            status, digest, said, challenge = await self._once(method, url, headers)
            if status == 401 and challenge:
                authorization = await self._authorization(challenge, host)
                if authorization is not None:
                    headers = {**headers, "Authorization": authorization}
                    status, digest, said, _ = await self._once(method, url, headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise RegistryError(f"{method} {url}: {str(exc) or type(exc).__name__}") from exc
        return status, digest, said

    async def _once(
        self, method: str, url: str, headers: dict[str, str]
    ) -> tuple[int, str | None, str, str]:
        async with self.http.request(method, url, headers=headers, timeout=TIMEOUT) as response:
            said = "" if method == "HEAD" else " ".join((await response.text()).split())[:512]
            return (
                response.status,
                response.headers.get("Docker-Content-Digest"),
                said,
                response.headers.get("WWW-Authenticate", ""),
            )

    async def _authorization(self, challenge: str, host: str) -> str | None:
        basic = _credentials(self.authfile, host)
        scheme, _, params = challenge.partition(" ")
        if scheme.lower() == "basic":
            return None if basic is None else f"Basic {basic}"
        if scheme.lower() != "bearer":
            return None
        found = dict(_CHALLENGE_PARAM.findall(params))
        realm = found.pop("realm", None)
        if realm is None:
            return None
        headers = {} if basic is None else {"Authorization": f"Basic {basic}"}
        async with self.http.get(realm, params=found, headers=headers, timeout=TIMEOUT) as answer:
            if answer.status != 200:
                return None
            token = await answer.json(content_type=None)
        value = token.get("token") or token.get("access_token")
        return None if not value else f"Bearer {value}"
