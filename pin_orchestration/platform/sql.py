"""Named SQL queries kept in .sql files beside the code that runs them.

A file holds queries each introduced by a `-- name: <query_name>` line (the procrastinate
habit): reviewable as SQL, loaded once, executed with bound parameters only.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


@functools.cache
def load_queries(package: str, filename: str) -> dict[str, str]:
    """Map query name → SQL text for one .sql file of a package."""
    source = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    parts = _NAME.split(source)
    # parts = [preamble, name1, body1, name2, body2, ...]
    queries = {
        name: _without_trailing_comments(body)
        for name, body in zip(parts[1::2], parts[2::2], strict=True)
    }
    if not queries:
        raise ValueError(f"{package}/{filename} has no '-- name:' queries")
    return queries


def _without_trailing_comments(body: str) -> str:
    """A query's text without the comment lines that introduce the next query."""
    lines = body.strip().splitlines()
    while lines and (not lines[-1].strip() or lines[-1].lstrip().startswith("--")):
        lines.pop()
    return "\n".join(lines)
