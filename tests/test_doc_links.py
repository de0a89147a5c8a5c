"""Relative links in README.md and docs/*.md point at files that exist, and their
#anchors at headings those files have (GitHub's heading slugs)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose(text: str) -> str:
    """The page without fenced code blocks and inline code (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, flags=re.M):
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def relative_links(page: Path) -> list[str]:
    return [
        t
        for t in LINK.findall(_prose(page.read_text()))
        if not re.match(r"^[a-z][a-z0-9+.-]*:", t)  # http:, https:, mailto: ...
    ]


def broken(page: Path) -> list[str]:
    bad = []
    for target in relative_links(page):
        path, _, frag = unquote(target).partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            bad.append(f"{target}: no heading #{frag} in {os.path.relpath(dest, page.parent)}")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    """Every relative link of the page names an existing file (and heading)."""
    assert not broken(page), broken(page)


def test_the_check_finds_a_broken_file_and_a_broken_anchor(tmp_path):
    """A missing file and a missing heading are both reported; good links are not."""
    (tmp_path / "other.md").write_text("# Other page\n\n## A section: with `code`\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md) [ok](other.md#a-section-with-code) [ok](#top)\n"
        "[gone](missing.md) [bad anchor](other.md#nowhere) [web](https://example.org)\n"
        "```\n[in code](ignored.md)\n```\n# Top\n"
    )
    assert broken(page) == [
        "missing.md: no such file",
        "other.md#nowhere: no heading #nowhere in other.md",
    ]
