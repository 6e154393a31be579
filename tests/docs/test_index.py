"""The documentation as a reader finds it: every page in the index, every link's
section where the link says, and open work said in one place: a page may call a part
planned or not built only in a paragraph that points to known-limits.md (so a part
that got built and still reads "planned" somewhere is found)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(
    [
        ROOT / "README.md",
        ROOT / "bench" / "README.md",
        ROOT / "charts" / "shadowpod" / "README.md",
        *DOCS.glob("*.md"),
        *(ROOT / "examples").glob("*/README.md"),
    ]
)
IDS = [str(p.relative_to(ROOT)) for p in PAGES]
LINK = re.compile(r"\]\(([^)\s#]*)#([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
# What a page says of a part that is not there yet. Open work has one place,
# known-limits.md: a paragraph saying it must point there.
NOT_BUILT = re.compile(
    r"\bnot built\b|\bplanned\b|\bto come\b|\bbeing built\b|\bnot (?:reconciled|wired) yet\b",
    re.IGNORECASE,
)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, links and code marks dropped,
    punctuation other than '-' and '_' removed, spaces turned into '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _prose(page: Path) -> list[str]:
    """The page's lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def _anchors(page: Path) -> set[str]:
    seen: Counter[str] = Counter()
    anchors = set()
    for line in _prose(page):
        if match := HEADING.match(line):
            slug = _slug(match.group(2))
            anchors.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
            seen[slug] += 1
    return anchors


def test_every_page_under_docs_is_in_its_index() -> None:
    index = (DOCS / "README.md").read_text()
    linked = {Path(target).name for target in re.findall(r"\]\(([^)#\s]+)", index)}
    missing = sorted(p.name for p in DOCS.glob("*.md") if p.name not in linked | {"README.md"})
    assert missing == [], f"docs/README.md does not lead to {missing}"


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_link_to_a_section_finds_it(page: Path) -> None:
    broken = []
    for target, anchor in LINK.findall(page.read_text()):
        linked = (page.parent / target).resolve() if target else page
        if linked.suffix != ".md" or not linked.is_file():
            continue  # a directory or a file: test_links checks it exists
        if anchor not in _anchors(linked):
            broken.append(f"{target or page.name}#{anchor}")
    assert broken == [], f"{page.relative_to(ROOT)} links to sections that are not there"


def _paragraphs(page: Path) -> list[str]:
    """The page's prose, paragraph by paragraph (runs of non-blank lines)."""
    text = "\n".join(_prose(page))
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


@pytest.mark.parametrize(
    "page", [p for p in PAGES if p.name != "known-limits.md"], ids=lambda p: p.name
)
def test_a_page_calls_a_part_not_built_only_pointing_to_the_known_limits(page: Path) -> None:
    said = [
        paragraph.strip().splitlines()[0]
        for paragraph in _paragraphs(page)
        if NOT_BUILT.search(paragraph) and "known-limits.md" not in paragraph
    ]
    assert said == [], (
        f"{page.relative_to(ROOT)} calls something not built without pointing to "
        "docs/known-limits.md: say what is built, or point there"
    )


def test_the_slug_is_githubs() -> None:
    assert _slug("Latest: run 6, a new owner's first turn paid ahead (26 Nov, later)") == (
        "latest-run-6-a-new-owners-first-turn-paid-ahead-26-nov-later"
    )
    assert _slug("Which path: `strategy: Auto | State | CRIU`") == (
        "which-path-strategy-auto--state--criu"
    )
