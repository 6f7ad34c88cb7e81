"""The one place that acknowledges Dagster preview/beta features this project uses on
purpose, so code servers, `pin` commands and tests do not repeat warnings about them.

A feature not listed here still warns: that is the point of listing them one by one.
Matched by message (not by importing Dagster's warning classes) so that importing the
package stays cheap for commands that never touch Dagster.
"""

from __future__ import annotations

import warnings

# The start of Dagster's message for each feature chosen deliberately.
INTENDED_PREVIEW_FEATURES: tuple[str, ...] = (
    # Daily asset checks on partitioned assets (news/post_comment_counts, scraping/results).
    "Specifying a partitions_def on an AssetCheckSpec",
    # Dagster's own default automation sensor, there because the analysts' derived assets
    # use automation conditions (pin_orchestration/assets/analyst.py).
    "Parameter `owners` of initializer `SensorDefinition.__init__`",
    # The PostgreSQL reader bundled with the assets it loads (analysts' DataFrames).
    "Parameter `io_manager_def` of function `asset`",
    # chessboard/building_free_share: a drain's projects built in one run, not one each.
    "Parameter `backfill_policy` of function `asset`",
    # The areas' health assets and the detach outbox are observable (their pages show the
    # last observation): pin_orchestration/assets/alert_checks.py.
    "Function `multi_observable_source_asset` is currently in beta",
    # `pin up` runs `dagster dev` (the project has no `dg` layout).
    "Function `dev_command` is superseded",
)


# Warnings about the host, not about anything an operator of this stack can act on.
HOST_NOISE: tuple[str, ...] = (
    # platformdirs (through pgserver) on hosts without a login session (containers, CI):
    # it falls back to /tmp/runtime-$UID, which serves the embedded PostgreSQL fine.
    "XDG_RUNTIME_DIR is not set",
)


def silence_intended_dagster_warnings() -> None:
    for message in INTENDED_PREVIEW_FEATURES + HOST_NOISE:
        warnings.filterwarnings("ignore", message=f"^{message}")


def pythonwarnings_value() -> str:
    """The same list as PYTHONWARNINGS, for processes that never import this package
    (`dagster dev`, and through it the webserver and daemon) — `pin up` sets it."""
    # -W syntax: action:message-prefix; the messages hold no colons.
    return ",".join(f"ignore:{message}" for message in INTENDED_PREVIEW_FEATURES + HOST_NOISE)
