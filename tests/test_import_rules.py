"""The package depends one way. The ground floor (platform/, then coordination/ on it)
imports no area and no wiring: an area hands it what it serves (metric collectors,
retention rules) as arguments, listed once in areas.py. The domain areas (news/,
chessboard/, scraping/, analyst.py) import no wiring, and devstack/ no CLI.

The Dagster wiring depends one way: definitions → sensors and schedules → jobs → assets
→ resources → the domain modules. A sensor imports the job it launches, a schedule its job
(the asset jobs schedules launch sit with them), neither the other; a job module never
imports a sensor or schedule module, an asset module never imports a job, sensor or
schedule module, and a resource module never imports an asset module — not even inside a
function to dodge a cycle: a name both sides need lives on the lower side (a job's
identity beside the code it runs, an asset key the IO manager reads spelled in its table).
No wiring module imports devstack/, the local stack.

Checked on the source (every import statement, at any depth), so a violation fails here
rather than as an import cycle at load time; and no module of the package reaches itself
through its imports (those inside functions included).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.source_trees import parse_source

PACKAGE = Path(__file__).parent.parent / "pin_orchestration"
# The areas' domain code (plain Python, no Dagster): a folder, or a module.
DOMAIN_AREAS = ("news", "chessboard", "scraping", "analyst")

# The areas and the wiring above them: what the ground floor never imports.
ABOVE_THE_GROUND = tuple(
    f"pin_orchestration.{name}"
    for name in (
        "news",
        "chessboard",
        "scraping",
        "jobs",
        "assets",
        "resources",
        "sensors",
        "schedules",
        "cli",
        "devstack",
        "definitions",
        "analyst",
        "areas",
    )
)
# What wires the areas together: what an area never imports.
WIRING = tuple(p for p in ABOVE_THE_GROUND if p.rpartition(".")[2] not in DOMAIN_AREAS)

# What each folder may not import (module prefixes).
FORBIDDEN = {
    # The lowest floor: coordination stands on it.
    "platform": (*ABOVE_THE_GROUND, "pin_orchestration.coordination"),
    "coordination": ABOVE_THE_GROUND,
    **dict.fromkeys(DOMAIN_AREAS, WIRING),
    "devstack": ("pin_orchestration.cli",),
    "sensors": (
        "pin_orchestration.schedules",
        "pin_orchestration.definitions",
        "pin_orchestration.devstack",
    ),
    "schedules": (
        "pin_orchestration.sensors",
        "pin_orchestration.definitions",
        "pin_orchestration.devstack",
    ),
    "jobs": (
        "pin_orchestration.sensors",
        "pin_orchestration.schedules",
        "pin_orchestration.definitions",
        "pin_orchestration.devstack",
    ),
    "assets": (
        "pin_orchestration.jobs",
        "pin_orchestration.sensors",
        "pin_orchestration.schedules",
        "pin_orchestration.definitions",
        "pin_orchestration.devstack",
    ),
    "resources": (
        "pin_orchestration.assets",
        "pin_orchestration.jobs",
        "pin_orchestration.sensors",
        "pin_orchestration.schedules",
        "pin_orchestration.definitions",
        "pin_orchestration.devstack",
    ),
}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module an import statement in `path` names, with its line."""
    found = []
    for node in ast.walk(parse_source(path)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            # `from pin_orchestration import jobs` names the package through its alias.
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            found.append((node.lineno, "." * node.level + (node.module or "")))
    return found


def _is_under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def source_files(area: str) -> list[Path]:
    """The modules of a folder of the package (its sub-packages too), or the one module."""
    if (PACKAGE / area).is_dir():
        return sorted((PACKAGE / area).rglob("*.py"))
    return [PACKAGE / f"{area}.py"]


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_imports_go_one_way(folder: str) -> None:
    files = source_files(folder)
    assert all(path.is_file() for path in files) and files, f"no pin_orchestration/{folder}"
    # One line per import statement: `from a import b` names a and a.b.
    violations = list(
        {
            f"{path.relative_to(PACKAGE.parent)}:{line}": f"imports {module}"
            for path in files
            for line, module in reversed(imported_modules(path))
            if module.startswith(".") or any(_is_under(module, p) for p in FORBIDDEN[folder])
        }.items()
    )
    assert violations == [], (
        f"pin_orchestration/{folder} may not import {', '.join(FORBIDDEN[folder])} "
        "(nor use relative imports): move the shared name to the lower side, or have the "
        "upper side hand it in as an argument\n"
        + "\n".join(f"{where} {what}" for where, what in sorted(violations))
    )


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module → the modules of the package it imports, at any depth. `from a import b`
    names the module a.b when there is one, else a; importing a module runs its packages'
    __init__ too, but that is no arrow of its own (a package's __init__ may import its
    modules)."""
    modules = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}

    def module_of(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = {module_of(imported) for _, imported in imported_modules(path)}
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = lowest[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                lowest[node] = min(lowest[node], lowest[target])
            elif target in stack:
                lowest[node] = min(lowest[node], index[target])
        if lowest[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            if component:
                found.append(sorted([node, *component]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_through_others() -> None:
    graph = import_graph()
    assert len(graph) > 100, "the package's modules were not found"
    described = [
        " ↔ ".join(component)
        + "\n"
        + "\n".join(
            f"    {source} → {target}"
            for source in component
            for target in sorted(graph[source] & set(component))
        )
        for component in cycles(graph)
    ]
    assert described == [], "import cycles:\n" + "\n".join(described)


def test_the_cycle_check_sees_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_rule_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "io.py"
    module.write_text(
        "def load():\n    from pin_orchestration.assets.chessboard import PROJECT_AGGREGATES\n"
    )
    assert (2, "pin_orchestration.assets.chessboard") in imported_modules(module)


def test_the_postgres_reader_reads_exactly_the_assets_that_use_it() -> None:
    """Its table spells the asset keys (it may not import them): every key in it is an asset
    loaded through the reader, and every such asset has its frame in the table."""
    from pin_orchestration.definitions import build_definitions
    from pin_orchestration.platform.settings import Settings
    from pin_orchestration.resources.analyst_io import FRAME_OF_PARTITION, PostgresAssetReader

    defs = build_definitions(Settings.from_env({}))
    repo = defs.get_repository_def()
    reader_keys = {
        key for key, value in defs.resources.items() if isinstance(value, PostgresAssetReader)
    }
    read_through_it = set()
    for assets_def in repo.assets_defs_by_key.values():
        for key in assets_def.keys:
            manager_key = assets_def.get_io_manager_key_for_asset_key(key)
            # A bundled io_manager_def is a resource definition made from the class.
            bundled = getattr(
                assets_def.resource_defs.get(manager_key), "configurable_resource_cls", None
            )
            if manager_key in reader_keys or bundled is PostgresAssetReader:
                read_through_it.add(key.to_user_string())
    assert read_through_it == set(FRAME_OF_PARTITION)
