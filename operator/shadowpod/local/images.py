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

Placeholders in commands and env values: ``{python}`` (this interpreter),
``{examples}`` (the examples directory), ``{here}`` (the map file's directory).
"""

from __future__ import annotations

import os
import site
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shadowpod.engine.ports import ImageInfo, ImageNotFound


class LocalImage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    command: list[str] = Field(min_length=1)
    state_schema: int | None = Field(default=None, ge=1)
    reads_state_schemas: list[int] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

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
