"""The Dagster wiring depends one way: definitions → sensors and schedules → jobs → assets
→ resources → the domain modules. A sensor imports the job it launches, a schedule its job
(the asset jobs schedules launch sit with them), neither the other; a job module never
imports a sensor or schedule module, an asset module never imports a job, sensor or
schedule module, and a resource module never imports an asset module — not even inside a
function to dodge a cycle: a name both sides need lives on the lower side (a job's
identity beside the code it runs, an asset key the IO manager reads spelled in its table).
No wiring module imports devstack/, the local stack.

Checked on the source (every import statement, at any depth), so a violation fails here
rather than as an import cycle at load time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.source_trees import parse_source

PACKAGE = Path(__file__).parent.parent / "pin_orchestration"

# What each folder of wiring may not import (module prefixes).
FORBIDDEN = {
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


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_wiring_imports_go_one_way(folder: str) -> None:
    files = sorted((PACKAGE / folder).glob("*.py"))
    assert files, f"no modules under pin_orchestration/{folder}"
    violations = [
        f"pin_orchestration/{folder}/{path.name}:{line} imports {module}"
        for path in files
        for line, module in imported_modules(path)
        if module.startswith(".") or any(_is_under(module, p) for p in FORBIDDEN[folder])
    ]
    assert violations == [], (
        f"pin_orchestration/{folder} may not import {', '.join(FORBIDDEN[folder])} "
        "(nor use relative imports): move the shared name to the lower side\n"
        + "\n".join(violations)
    )


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
