"""How tests reach an API server: a kubeconfig file that both Kopf and
kubernetes_asyncio read, for the emulator or for a real cluster.

``SHADOWPOD_TEST_KUBECONFIG`` names a real cluster's kubeconfig; without it the
real-cluster variants of the tests skip, saying so.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import kopf
import yaml
from kubernetes_asyncio import client, config

REAL_CLUSTER_ENV = "SHADOWPOD_TEST_KUBECONFIG"


def real_cluster_kubeconfig() -> Path | None:
    configured = os.environ.get(REAL_CLUSTER_ENV)
    return Path(configured) if configured else None


def no_real_cluster_reason() -> str:
    return (
        f"no real cluster: set {REAL_CLUSTER_ENV} to a kubeconfig to run this test against "
        "a real API server and kubelets"
    )


@dataclass(frozen=True)
class KubeConnection:
    kubeconfig: Path
    real: bool = False  # a real cluster: real kubelets, real images, real timing

    @classmethod
    def to_emulator(cls, url: str, directory: Path) -> KubeConnection:
        path = directory / "kubeconfig"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "emulator", "cluster": {"server": url}}],
                    "users": [{"name": "tests", "user": {}}],
                    "contexts": [
                        {
                            "name": "emulator",
                            "context": {
                                "cluster": "emulator",
                                "user": "tests",
                                "namespace": "default",
                            },
                        }
                    ],
                    "current-context": "emulator",
                }
            )
        )
        return cls(path)

    async def configuration(self) -> client.Configuration:
        configuration = client.Configuration()
        await config.load_kube_config(
            config_file=str(self.kubeconfig),
            client_configuration=configuration,
            persist_config=False,
        )
        return configuration

    @contextlib.asynccontextmanager
    async def api(self) -> AsyncIterator[client.ApiClient]:
        """A kubernetes_asyncio client, as an operator makes one."""
        async with client.ApiClient(await self.configuration()) as api:
            yield api

    async def kopf_login(self) -> kopf.ConnectionInfo:
        """The same credentials for Kopf (its own kubeconfig reader only reads $KUBECONFIG)."""
        settings = await self.configuration()
        token = (settings.api_key or {}).get("authorization") or (settings.api_key or {}).get(
            "BearerToken"
        )
        scheme, _, token_value = (token or "").partition(" ")
        return kopf.ConnectionInfo(
            server=settings.host,
            ca_path=settings.ssl_ca_cert,
            insecure=not settings.verify_ssl,
            scheme=scheme or None if token_value else None,
            token=token_value or None,
            certificate_path=settings.cert_file,
            private_key_path=settings.key_file,
            default_namespace="default",
        )
