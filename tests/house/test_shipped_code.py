"""The shipped package stands alone: no module of it imports the test suite, by an
import statement or by a module name given to importlib (which import-linter cannot
see). A wheel holds no tests/: such an import fails only for a user."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "shadowpod"


def _imports_of_tests(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value]  # importlib.import_module("tests.…") and the like
        found += [
            f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}: {name}"
            for name in names
            if name == "tests" or name.startswith("tests.")
        ]
    return found


def test_no_shipped_module_imports_the_tests() -> None:
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in _imports_of_tests(path)]
    assert found == []


def test_the_check_sees_an_import_by_name(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('import importlib\nimportlib.import_module("tests.kube.emulator")\n')
    assert len(_imports_of_tests(module, tmp_path)) == 1
