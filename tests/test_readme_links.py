"""Every link to a section of the README leads to a heading that exists."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings: lower case, punctuation but ``-`` and ``_``
    dropped, spaces made ``-``; a repeated one gets ``-1``, ``-2``... Fenced code is skipped."""
    found: set[str] = set()
    seen: Counter[str] = Counter()
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        heading = re.match(r"#{1,6} (.*)", line)
        if fenced or heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return found


def test_anchors_are_made_as_github_makes_them() -> None:
    text = "# A: b\n```\n# not a heading\n```\n## Focusing: `--include` and `--x`\n# A: b\n"
    assert anchors(text) == {"a-b", "focusing---include-and---x", "a-b-1"}


def test_every_link_to_a_section_of_the_readme_leads_to_one() -> None:
    text = README.read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(#([^)\s]+)\)", text))
    assert linked, "the README links its sections"
    assert sorted(linked - anchors(text)) == []
