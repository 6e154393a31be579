"""The README's "On Kubernetes" and "With Helm" shell blocks, run as they are written.

Each block is run by bash as one script (``set -euo pipefail``, from the repository's
root, so its ``export`` lines hold for the lines after them), with one definition put
before it: ``helm``, which is real Helm's library (``python -m e2e.helm``) since these
machines have no ``helm`` binary. Nothing else is added or rewritten: a README line that
does not work fails the suite.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
ON_KUBERNETES = "## On Kubernetes"
WITH_HELM = "### With Helm"


def section(heading: str, text: str | None = None) -> str:
    """The text under ``heading`` up to the next heading of any level."""
    text = README.read_text() if text is None else text
    assert f"\n{heading}\n" in text, f"README.md has no {heading!r} section"
    body = text.split(f"\n{heading}\n", 1)[1]
    return re.split(r"^#{1,6} ", body, maxsplit=1, flags=re.MULTILINE)[0]


def shell_blocks(heading: str, text: str | None = None) -> list[str]:
    blocks = re.findall(
        r"^```sh\n(.*?)^```$", section(heading, text), flags=re.MULTILINE | re.DOTALL
    )
    assert blocks, f"README.md's {heading!r} section has no ```sh block"
    return [str(block) for block in blocks]


def prelude() -> str:
    return f'set -euo pipefail\nhelm() {{ "{sys.executable}" -m e2e.helm "$@"; }}\nset -x\n'


def run_block(
    block: str, env: dict[str, str] | None = None, timeout: float = 3600
) -> subprocess.CompletedProcess[str]:
    """Runs one README block; the result's stdout holds its trace and output."""
    return subprocess.run(
        ["bash", "-c", prelude() + block],
        cwd=REPO,
        env={**os.environ, **(env or {}), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
