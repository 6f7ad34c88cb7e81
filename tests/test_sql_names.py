"""Every named query of every .sql file in the package is run by the code, and every name
the code asks a .sql file for is defined there — checked statically over all modules, so a
query left behind by a refactor, or a typo in a name, fails here and not in production."""

from __future__ import annotations

import ast
from collections import defaultdict
from importlib import resources
from pathlib import Path

import pytest

import pin_orchestration
from pin_orchestration.platform.sql import NamedQueries, UnknownQueryError
from tests.source_trees import parse_source

PACKAGE_DIR = Path(pin_orchestration.__file__).parent


def _modules() -> dict[Path, ast.Module]:
    return {p: parse_source(p) for p in PACKAGE_DIR.rglob("*.py")}


def _sql_files() -> dict[str, list[str]]:
    """'package/file.sql' → its query names, for every .sql file under the package."""
    files = {}
    for path in PACKAGE_DIR.rglob("*.sql"):
        # Schema, not named queries: function definitions (scraping/sql/) and the frozen
        # SQL of migrations, checked by tests/migrations/test_schema.py instead.
        if path.parent.name == "sql" or "migrations" in path.parts:
            continue
        package = ".".join(path.parent.relative_to(PACKAGE_DIR.parent).parts)
        files[f"{package}/{path.name}"] = list(NamedQueries(package, path.name))
    return files


def _binding(node: ast.AST) -> str | None:
    """'package/file.sql' when `node` is NamedQueries("package", "file.sql")."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "NamedQueries"
        and len(node.args) == 2
        and all(isinstance(a, ast.Constant) for a in node.args)
    ):
        package, filename = (a.value for a in node.args)  # type: ignore[attr-defined]
        return f"{package}/{filename}"
    return None


def _module_bindings(modules: dict[Path, ast.Module]) -> dict[Path, dict[str, str]]:
    """Per module, its module-level names bound to a .sql file (several modules each have
    a `_q` of their own: names are resolved module by module)."""
    bindings: dict[Path, dict[str, str]] = defaultdict(dict)
    for path, tree in modules.items():
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and (f := _binding(node.value))
            ):
                bindings[path][node.targets[0].id] = f
    return bindings


def _module_path(module: str) -> Path | None:
    parts = module.split(".")
    if parts[0] != PACKAGE_DIR.name:
        return None
    base = PACKAGE_DIR.parent.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _visible_bindings(
    path: Path, tree: ast.Module, bindings: dict[Path, dict[str, str]]
) -> dict[str, str]:
    """The module's own bindings plus those it imports by name from package modules."""
    visible = dict(bindings.get(path, {}))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            source = _module_path(node.module)
            for alias in node.names:
                if source is not None and alias.name in bindings.get(source, {}):
                    visible[alias.asname or alias.name] = bindings[source][alias.name]
    return visible


def _asked_name(node: ast.AST, names: dict[str, str]) -> tuple[str, str] | None:
    """(file, query name) for `binding("name")` or `binding.sql("name")`."""
    if not (
        isinstance(node, ast.Call)
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return None
    target = node.func
    if isinstance(target, ast.Attribute) and target.attr == "sql":
        target = target.value
    if isinstance(target, ast.Name) and target.id in names:
        return names[target.id], node.args[0].value
    return None


def _uses(modules: dict[Path, ast.Module]) -> dict[str, set[tuple[str, Path]]]:
    """'package/file.sql' → {(query name, module)} for every name the code asks it for."""
    bindings = _module_bindings(modules)
    uses: dict[str, set[tuple[str, Path]]] = defaultdict(set)
    for path, tree in modules.items():
        names = _visible_bindings(path, tree, bindings)
        for node in ast.walk(tree):
            if asked := _asked_name(node, names):
                uses[asked[0]].add((asked[1], path))
    return uses


def _string_literals(modules: dict[Path, ast.Module]) -> set[str]:
    return {
        n.value
        for tree in modules.values()
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def test_every_sql_file_is_found() -> None:
    files = _sql_files()
    assert "pin_orchestration.chessboard/queries.sql" in files
    assert all(resources.files(f.split("/")[0]).joinpath(f.split("/")[1]).is_file() for f in files)


def test_every_name_the_code_asks_for_is_defined() -> None:
    files = _sql_files()
    uses = _uses(_modules())
    assert uses, "no query use found: the scan is broken"
    missing = [
        f"{path.relative_to(PACKAGE_DIR.parent)} asks {sql_file} for {name!r}"
        for sql_file, used in uses.items()
        for name, path in used
        if name not in files[sql_file]
    ]
    assert missing == []


def test_every_named_query_is_used() -> None:
    modules = _modules()
    uses = _uses(modules)
    literals = _string_literals(modules)
    unused = [
        f"{sql_file}: {name}"
        for sql_file, queries in _sql_files().items()
        for name in queries
        # Asked for by name, or named as a string the code picks it by (a loop over names).
        if name not in {n for n, _ in uses.get(sql_file, ())} and name not in literals
    ]
    assert unused == []


def test_every_query_file_is_bound_once_at_module_level() -> None:
    """`NamedQueries("package", "file.sql")` bound to a module-level name, with the file
    spelled out: the form the scan above reads (a binding inside a function, or built from
    variables, would hide its uses from it)."""
    modules = _modules()
    bound = {
        id(n.value) for tree in modules.values() for n in tree.body if isinstance(n, ast.Assign)
    }
    elsewhere = [
        f"{path.relative_to(PACKAGE_DIR.parent)}:{node.lineno}"
        for path, tree in modules.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "NamedQueries"
        and (id(node) not in bound or _binding(node) is None)
    ]
    assert elsewhere == []


def test_an_unknown_name_fails_naming_the_file_and_its_queries() -> None:
    queries = NamedQueries("pin_orchestration.coordination", "raisers.sql")
    with pytest.raises(
        UnknownQueryError, match=r"raisers\.sql has no query 'role_exits'.*role_exists"
    ):
        queries("role_exits")
    assert queries("role_exists") is queries("role_exists")  # one TextClause per name
