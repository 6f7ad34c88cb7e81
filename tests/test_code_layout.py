"""Size and layering rules of the source tree (issue 32), checked on the source:

- no module of the package over MAX_MODULE_LINES lines and no function (method, nested
  function) over MAX_FUNCTION_LINES lines, from its `def` to its last line: a longer one
  is split into named steps or modules;
- bench/ imports nothing from tests/: what both need lives where both may import it
  (bench/models/, pin_orchestration/devstack/).

The allow-lists name the offenders that other work splits; an entry that no longer
offends fails too, so the lists only shrink.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.source_trees import parse_source

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pin_orchestration"
BENCH = ROOT / "bench"

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80

# Exceptions, each with its reason (none today). Paths relative to the repository root.
LONG_MODULES_ALLOWED: set[str] = set()
LONG_FUNCTIONS_ALLOWED: set[str] = set()


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _package_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts)


def _functions(
    node: ast.AST, prefix: str = ""
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function under `node` with its dotted name (Class.method, outer.inner)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            yield prefix + child.name, child
            yield from _functions(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, prefix)


def _long_modules() -> set[str]:
    return {
        _relative(path)
        for path in _package_modules()
        if len(path.read_text(encoding="utf-8").splitlines()) > MAX_MODULE_LINES
    }


def _long_functions() -> set[str]:
    found = set()
    for path in _package_modules():
        for name, fn in _functions(parse_source(path)):
            assert fn.end_lineno is not None
            if fn.end_lineno - fn.lineno + 1 > MAX_FUNCTION_LINES:
                found.add(f"{_relative(path)}:{name}")
    return found


def test_no_module_is_over_the_limit() -> None:
    assert _long_modules() - LONG_MODULES_ALLOWED == set()


def test_no_function_is_over_the_limit() -> None:
    assert _long_functions() - LONG_FUNCTIONS_ALLOWED == set()


def test_the_allow_lists_name_only_offenders() -> None:
    assert LONG_MODULES_ALLOWED - _long_modules() == set()
    assert LONG_FUNCTIONS_ALLOWED - _long_functions() == set()


def _imports_tests(tree: ast.Module) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(name == "tests" or name.startswith("tests.") for name in names):
            lines.append(node.lineno)
    return lines


def test_bench_imports_nothing_from_tests() -> None:
    found = [
        f"{_relative(path)}:{line}"
        for path in sorted(BENCH.rglob("*.py"))
        for line in _imports_tests(parse_source(path))
    ]
    assert found == []
