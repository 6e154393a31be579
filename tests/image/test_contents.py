"""What is in the images: who they run as, their labels and entrypoints, their size,
compiled bytecode, and no secret or CA bundle of the build machine in any layer."""

from __future__ import annotations

import asyncio
import json
import os
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import certifi
import pytest

from shadowpod import __version__
from tests.image.docker import Containers, Images, docker, inspect_image

pytestmark = pytest.mark.timeout(1500)  # the first test of a run builds the image

# 448 MB (427 MiB) on the Debian bookworm base made here (123 MB of it the base), of
# which ~205 MB the semantic judge (numpy, tokenizers, safetensors, the model's 91 MB of
# weights, their bytecode; measured on a build of the `shadowpod` target): a bound with
# room, which a build toolchain, the dev dependencies, PyTorch or a stray .venv would break.
MAX_IMAGE_BYTES: Final = 500 * 1024 * 1024
PEM_CERTIFICATE: Final = re.compile(rb"-----BEGIN CERTIFICATE-----\s+([A-Za-z0-9+/=\s]+?)-----END")
PEM_PRIVATE_KEY: Final = re.compile(
    rb"-----BEGIN [A-Z ]*PRIVATE KEY-----\s+[A-Za-z0-9+/=\s]{40,}-----END"
)
HOST_CA_BUNDLE: Final = Path(os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt"))
PUBLIC_CA_STORES: Final = (Path("/usr/share/ca-certificates"), Path(certifi.where()))


async def test_images_run_as_a_numeric_non_root_user(images: Images) -> None:
    for ref in images.all():
        assert (await inspect_image(ref))["Config"]["User"] == "65532:65532", ref


async def test_labels_name_the_source_and_version(images: Images) -> None:
    for ref in images.all():
        labels = (await inspect_image(ref))["Config"]["Labels"]
        assert labels["org.opencontainers.image.version"] == __version__
        assert labels["org.opencontainers.image.source"]
        assert re.fullmatch(r"[0-9a-f]{12}(-dirty)?", labels["org.opencontainers.image.revision"])
        schemas = json.loads(labels["dev.shadowpod.refagent.state-schemas"])
        assert set(schemas) == {"1", "2"}
    # What each version writes and reads is checked against the running agents in
    # test_refagent.py.


async def test_refagent_images_are_the_same_build_as_the_main_image(images: Images) -> None:
    main = await inspect_image(images.shadowpod)
    assert main["Config"]["Entrypoint"] == ["shadowpod"]
    for version, ref in images.refagent.items():
        image = await inspect_image(ref)
        assert image["RootFS"]["Layers"] == main["RootFS"]["Layers"], ref
        assert image["Config"]["Entrypoint"] == ["refagent"]
        assert f"REFAGENT_VERSION={version}" in image["Config"]["Env"]


async def test_the_image_carries_the_semantic_judge(images: Images, containers: Containers) -> None:
    """The operator's default gate judge works in the image as it runs (read-only,
    non-root, offline): a paraphrase is nearer than an unrelated answer."""
    code, output = await containers.run_to_end(
        images.shadowpod,
        [
            "-c",
            "from shadowpod.gates.semantic import MiniLMEmbedder, cosine\n"
            "a, b, c = MiniLMEmbedder().embed(['It is sunny in Paris today.', "
            "'Today the weather in Paris is sunny.', 'Your card was charged twice.'])\n"
            "print(cosine(a, b) > 0.8 > cosine(a, c))",
        ],
        entrypoint="python",
    )
    assert (code, output.strip()) == (0, "True")


DEV_TOOLS: Final = ("pip", "setuptools", "pytest", "mypy", "hypothesis", "ruff", "kmock")


async def test_the_image_is_small_and_holds_no_build_or_test_tools(
    images: Images, containers: Containers
) -> None:
    size = (await inspect_image(images.shadowpod))["Size"]
    assert size <= MAX_IMAGE_BYTES, f"{size / 2**20:.0f} MB"
    code, output = await containers.run_to_end(
        images.shadowpod,
        [
            "-c",
            "import importlib.util as u; print([m for m in "
            + repr(DEV_TOOLS)
            + " if u.find_spec(m)])",
        ],
        entrypoint="python",
    )
    assert (code, output.strip()) == (0, "[]")


# Run inside the image: every module of the virtualenv and the reference agent has
# bytecode that Python will use as it is — hash-based and unchecked, so neither a
# read-only filesystem nor timestamps changed by a copy between stages make Python
# compile it again at every start.
CHECK_BYTECODE: Final = """
import importlib.util, pathlib, sys
root = pathlib.Path("/opt/shadowpod")
sources = [*root.glob("lib/python3*/site-packages/**/*.py"), *root.glob("examples/**/*.py")]
bad = []
for source in sources:
    cached = pathlib.Path(importlib.util.cache_from_source(str(source)))
    if not cached.exists():
        bad.append(f"no bytecode: {source}")
        continue
    data = cached.read_bytes()
    if int.from_bytes(data[4:8], "little") != 0b01:
        bad.append(f"not unchecked-hash bytecode: {cached}")
    elif data[8:16] != importlib.util.source_hash(source.read_bytes()):
        bad.append(f"stale bytecode: {cached}")
print(len(sources), sys.flags.dont_write_bytecode)
print("\\n".join(bad[:20]))
"""


async def test_bytecode_is_compiled_at_build_time(images: Images, containers: Containers) -> None:
    code, output = await containers.run_to_end(
        images.shadowpod, ["-c", CHECK_BYTECODE], entrypoint="python"
    )
    assert code == 0, output
    counted, *bad = output.strip().splitlines()
    sources, dont_write = counted.split()
    assert int(sources) > 1000  # the whole virtualenv, not an empty glob
    assert dont_write == "1"  # PYTHONDONTWRITEBYTECODE: nothing tries the read-only root
    assert bad == []


@dataclass
class LayerFindings:
    layers: int = 0
    files: int = 0
    host_ca_certificates: list[str] = field(default_factory=list)
    private_keys: list[str] = field(default_factory=list)
    build_leftovers: list[str] = field(default_factory=list)


def certificates(data: bytes) -> set[bytes]:
    return {re.sub(rb"\s", b"", body) for body in PEM_CERTIFICATE.findall(data)}


def host_only_certificates() -> set[bytes]:
    """The CAs this machine added to its bundle (an intercepting proxy's, say): in its
    bundle, and in no public store (Debian's, certifi's)."""
    public: set[bytes] = set()
    for store in PUBLIC_CA_STORES:
        for path in [store] if store.is_file() else store.rglob("*.crt"):
            public |= certificates(path.read_bytes())
    return certificates(HOST_CA_BUNDLE.read_bytes()) - public


# What the build uses and must leave behind: the secret's mount, pip's cache, the
# sources it installed from, a checkout's .git or .venv, pip or netrc credentials.
LEFTOVER: Final = re.compile(
    r"^(run/secrets/.+|root/\.cache/.+|src/.*|etc/pip\.conf|root/\.netrc|root/\.config/pip/.*)$"
    r"|(^|/)(\.git|\.venv)/"
)


def scan_layers(archive: Path, host_only: set[bytes]) -> LayerFindings:
    """Every file of every layer of a ``docker save`` archive, looked through."""
    findings = LayerFindings()
    with tarfile.open(archive) as saved:
        manifest = json.load(saved.extractfile("manifest.json"))  # type: ignore[arg-type]
        names = sorted({layer for image in manifest for layer in image["Layers"]})
        for name in names:
            findings.layers += 1
            layer_file = saved.extractfile(name)
            assert layer_file is not None
            with tarfile.open(fileobj=layer_file, mode="r:*") as layer:
                for member in layer:
                    where = f"{name.split('/')[0][:12]}:{member.name}"
                    if LEFTOVER.search(member.name.removeprefix("./")):
                        findings.build_leftovers.append(where)
                    if not member.isfile():
                        continue
                    findings.files += 1
                    content = layer.extractfile(member)
                    assert content is not None
                    data = content.read()
                    if b"-----BEGIN" not in data:
                        continue
                    if certificates(data) & host_only:
                        findings.host_ca_certificates.append(where)
                    # Compiled libraries carry their self-tests' keys (GnuTLS does); a
                    # key that was put into the image is a file of its own.
                    if not data.startswith(b"\x7fELF") and PEM_PRIVATE_KEY.search(data):
                        findings.private_keys.append(where)
    return findings


@pytest.mark.skipif(not HOST_CA_BUNDLE.is_file(), reason=f"no CA bundle at {HOST_CA_BUNDLE}")
async def test_no_layer_holds_a_secret_or_the_build_machines_ca_bundle(
    images: Images, tmp_path: Path
) -> None:
    archive = tmp_path / "images.tar"
    await docker("save", "--output", str(archive), *images.all(), timeout_s=300)
    # A copy of this machine's bundle, or of a CA it added, is found by those CAs; where
    # it added none, its bundle is Debian's public one (which the base has anyway).
    host_only = host_only_certificates()
    findings = await asyncio.to_thread(scan_layers, archive, host_only)
    assert findings.layers >= 3 and findings.files > 5000  # every layer was read
    assert findings.host_ca_certificates == []
    assert findings.private_keys == []
    assert findings.build_leftovers == []
    for ref in images.all():
        env = " ".join((await inspect_image(ref))["Config"]["Env"])
        assert "PIP_CERT" not in env and "ca-bundle" not in env and "SSL_CERT" not in env
