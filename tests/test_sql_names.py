"""Every named query of every .sql file in the package is run by the code, and every name
the code asks a .sql file for is defined there — checked statically over all modules, so a
query left behind by a refactor, or a typo in a name, fails here and not in production."""

from __future__ import annotations

import ast
from collections import defaultdict
from importlib import resources
from pathlib import Path

import pin_orchestration
from pin_orchestration.platform.sql import load_queries
from tests.source_trees import parse_source

PACKAGE_DIR = Path(pin_orchestration.__file__).parent


def _modules() -> dict[Path, ast.Module]:
    return {p: parse_source(p) for p in PACKAGE_DIR.rglob("*.py")}


def _sql_files() -> dict[str, dict[str, str]]:
    """'package/file.sql' → its queries, for every .sql file under the package."""
    files = {}
    for path in PACKAGE_DIR.rglob("*.sql"):
        # Schema, not named queries: function definitions (scraping/sql/) and the frozen
        # SQL of migrations, checked by tests/migrations/test_schema.py instead.
        if path.parent.name == "sql" or "migrations" in path.parts:
            continue
        package = ".".join(path.parent.relative_to(PACKAGE_DIR.parent).parts)
        files[f"{package}/{path.name}"] = load_queries(package, path.name)
    return files


def _load_call(node: ast.AST) -> str | None:
    """'package/file.sql' when `node` is load_queries("package", "file.sql")."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "load_queries"
        and len(node.args) == 2
        and all(isinstance(a, ast.Constant) for a in node.args)
    ):
        package, filename = (a.value for a in node.args)  # type: ignore[attr-defined]
        return f"{package}/{filename}"
    return None


def _accessor_functions(modules: dict[Path, ast.Module]) -> dict[Path, dict[str, str]]:
    """Per module, its functions whose body loads a .sql file (several modules may each
    have a `_q` of their own: names are resolved module by module)."""
    accessors: dict[Path, dict[str, str]] = defaultdict(dict)
    for path, tree in modules.items():
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef):
                loaded = {f for n in ast.walk(fn) if (f := _load_call(n))}
                if len(loaded) == 1:
                    accessors[path][fn.name] = loaded.pop()
    return accessors


def _module_path(module: str) -> Path | None:
    parts = module.split(".")
    if parts[0] != PACKAGE_DIR.name:
        return None
    base = PACKAGE_DIR.parent.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _visible_accessors(
    path: Path, tree: ast.Module, accessors: dict[Path, dict[str, str]]
) -> dict[str, str]:
    """The module's own accessors plus those it imports by name from package modules."""
    visible = dict(accessors.get(path, {}))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            source = _module_path(node.module)
            for alias in node.names:
                if source is not None and alias.name in accessors.get(source, {}):
                    visible[alias.asname or alias.name] = accessors[source][alias.name]
    return visible


def _file_of(node: ast.AST, names: dict[str, str]) -> str | None:
    """The .sql file behind `load_queries(...)`, `accessor()` or a variable holding one."""
    if loaded := _load_call(node):
        return loaded
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args:
        return names.get(node.func.id)
    return None


def _uses(modules: dict[Path, ast.Module]) -> dict[str, set[tuple[str, Path]]]:
    """'package/file.sql' → {(query name, module)} for every name the code asks it for:
    `accessor("name")`, `accessor()["name"]` and `variable["name"]`."""
    accessors = _accessor_functions(modules)
    uses: dict[str, set[tuple[str, Path]]] = defaultdict(set)
    for path, tree in modules.items():
        functions = _visible_accessors(path, tree, accessors)
        names = dict(functions)
        for node in ast.walk(tree):  # module-local variables bound to a file's queries
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name) and (f := _file_of(node.value, names)):
                    names[target.id] = f
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in functions
                and len(node.args) == 1
                and isinstance(node.args[0], ast.Constant)
            ):
                uses[functions[node.func.id]].add((node.args[0].value, path))
            elif (
                isinstance(node, ast.Subscript)
                and isinstance(node.slice, ast.Constant)
                and (f := _file_of(node.value, names))
            ):
                uses[f].add((node.slice.value, path))
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
