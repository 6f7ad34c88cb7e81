"""Each job's page in docs/jobs/ leads a newcomer from the job's sensor or schedule to its SQL
in at most four files (issue 32): every numbered list under "From trigger to SQL" that
starts at Dagster wiring (a sensor, a schedule, a runbook job) has at most four items, and
every file the section names exists. The pages' other lists (the API's intake, `pin up`)
follow a request or a command, not a job. Pure file reading."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs" / "jobs").glob("*.md"))
SECTION = re.compile(r"^## From trigger to SQL\n(.*?)(?=^## )", re.MULTILINE | re.DOTALL)
PATH = re.compile(r"`(pin_orchestration/[^`\s]+)`")
MOST_FILES = 4
WIRING = ("pin_orchestration/sensors/", "pin_orchestration/schedules/", "pin_orchestration/jobs/")


def trigger_section(page: Path) -> str:
    match = SECTION.search(page.read_text())
    assert match, f"{page.name}: no '## From trigger to SQL' section"
    return match.group(1)


def numbered_lists(section: str) -> list[list[str]]:
    """The section's numbered lists, each as its items' first lines."""
    lists: list[list[str]] = []
    previous = 0
    for line in section.splitlines():
        item = re.match(r"(\d+)\. ", line)
        if item is None:
            continue
        number = int(item.group(1))
        if number == 1:
            lists.append([])
        assert number == previous + 1 or number == 1, line
        previous = number
        lists[-1].append(line)
    return lists


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_each_path_from_trigger_to_sql_takes_at_most_four_files(page: Path) -> None:
    lists = numbered_lists(trigger_section(page))
    jobs = [items for items in lists if any(f"`{folder}" in items[0] for folder in WIRING)]
    assert jobs, f"{page.name}: no job's list under 'From trigger to SQL'"
    too_long = [items[0] for items in jobs if len(items) > MOST_FILES]
    assert too_long == [], f"{page.name}: more than {MOST_FILES} files from {too_long}"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_file_a_job_page_points_at_exists(page: Path) -> None:
    named = PATH.findall(trigger_section(page))
    missing = [path for path in named if not (ROOT / path).exists()]
    assert missing == [], f"{page.name} points at files that are not there: {missing}"
