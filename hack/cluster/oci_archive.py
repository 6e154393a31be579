"""An OCI image archive (image layout in a tar) of one static binary, on stdout:
    python3 oci_archive.py NAME PATH-IN-IMAGE FILE
The image runs FILE as its entrypoint, as user 65532, with nothing else in it. This is
how the pause and CoreDNS images are made where no registry can be pulled from; the
same inputs give the same bytes (fixed times, owners and order)."""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile


def blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def layer(path_in_image: str, file: str) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        with open(file, "rb") as source:
            content = source.read()
        info = tarfile.TarInfo(path_in_image.lstrip("/"))
        info.size, info.mode, info.mtime = len(content), 0o755, 0
        tar.addfile(info, io.BytesIO(content))
    return out.getvalue()


def main(name: str, path_in_image: str, file: str) -> None:
    layer_digest, layer_data = blob(layer(path_in_image, file))
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": [path_in_image], "User": "65532:65532"},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }
    config_digest, config_data = blob(json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": len(config_data),
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest,
                "size": len(layer_data),
            }
        ],
    }
    manifest_digest, manifest_data = blob(json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": len(manifest_data),
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                },
            }
        ],
    }
    files = [
        ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
        ("index.json", json.dumps(index, sort_keys=True).encode()),
    ]
    for digest, data in (
        (layer_digest, layer_data),
        (config_digest, config_data),
        (manifest_digest, manifest_data),
    ):
        files.append(("blobs/sha256/" + digest.split(":", 1)[1], data))
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path, data in files:
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))


if __name__ == "__main__":
    main(*sys.argv[1:4])
