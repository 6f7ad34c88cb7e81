"""Run the fault suite against a deliberately broken copy of the package: a guard the
design relies on is edited out, and the suite must fail naming the invariant it protects."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pin_orchestration

PACKAGE = Path(pin_orchestration.__file__).parent
# The fault suite lives beside the package in the checkout (not in the package).
SUITE = PACKAGE.parent / "faults"


def broken_copy(tmp_path: Path, relative_file: str, guard: str, broken: str) -> Path:
    """A copy of the checkout's package and fault suite in tmp_path with `guard` replaced
    by `broken` in one file of the package; returns the directory to put first on
    PYTHONPATH."""
    root = tmp_path / "broken-build"
    for source in (PACKAGE, SUITE):
        shutil.copytree(source, root / source.name, ignore=shutil.ignore_patterns("__pycache__"))
    target = root / "pin_orchestration" / relative_file
    source = target.read_text()
    assert source.count(guard) == 1, f"the guard is no longer in {relative_file}: {guard!r}"
    target.write_text(source.replace(guard, broken))
    return root


def run_suite(
    pythonpath: Path | None, *only: str, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """`pin faults run --quick --only …` in a child (the broken copy first on its path)."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    args = [sys.executable, "-m", "pin_orchestration.cli", "faults", "run", "--quick"]
    for name in only:
        args += ["--only", name]
    # `python -m` puts the working directory first on sys.path: run from the broken copy,
    # or the checkout's own package would shadow it.
    cwd = pythonpath if pythonpath is not None else None
    # The suite's temporary files (its PostgreSQL, each scenario's workdir, kept when an
    # invariant broke) in a folder of this run's, removed when the run ends as it is meant
    # to (the checkout passes, a broken copy fails); kept for its logs when it does not,
    # and named when the suite did not finish. Not in pytest's tmp tree:
    # as root the embedded server runs as a user of its own, so the folder is what /tmp is
    # to every process of the suite (anyone writes, sticky).
    scratch = Path(tempfile.mkdtemp(prefix="pin-faults-run-"))
    scratch.chmod(0o1777)
    env["TMPDIR"] = str(scratch)
    try:
        result = subprocess.run(
            args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"the suite did not finish in {timeout} s; its files: {scratch}"
        ) from exc
    if result.returncode == (0 if pythonpath is None else 1):
        shutil.rmtree(scratch, ignore_errors=True)
    return result
