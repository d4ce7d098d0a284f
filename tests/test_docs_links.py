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
