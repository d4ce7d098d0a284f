"""The project's Markdown pages link to files that exist and to headings that exist in them (GitHub's heading
anchors), so a page split or a renamed heading cannot leave a dead link behind."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "benchmarks").glob("*.md")])
LINK = re.compile(r"\]\(([^)\s#]*)(?:#([^)\s]+))?\)")  # [text](path#anchor), path or anchor may be empty


def slug(heading: str) -> str:
    """GitHub's anchor for a heading (str): lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors (set of str) of `page`'s headings outside code fences; a repeated one gets -1, -2, ..."""
    seen: dict[str, int] = {}
    out, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"#{1,6}\s+(.*)", line)
        if m:
            s = slug(m.group(1))
            seen[s] = seen.get(s, -1) + 1
            out.add(s if seen[s] == 0 else f"{s}-{seen[s]}")
    return out


def dead_links(page: Path) -> list[str]:
    """'line: link (why)' for each relative link of `page` (Path) whose file or heading is missing."""
    dead = []
    for n, line in enumerate(page.read_text().splitlines(), 1):
        for m in LINK.finditer(line):
            path, anchor = m.group(1), m.group(2)
            if re.match(r"[a-z]+:", path) or (not path and not anchor):  # http:, mailto:, ...
                continue
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                dead.append(f"{n}: {m.group(0)} (no file {path})")
            elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                dead.append(f"{n}: {m.group(0)} (no heading #{anchor} in {target.name})")
    return dead


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))  # every page users or we read
def test_every_link_reaches_a_file_and_heading(page):
    assert dead_links(page) == []


def test_a_dead_anchor_or_file_is_found(tmp_path):
    """The check itself: a link to a missing heading and to a missing file are both reported, a good one is not."""
    (tmp_path / "b.md").write_text("# Speed now (run 50)\n## Speed now (run 50)\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#speed-now-run-50) [ok2](b.md#speed-now-run-50-1) [bad](b.md#speed)\n"
                    "[gone](c.md) [web](https://example.com/x#y) [self](#nothing-here)\n")
    assert dead_links(page) == ["1: ](b.md#speed) (no heading #speed in b.md)", "2: ](c.md) (no file c.md)",
                                "2: ](#nothing-here) (no heading #nothing-here in a.md)"]


TEST_REF = re.compile(r"(tests/[\w/]+\.py)::(\w+)")  # tests/<path>.py::<test>, as docs name a behaviour's test


def dead_test_refs(page: Path) -> list[str]:
    """'line: ref (why)' for each `tests/<path>.py::<name>` of `page` whose file or test function is missing."""
    dead = []
    for n, line in enumerate(page.read_text().splitlines(), 1):
        for m in TEST_REF.finditer(line):
            path = ROOT / m.group(1)
            if not path.is_file():
                dead.append(f"{n}: {m.group(0)} (no file)")
            elif not re.search(rf"^def {m.group(2)}\(", path.read_text(), re.M):
                dead.append(f"{n}: {m.group(0)} (no test {m.group(2)})")
    return dead


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))  # every page users or we read
def test_every_named_test_exists(page):
    assert dead_test_refs(page) == []


def test_reliability_names_a_test_for_every_failure_mode():
    """docs/reliability.md's failure modes each name their test: every table row of its golden-file section, and
    the page as a whole names many."""
    text = (ROOT / "docs" / "reliability.md").read_text()
    golden = text.split("## Golden files", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in golden.splitlines() if ln.startswith("| ") and not ln.startswith("| what goes wrong")]
    assert rows and all(TEST_REF.search(ln) for ln in rows), [ln[:80] for ln in rows if not TEST_REF.search(ln)]
    assert len(set(TEST_REF.findall(text))) >= 50
