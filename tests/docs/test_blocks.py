"""Every shell block of the README, the examples and the chart's README is run as
printed by something: `.ci/run` (hack/readme-blocks), the end-to-end suite on a real
cluster (e2e/readme.py), a docs test, or `make test` itself (a block that only runs
pytest on a path the suite collects). A new block nobody runs fails here."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted(
    [
        REPO / "README.md",
        REPO / "charts" / "shadowpod" / "README.md",
        *(REPO / "examples").glob("*/README.md"),
    ]
)
HEADING = re.compile(r"^(#{1,6}) (.+)$", re.MULTILINE)
BLOCK = re.compile(r"^```sh\n(.*?)^```$", re.MULTILINE | re.DOTALL)
# Blocks no run can take here, each with the reason. Keep this short.
NOT_RUN = {
    ("charts/shadowpod/README.md", "# Shadowpod Helm chart", 1): (
        "`kind load`: kind's node image cannot be pulled on these machines; the "
        "README's With Helm block installs the same chart on make cluster's cluster"
    ),
    ("charts/shadowpod/README.md", "## RBAC", 1): (
        "a second release of the chart; tests/chart renders these values with real Helm "
        "and checks the Roles per namespace"
    ),
}


def _blocks(document: Path) -> list[tuple[str, int, str]]:
    """(heading, index under it from 1, text) of each ```sh block."""
    text = document.read_text()
    fenced = [(m.start(), m.end()) for m in BLOCK.finditer(text)]
    heads = [
        (m.start(), m.group(0))
        for m in HEADING.finditer(text)
        if not any(a <= m.start() < b for a, b in fenced)
    ]
    found, counts = [], dict[str, int]()
    for match in BLOCK.finditer(text):
        heading = next((h for at, h in reversed(heads) if at < match.start()), "")
        counts[heading] = counts.get(heading, 0) + 1
        found.append((heading, counts[heading], match.group(1)))
    return found


def _ci_runs() -> set[tuple[str, str, int]]:
    runs = set()
    for line in (REPO / ".ci/run").read_text().splitlines():
        if line.startswith("hack/readme-blocks "):
            words = shlex.split(line, comments=True)
            path, heading, *which = words[1:]
            runs |= {(path, heading, int(n)) for n in which}
    return runs


def _e2e_sections() -> set[str]:
    source = (REPO / "e2e" / "readme.py").read_text()
    return set(re.findall(r'^[A-Z_]+ = "(#+ [^"]+)"', source, flags=re.MULTILINE))


def _docs_test_sections() -> set[tuple[str, str]]:
    sections = set()
    # The suspend/wake block is carried out line by line on the emulator, through the
    # API (no kubectl binary speaks to it), by the operator's lifecycle test.
    # So is the fleet upgrade block, by the operator's rollout test.
    for test in (
        "docs/test_refagent_readme.py",
        "kube/test_operator_lifecycle.py",
        "kube/test_operator_forks.py",
        "kube/test_operator_rollouts.py",
    ):
        source = (REPO / "tests" / test).read_text()
        [path] = re.findall(r'^README = "([^"]+)"', source, flags=re.MULTILINE)
        [heading] = re.findall(r'^SECTION = "([^"]+)"', source, flags=re.MULTILINE)
        sections.add((path, heading))
    return sections


def _pytest_only(text: str) -> bool:
    """Only `make venv` and `.venv/bin/pytest PATH` on paths `make test` collects."""
    testpaths = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"
    ]["testpaths"]
    joined = text.replace("\\\n", " ")
    commands = [shlex.split(line, comments=True) for line in joined.splitlines()]
    commands = [c for c in commands if c and c != ["make", "venv"]]
    return bool(commands) and all(
        c[0] == ".venv/bin/pytest"
        and len(c) == 2
        and any(Path(c[1]).is_relative_to(p) for p in testpaths)
        for c in commands
    )


def _run_lines() -> set[str]:
    """The lines of the README blocks the end-to-end suite runs."""
    readme = REPO / "README.md"
    return {
        line.strip()
        for heading, _, text in _blocks(readme)
        if heading in _e2e_sections()
        for line in text.splitlines()
        if line.strip()
    }


def test_every_shell_block_is_run_as_printed() -> None:
    ci, e2e, docs_tests = _ci_runs(), _e2e_sections(), _docs_test_sections()
    e2e_lines = _run_lines()
    unrun = []
    for document in DOCUMENTS:
        path = str(document.relative_to(REPO))
        for heading, n, text in _blocks(document):
            lines = {line.strip() for line in text.splitlines() if line.strip()}
            if (
                (path, heading, n) in ci
                or (path == "README.md" and heading in e2e)
                or (path, heading) in docs_tests
                or _pytest_only(text)
                or lines <= e2e_lines  # the README's own lines, run by the e2e suite
                or (path, heading, n) in NOT_RUN
            ):
                continue
            unrun.append(f"{path} {heading!r} block {n}")
    assert unrun == [], "shell blocks nothing runs as printed (see this test's docstring)"


def test_what_is_not_run_still_exists() -> None:
    blocks = {
        (str(d.relative_to(REPO)), heading, n) for d in DOCUMENTS for heading, n, _ in _blocks(d)
    }
    assert set(NOT_RUN) <= blocks, "NOT_RUN names a block that is gone: drop it"
    assert _ci_runs() <= blocks, ".ci/run runs a block that is not there"
