"""The pytest plugin that fails a session naming each process it started that is still
alive at its end (tests/conftest.py loads it); the process tracking it builds on is
pin_orchestration/devstack/processes.py, shared with the benches."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pin_orchestration.devstack.processes import end_survivors, mark_session

# Under pytest-xdist each worker is a session of its own: it marks its environment, and at
# its end checks (and kills) what it started, handing the survivors to the controller in
# its workeroutput; the controller reports them with whatever outlived the workers.

_MARKER = pytest.StashKey[str]()


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _is_controller(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and not _is_worker(config)


class _Controller:
    """The xdist controller's side: survivors reported by the workers as they go down."""

    def __init__(self) -> None:
        self.reported: list[str] = []

    def pytest_testnodedown(self, node: object, error: object) -> None:
        self.reported.extend(getattr(node, "workeroutput", {}).get("leaked", []))

    @pytest.hookimpl(trylast=True)  # after xdist has taken its workers down
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        _fail_on(session, self.reported + end_survivors(session.config.stash[_MARKER]))


def pytest_configure(config: pytest.Config) -> None:
    # Before any fixture or test starts a process, so that every one inherits the marker.
    config.stash[_MARKER] = mark_session()
    if _is_controller(config):
        config.pluginmanager.register(_Controller(), "pin-leftover-processes-controller")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail the session naming each process it started that is still alive."""
    if _is_controller(session.config):
        return
    left = end_survivors(session.config.stash[_MARKER])
    if _is_worker(session.config):
        session.config.workeroutput["leaked"] = left  # type: ignore[attr-defined]
    _fail_on(session, left)


def _fail_on(session: pytest.Session, left: list[str]) -> None:
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.section("processes that outlived the session (killed now)", red=True)
        for line in left:
            reporter.write_line(line)
        # Shown in the closing line ("…, 1 leaked in 12s").
        reporter.stats.setdefault("leaked", []).extend(
            SimpleNamespace(description=line) for line in left
        )
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
