"""examples/02-kubernetes as a user runs it: its README's commands name what its
manifests and `make image` do — the Secret and key the session's credential reads, the
session, the images built — so that they can run as printed, in that order."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "02-kubernetes"


def _commands() -> list[list[str]]:
    text = (EXAMPLE / "README.md").read_text()
    blocks = re.findall(r"^```sh\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)
    assert blocks, "examples/02-kubernetes/README.md has no ```sh block"
    return [shlex.split(line, comments=True) for block in blocks for line in block.splitlines()]


def _images_make_image_builds() -> set[str]:
    script = (REPO / "hack" / "image-build").read_text()
    [name] = re.findall(r'refagent="\$\{REFAGENT_IMAGE:-([^}]+)\}"', script)
    return {f"{name}:{tag}" for tag in re.findall(r'build refagent-v\d "\$refagent:(v\d)"', script)}


def test_the_secret_it_creates_is_the_one_the_session_reads() -> None:
    session = yaml.safe_load((EXAMPLE / "agentsession.yaml").read_text())
    needed = {
        (c["secretRef"]["name"], c["secretRef"]["key"]) for c in session["spec"]["credentials"]
    }
    created = set()
    for command in _commands():
        if command[:4] == ["kubectl", "create", "secret", "generic"]:
            literals = [a.split("=", 2)[1] for a in command if a.startswith("--from-literal=")]
            created |= {(command[4], key) for key in literals}
    assert needed <= created


def test_it_applies_the_manifests_before_it_changes_them_and_names_built_images() -> None:
    built = _images_make_image_builds()
    assert built == {"shadowpod-refagent:v1", "shadowpod-refagent:v2"}
    session = yaml.safe_load((EXAMPLE / "agentsession.yaml").read_text())
    migration = yaml.safe_load((EXAMPLE / "agentmigration.yaml").read_text())
    assert session["spec"]["image"] in built and migration["spec"]["target"]["image"] in built
    commands = [c for c in _commands() if c]
    lines = [" ".join(c) for c in commands]
    secret = next(i for i, c in enumerate(lines) if "create secret" in c)
    applied = lines.index("kubectl apply -f examples/02-kubernetes/agentsession.yaml")
    patched = next(i for i, c in enumerate(lines) if c.startswith("kubectl patch ags"))
    assert secret < applied < patched
    patch_command = commands[patched]
    assert patch_command[3] == session["metadata"]["name"]
    patch = yaml.safe_load(patch_command[patch_command.index("-p") + 1])
    assert patch["spec"]["image"] in built - {session["spec"]["image"]}
    # The paths it applies are this directory's files, from the repository's root.
    for line in lines:
        for path in re.findall(r"-f (\S+\.yaml)", line):
            assert (REPO / path).is_file(), path
