"""Parsing the package's own source in tests that check rules over it."""

from __future__ import annotations

import ast
from pathlib import Path


def parse_source(path: Path) -> ast.Module:
    """The module's AST. CPython 3.11.7's AST constructor keeps one recursion counter for
    the interpreter (python/cpython#106905, fixed in later releases): a parse while another
    thread of the session builds an AST can fail with "AST constructor recursion depth
    mismatch". The source is fine then; it is parsed again."""
    source = path.read_text(encoding="utf-8")
    for attempt in range(3):
        try:
            return ast.parse(source, filename=str(path))
        except SystemError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")
