"""The documentation a user has: every file it points to is in the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", ROOT / "bench" / "README.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# A Markdown file named in code spans (`../shared/DESIGN.md`) is a pointer too.
NAMED = re.compile(r"`([^`\s]+\.md)`")


def _targets(doc: Path) -> list[str]:
    text = doc.read_text()
    found = LINK.findall(text) + NAMED.findall(text)
    return [t for t in found if not re.match(r"[a-z]+:", t)]  # not http:, mailto:


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_file_a_document_points_to_is_in_the_repository(doc: Path) -> None:
    missing = []
    for target in _targets(doc):
        path = (doc.parent / target).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            missing.append(target)
    assert missing == []


def test_the_readme_leads_to_the_design() -> None:
    assert "docs/design.md" in _targets(ROOT / "README.md")
