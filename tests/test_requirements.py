"""docs/requirements.md holds every requirement the project cites (issue 32): each code cited
in the package, the docs, the README, the tests, the benches and the fault suite is a
heading there; each heading there is cited somewhere else or marked not yet implemented;
and every file and link the page points at exists. Pure file reading, no database."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "docs" / "requirements.md"
CITING = ["pin_orchestration", "docs", "tests", "bench", "faults", "contracts", "README.md"]
TEXT_SUFFIXES = {".py", ".sql", ".md", ".yaml", ".yml", ".toml", ".json", ".ini", ".mako", ".txt"}
NOT_YET = "**Not yet implemented**"

PREFIX = r"(REC|DET|AGG|SCR|OPS)"
CODE = re.compile(rf"\b{PREFIX}-(\d+[a-z]?)\b")
# "SCR-7…SCR-9", "AGG-3..AGG-5", "DET-1–7": every code in between is cited too.
RANGE = re.compile(rf"\b{PREFIX}-(\d+)\s*(?:…|\.\.\.?|–|—)\s*(?:{PREFIX}-)?(\d+)\b")
# "SPEC §4", "requirements §4", "requirements.md §4": a section of docs/requirements.md.
SECTION = re.compile(r"\b(?:SPEC|requirements(?:\.md)?)\s*§\s*(\d+)")
CODE_HEADING = re.compile(rf"^### ({PREFIX}-\d+[a-z]?)\s*$", re.MULTILINE)
SECTION_HEADING = re.compile(r"^## (\d+)\. ", re.MULTILINE)
PATH_POINTER = re.compile(r"`((?:pin_orchestration|tests|bench|docs|faults|contracts)/[^`\s]*)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def citing_files() -> list[Path]:
    files: list[Path] = []
    for name in CITING:
        path = ROOT / name
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        files += [
            f
            for f in candidates
            if f.is_file()
            and f.suffix in TEXT_SUFFIXES
            and "__pycache__" not in f.parts
            and f not in (REQUIREMENTS, Path(__file__).resolve())
        ]
    return files


def cited_in(text: str) -> tuple[set[str], set[str]]:
    """The codes (ranges expanded) and the section numbers a text cites."""
    codes = {f"{m[1]}-{m[2]}" for m in CODE.finditer(text)}
    for m in RANGE.finditer(text):
        prefix, first, second_prefix, last = m[1], int(m[2]), m[3], int(m[4])
        if second_prefix in (None, prefix) and first < last:
            codes |= {f"{prefix}-{n}" for n in range(first, last + 1)}
    return codes, {m[1] for m in SECTION.finditer(text)}


def citations() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Code → files citing it, section → files citing it."""
    codes: dict[str, set[str]] = defaultdict(set)
    sections: dict[str, set[str]] = defaultdict(set)
    for path in citing_files():
        found_codes, found_sections = cited_in(path.read_text(encoding="utf-8", errors="replace"))
        where = str(path.relative_to(ROOT))
        for code in found_codes:
            codes[code].add(where)
        for section in found_sections:
            sections[section].add(where)
    return codes, sections


def entries(text: str) -> dict[str, str]:
    """Each code heading of the page with its entry's text (up to the next heading)."""
    heads = list(re.finditer(r"^#{2,3} .*$", text, re.MULTILINE))
    out: dict[str, str] = {}
    for i, head in enumerate(heads):
        m = CODE_HEADING.match(head[0])
        if m:
            end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
            out[m[1]] = text[head.end() : end]
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return {slug(m[1]) for m in re.finditer(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def test_every_cited_code_and_section_is_in_the_requirements() -> None:
    page = REQUIREMENTS.read_text(encoding="utf-8")
    headings = set(entries(page))
    section_headings = set(SECTION_HEADING.findall(page))
    codes, sections = citations()
    assert codes, "no code cited anywhere: the scan itself is broken"
    missing = {c: sorted(files) for c, files in codes.items() if c not in headings}
    assert not missing, (
        f"cited but not a heading of docs/requirements.md: {missing}; add a `### CODE` entry "
        "(from ../shared/SPEC.md and the seeds) or fix the citation"
    )
    missing_sections = {s: sorted(f) for s, f in sections.items() if s not in section_headings}
    assert not missing_sections, (
        f"'§N' cited but docs/requirements.md has no '## N. …' section: {missing_sections}"
    )


def test_every_requirement_is_cited_or_marked_not_yet_implemented() -> None:
    page = REQUIREMENTS.read_text(encoding="utf-8")
    codes, _ = citations()
    uncited = [c for c, body in entries(page).items() if c not in codes and NOT_YET not in body]
    assert not uncited, (
        f"{uncited}: no file outside docs/requirements.md cites them; cite each where it is "
        f"implemented (a comment, a docstring, its docs page) or mark its entry {NOT_YET}"
    )
    stale = [c for c, body in entries(page).items() if c in codes and NOT_YET in body]
    assert not stale, f"{stale} are marked {NOT_YET} but cited: drop the mark or the citation"


def test_every_pointer_of_the_requirements_exists() -> None:
    page = REQUIREMENTS.read_text(encoding="utf-8")
    pointers = [p.partition("#")[0].rstrip("/") for p in PATH_POINTER.findall(page)]
    missing = [p for p in pointers if not (ROOT / p).exists()]
    assert not missing, (
        f"docs/requirements.md names files that do not exist: {missing}; point at where "
        "the code lives now"
    )
    broken = []
    for target in LINK.findall(page):
        if "://" in target:
            continue
        file_part, _, anchor = target.partition("#")
        path = (REQUIREMENTS.parent / file_part) if file_part else REQUIREMENTS
        if not path.exists() or (anchor and anchor not in anchors(path)):
            broken.append(target)
    assert not broken, f"docs/requirements.md links to missing files or headings: {broken}"


def test_links_to_the_requirements_land_on_a_heading() -> None:
    """`requirements.md#scr-5` anywhere resolves to a heading of the page."""
    known = anchors(REQUIREMENTS)
    broken = {}
    for path in citing_files():
        for target in LINK.findall(path.read_text(encoding="utf-8", errors="replace")):
            file_part, _, anchor = target.partition("#")
            if file_part.endswith("requirements.md") and anchor and anchor not in known:
                broken.setdefault(str(path.relative_to(ROOT)), []).append(target)
    assert not broken, f"links to docs/requirements.md with no such heading: {broken}"
