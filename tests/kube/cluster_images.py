"""The operator tests' images on `make cluster`'s nodes, under the names the kubelet
stand-in knows them by (``refagent:v1``, ``refagent:v2-reworded``, ``sleeper:local`` …),
so that one test reads the same on the emulator and on the real cluster.

They are made in each node's containerd from the project's images `make image` built
and `make cluster` imported (``shadowpod-refagent:v1``/``:v2``): plain tags where the
stand-in's image is the same program, and images whose config alone differs where it
runs something else (v2's variants take ``--variant``; ``python:local`` is a bare
interpreter that exits; ``sleeper:local`` never becomes ready). No layer is built and
nothing is pulled: the new images share the project image's layers.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SOURCE_V1 = "docker.io/library/shadowpod-refagent:v1"
SOURCE_V2 = "docker.io/library/shadowpod-refagent:v2"
PYTHON = "/opt/shadowpod/bin/python"

# Same program under another name: a tag.
TAGS = {
    "refagent:v1": SOURCE_V1,
    "refagent:v2": SOURCE_V2,
    "refagent:v2-b": SOURCE_V2,
}
# Another program in v2's layers: (entrypoint or None to keep it, cmd).
DERIVED: dict[str, tuple[list[str] | None, list[str] | None]] = {
    **{
        f"refagent:v2-{variant}": (None, ["--variant", variant])
        for variant in ("reworded", "forgetful", "renamed")
    },
    "python:local": ([PYTHON], None),
    "sleeper:local": ([PYTHON, "-c", "import time; time.sleep(3600)"], None),
}


def full_name(image: str) -> str:
    return f"docker.io/library/{image}"


def cluster_bin() -> Path:
    found = subprocess.run(
        ["bash", "-c", f". {REPO}/hack/cluster/lib.sh && echo $BIN"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(found.stdout.strip())


def node_sockets(kubeconfig: Path) -> list[Path]:
    """The nodes' containerd sockets beside `make cluster`'s kubeconfig (its state)."""
    return sorted(kubeconfig.parent.glob("node-*/containerd.sock"))


class NodeImages:
    def __init__(self, ctr: Path, socket: Path) -> None:
        self.ctr = ctr
        self.socket = socket

    def run(self, *args: str, input: bytes | None = None, stdout: Any = None) -> bytes:
        result = subprocess.run(
            [str(self.ctr), "--address", str(self.socket), "-n", "k8s.io", *args],
            input=input,
            stdout=stdout if stdout is not None else subprocess.PIPE,
            stderr=subprocess.PIPE,
            check=False,
            timeout=600,
        )
        if result.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} on {self.socket}: {result.stderr.decode()}")
        return result.stdout or b""

    def names(self) -> set[str]:
        return set(self.run("images", "ls", "-q").decode().split())


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def derived_archive(exported: Path, out: Path) -> None:
    """An OCI archive holding ``exported``'s blobs and one image per DERIVED entry: its
    manifest with a new config (entrypoint/cmd changed), named for containerd."""
    with tarfile.open(exported) as source:
        index = json.load(source.extractfile("index.json"))  # type: ignore[arg-type]

        def read(digest: str) -> bytes:
            member = source.extractfile("blobs/sha256/" + digest.removeprefix("sha256:"))
            assert member is not None, digest
            return member.read()

        descriptor = index["manifests"][0]
        manifest = json.loads(read(descriptor["digest"]))
        while "manifests" in manifest:  # an image index: its linux/amd64 manifest
            descriptor = next(
                m
                for m in manifest["manifests"]
                if (m.get("platform") or {}).get("architecture", "amd64") == "amd64"
            )
            manifest = json.loads(read(descriptor["digest"]))
        config = json.loads(read(manifest["config"]["digest"]))
        added: dict[str, bytes] = {}
        entries = []
        for image, (entrypoint, cmd) in DERIVED.items():
            changed = json.loads(json.dumps(config))
            if entrypoint is not None:
                changed["config"]["Entrypoint"] = entrypoint
            changed["config"]["Cmd"] = cmd
            config_digest, config_bytes = _blob(json.dumps(changed).encode())
            new_manifest = {
                **manifest,
                "config": {
                    **manifest["config"],
                    "digest": config_digest,
                    "size": len(config_bytes),
                },
            }
            manifest_digest, manifest_bytes = _blob(json.dumps(new_manifest).encode())
            added[config_digest] = config_bytes
            added[manifest_digest] = manifest_bytes
            entries.append(
                {
                    "mediaType": descriptor["mediaType"],
                    "digest": manifest_digest,
                    "size": len(manifest_bytes),
                    "annotations": {
                        "io.containerd.image.name": full_name(image),
                        "org.opencontainers.image.ref.name": image.split(":", 1)[1],
                    },
                }
            )
        with tarfile.open(out, "w") as sink:
            for member in source.getmembers():
                if member.name in ("index.json", "manifest.json"):
                    continue
                sink.addfile(member, source.extractfile(member) if member.isfile() else None)
            for digest, data in added.items():
                info = tarfile.TarInfo("blobs/sha256/" + digest.removeprefix("sha256:"))
                info.size = len(data)
                sink.addfile(info, io.BytesIO(data))
            data = json.dumps({"schemaVersion": 2, "manifests": entries}).encode()
            info = tarfile.TarInfo("index.json")
            info.size = len(data)
            sink.addfile(info, io.BytesIO(data))


def ensure_test_images(kubeconfig: Path) -> None:
    """Every image the operator tests name, on every node of `make cluster`'s cluster
    (a no-op where they are there already)."""
    sockets = node_sockets(kubeconfig)
    if not sockets:
        raise RuntimeError(
            f"no node containerd beside {kubeconfig}: the operator tests on a real cluster "
            "need `make cluster`'s (its nodes get the tests' images)"
        )
    ctr = cluster_bin() / "ctr"
    wanted = {full_name(i) for i in [*TAGS, *DERIVED]}
    archive: Path | None = None
    with tempfile.TemporaryDirectory() as scratch:
        for socket in sockets:
            node = NodeImages(ctr, socket)
            have = node.names()
            missing = {SOURCE_V1, SOURCE_V2} - have
            if missing:
                raise RuntimeError(
                    f"{socket.parent.name} has no {', '.join(sorted(missing))}: "
                    "`make image` then `make cluster` imports them"
                )
            if wanted <= have:
                continue
            for image, source in TAGS.items():
                if full_name(image) not in have:
                    node.run("images", "tag", source, full_name(image))
            if not {full_name(i) for i in DERIVED} <= have:
                if archive is None:
                    exported = Path(scratch) / "v2.tar"
                    node.run("images", "export", str(exported), SOURCE_V2)
                    archive = Path(scratch) / "derived.tar"
                    derived_archive(exported, archive)
                node.run("images", "import", str(archive))
