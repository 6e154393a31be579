"""Image maps: how the local runtime turns an image reference into a command.

A map is a YAML file::

    images:
      refagent:v1:
        command: ["{python}", "{examples}/01-reference-agent/refagent.py", "--version", "1"]
        state_schema: 1            # optional: the agent state schema the image writes
        reads_state_schemas: [1]   # optional: the versions it can read (migrate from)
        env: {REFAGENT_HEARTBEAT_S: "2"}

Schema versions are the agent's code's to say (``Agent(state_schema=...)`` and its
``@agent.migration``s): when the map leaves ``state_schema`` out, the local runtime
runs the command once with ``SHADOWPOD_DESCRIBE=1`` and reads what the code declares.
A map that gives them overrides the code (a test's deliberately wrong claim).

What the code said is kept on disk by the image's digest (``LocalImage.digest``: its
command, env and the bytes of the files its command names, with the Python files
beside them), in ``DescribedImages`` — so the next runtime (another ``shadowpod``
command, a restarted engine) does not start that image again to ask: starting a
LangGraph agent to ask took 8-17 s of a move's Preflight. Change the agent's code
and its digest changes: it is asked again.

Placeholders in commands and env values: ``{python}`` (this interpreter),
``{examples}`` (the examples directory), ``{here}`` (the map file's directory).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import site
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shadowpod.engine.ports import ImageInfo, ImageNotFound


class LocalImage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    command: list[str] = Field(min_length=1)
    state_schema: int | None = Field(default=None, ge=1)
    reads_state_schemas: list[int] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    def digest(self) -> str:
        """What the image is, as a content hash: its command and env, and the bytes of
        every file its command names with the Python files beside each (where an
        agent's declaration lives); another interpreter is another command."""
        hashed = hashlib.sha256()
        hashed.update(json.dumps([self.command, self.env], sort_keys=True).encode())
        for part in self.command:
            path = Path(part)
            if not path.is_file():
                continue
            beside = sorted(p for p in path.parent.glob("*.py") if p.is_file() and p != path)
            for file in [path, *beside]:
                hashed.update(str(file).encode())
                with contextlib.suppress(OSError):
                    hashed.update(hashlib.sha256(file.read_bytes()).digest())
        return hashed.hexdigest()

    def info(self, image: str) -> ImageInfo | None:
        """What the map declares of ``image``; ``None`` when its code must say."""
        if self.state_schema is None:
            return None
        reads = self.reads_state_schemas or [self.state_schema]
        return ImageInfo(
            image=image, state_schema=self.state_schema, reads_state_schemas=sorted(reads)
        )


class ImageMap(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    images: dict[str, LocalImage]

    def resolve(self, image: str) -> LocalImage:
        found = self.images.get(image)
        if found is None:
            known = ", ".join(sorted(self.images)) or "none"
            raise ImageNotFound(f"image {image!r} is not in the local image map (known: {known})")
        return found

    @classmethod
    def load(cls, path: Path) -> ImageMap:
        try:
            raw = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"cannot read image map {path}: {exc}") from exc
        try:
            return cls.from_data(raw, here=path.parent)
        except ValidationError as exc:
            raise ValueError(f"image map {path} is invalid: {exc}") from exc

    @classmethod
    def from_data(cls, raw: Mapping[str, Any], *, here: Path | None = None) -> ImageMap:
        names = {
            "python": sys.executable,
            "examples": str(examples_dir()),
            "here": str(here or Path.cwd()),
        }

        def fill(value: str) -> str:
            return value.format(**names)

        images = {}
        for image, spec in dict(raw.get("images", {})).items():
            spec = dict(spec)
            spec["command"] = [fill(part) for part in spec.get("command", [])]
            spec["env"] = {
                key: fill(str(value)) for key, value in dict(spec.get("env", {})).items()
            }
            images[image] = spec
        return cls.model_validate({"images": images})


DESCRIBED_DIR_ENV: Final = "SHADOWPOD_DESCRIBED_IMAGES"


def default_described_dir() -> Path:
    """Where what images' code said is kept: ``$SHADOWPOD_DESCRIBED_IMAGES``, else
    ``$XDG_CACHE_HOME/shadowpod/described-images`` (``~/.cache`` by default)."""
    configured = os.environ.get(DESCRIBED_DIR_ENV)
    if configured:
        return Path(configured)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "shadowpod" / "described-images"


class DescribedImages:
    """What images' code said of their schema versions, one file per image digest. A
    file that cannot be read is as if missing (the image is asked again)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def get(self, image: str, digest: str) -> ImageInfo | None:
        try:
            said = json.loads((self.directory / f"{digest}.json").read_text())
            return ImageInfo(
                image=image,
                state_schema=said["state_schema"],
                reads_state_schemas=said["reads_state_schemas"],
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, digest: str, info: ImageInfo) -> None:
        """Kept atomically (a reader sees the whole file or none); a directory that
        cannot be written only means the next runtime asks again."""
        said = {
            "image": info.image,
            "state_schema": info.state_schema,
            "reads_state_schemas": info.reads_state_schemas,
        }
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "w") as out:
                json.dump(said, out)
            os.replace(tmp, self.directory / f"{digest}.json")
        except OSError:
            return


def examples_dir() -> Path:
    """Where the agents the commands run are: ``$SHADOWPOD_EXAMPLES``; else the
    ``examples/`` folder of the source tree this package runs from (a clone); else
    ``share/shadowpod/examples`` where the wheel installed them (pyproject.toml's
    data files: under the environment's prefix, or the user's base for ``--user``)."""
    configured = os.environ.get("SHADOWPOD_EXAMPLES")
    if configured:
        return Path(configured)
    source_tree = Path(__file__).resolve().parents[3] / "examples"
    if source_tree.is_dir():
        return source_tree
    for base in (sys.prefix, site.getuserbase()):
        installed = Path(base) / "share" / "shadowpod" / "examples"
        if installed.is_dir():
            return installed
    return source_tree


def reference_images(heartbeat_s: float = 0.0) -> ImageMap:
    """The reference agent's two versions (used by the demo, the benchmarks and tests).

    ``refagent:v2-b`` is v2 under another tag: a move that is not an upgrade.
    ``refagent:v2-reworded`` and ``refagent:v2-forgetful`` are v2 saying the same in
    other words, and v2 regressed (it forgets the user's name); ``refagent:v2-renamed``
    calls itself by another name (the persona check's): upgrade gates' tests.
    """
    env = {"REFAGENT_HEARTBEAT_S": str(heartbeat_s)}
    script = "{examples}/01-reference-agent/refagent.py"
    v2 = {
        "command": ["{python}", script, "--version", "2"],
        "state_schema": 2,
        "reads_state_schemas": [1, 2],
        "env": env,
    }
    return ImageMap.from_data(
        {
            "images": {
                "refagent:v1": {
                    "command": ["{python}", script, "--version", "1"],
                    "state_schema": 1,
                    "env": env,
                },
                "refagent:v2": v2,
                "refagent:v2-b": v2,
                **{
                    f"refagent:v2-{variant}": {
                        **v2,
                        "command": ["{python}", script, "--version", "2", "--variant", variant],
                    }
                    for variant in ("reworded", "forgetful", "renamed")
                },
            }
        }
    )
