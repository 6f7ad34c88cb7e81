"""Named SQL queries kept in .sql files beside the code that runs them.

A file holds queries each introduced by a `-- name: <query_name>` line (the procrastinate
habit): reviewable as SQL, loaded once, executed with bound parameters only. A module
binds its file in one line and asks it for statements by name:

    query = NamedQueries("pin_orchestration.scraping", "queries.sql")
    conn.execute(query("claim_due_jobs"), params)

The package is named in full, not taken from `__package__`: the .sql file stays where it
is when a module using it moves, and tests/test_sql_names.py reads the names statically.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from importlib import resources

from sqlalchemy import TextClause, text

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


class UnknownQueryError(KeyError):
    """A name the .sql file does not define (a typo, or a query left behind)."""


class NamedQueries:
    """The named statements of one .sql file of a package, read on first use."""

    def __init__(self, package: str, filename: str) -> None:
        self.package = package
        self.filename = filename

    def __repr__(self) -> str:
        return f"NamedQueries({self.package!r}, {self.filename!r})"

    def __call__(self, name: str) -> TextClause:
        """The statement as a SQLAlchemy text clause, built once per name (building one
        parses its bind parameters anew)."""
        return _clause(self.package, self.filename, name)

    def sql(self, name: str) -> str:
        """The statement's text, for the few that are composed from fragments."""
        return _sql(self.package, self.filename, name)

    def __iter__(self) -> Iterator[str]:
        """The query names, in file order."""
        return iter(_read(self.package, self.filename))


@functools.cache
def _clause(package: str, filename: str, name: str) -> TextClause:
    return text(_sql(package, filename, name))


def _sql(package: str, filename: str, name: str) -> str:
    queries = _read(package, filename)
    if name not in queries:
        raise UnknownQueryError(
            f"{package}/{filename} has no query {name!r} (it has: {', '.join(queries)})"
        )
    return queries[name]


@functools.cache
def _read(package: str, filename: str) -> dict[str, str]:
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
