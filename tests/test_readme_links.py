"""Every link between the README and the manual's pages (docs/*.md) leads to a file that exists
and, when it names a section, to a heading there; every page is in the manual's table of
contents."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from tests.support.markdown import extension

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings (and MyST, with ``myst_heading_anchors``): lower
    case, punctuation but ``-`` and ``_`` dropped, spaces made ``-``; a repeated one gets
    ``-1``, ``-2``... Fenced code is skipped."""
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


def links(markdown: str) -> list[str]:
    """The targets of the markdown links and images that stay in this repository (fenced code
    is skipped)."""
    prose = re.sub(r"^ *```.*?^ *```", "", markdown, flags=re.MULTILINE | re.DOTALL)
    targets = re.findall(r"\]\(([^)\s]+)\)", prose)
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_anchors_are_made_as_github_makes_them() -> None:
    text = "# A: b\n```\n# not a heading\n```\n## Focusing: `--include` and `--x`\n# A: b\n"
    assert anchors(text) == {"a-b", "focusing---include-and---x", "a-b-1"}


def test_links_are_found_and_urls_left_out() -> None:
    text = (
        "[a](#x) [b](docs/q.md#y) ![c](page.png) [d](https://ui.perfetto.dev)\n```\nf[x](16)\n```\n"
    )
    assert links(text) == ["#x", "docs/q.md#y", "page.png"]


def _broken(page: Path, text: str) -> tuple[int, list[str]]:
    """How many links ``text`` (on ``page``) has, and those that lead nowhere."""
    broken = []
    found = links(text)
    for target in found:
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.is_file():
            broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
        elif anchor and anchor not in anchors(linked.read_text(encoding="utf-8")):
            broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    return len(found), broken


def test_every_link_leads_to_a_file_and_a_heading_that_exist() -> None:
    broken = []
    count = 0
    for page in PAGES:
        found, wrong = _broken(page, page.read_text(encoding="utf-8"))
        count += found
        broken += wrong
    assert count > 50, "the README and the manual link each other's sections"
    assert broken == []


def test_the_links_in_the_rendered_tables_lead_to_headings() -> None:
    """The options' and metrics' tables are rendered from the code (docs/_ext): the links in
    their cells lead from their page like its own."""
    rows = extension("asyncflow_rows")
    options = "\n".join(" ".join(row) for row in rows.option_rows())
    metrics = "\n".join(" ".join(r) for e in ("prometheus", "otel") for r in rows.metric_rows(e))
    count, broken = _broken(DOCS / "profiler.md", options)
    assert count >= 5, "options link to the pages that say more"
    assert broken == []
    assert _broken(DOCS / "exporters.md", metrics)[1] == []


def test_the_readme_links_every_page_of_the_manual() -> None:
    linked = {
        (ROOT / target.partition("#")[0]).resolve()
        for target in links(README.read_text(encoding="utf-8"))
    }
    assert sorted(p.name for p in DOCS.glob("*.md") if p.resolve() not in linked) == []


def test_every_page_is_in_the_table_of_contents() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^([a-z][a-z0-9-]*)$", index, re.MULTILINE))
    pages = {p.stem for p in DOCS.glob("*.md")} - {"index"}
    assert sorted(pages - listed) == []
