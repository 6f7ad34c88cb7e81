"""How loud `pin` is: its own log level, and libraries' routine kept below it."""

from __future__ import annotations

import logging

LOG_LEVELS = ("debug", "info", "warning", "error")
# Libraries' routine at INFO (pgserver's initdb/pg_ctl command lines, alembic's plugin
# registrations on every start, and its migration lines: each migration's docstring, a
# paragraph, where pin_orchestration.migrations logs one line): only their problems
# concern an operator.
CHATTY_LOGGERS = ("pgserver", "alembic.runtime.plugins", "alembic.runtime.migration")


def configure_logging(level: str) -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(level.upper())
    detail = logging.DEBUG if level == "debug" else logging.WARNING
    for chatty in CHATTY_LOGGERS:
        logging.getLogger(chatty).setLevel(detail)
