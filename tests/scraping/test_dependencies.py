"""The dependencies the fetcher's safety rests on are pinned past their known holes."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_urllib3_is_required_at_2_6_or_later() -> None:
    """urllib3 before 2.6 decompresses streamed bodies without bound (CVE-2025-66471), and
    requests>=2.32 alone still allows it."""
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    [urllib3] = [r for r in map(Requirement, dependencies) if r.name == "urllib3"]
    assert not urllib3.specifier.contains(Version("2.5.0"))
    assert urllib3.specifier.contains(Version("2.6.0"))
    assert Version(version("urllib3")) >= Version("2.6")
