"""The manual's options' and metrics' tables, rendered by Sphinx from the code's tables
(docs/_ext/asyncflow_tables.py): the built pages name every option and every metric, a row
each, and the links in the options' cells resolve (issue 25)."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

from asyncflow.config import OPTIONS
from asyncflow.render.metrics import METRICS
from tests.support.markdown import DOCS

pytest.importorskip("sphinx", reason="the 'docs' extra is not installed")
pytest.importorskip("myst_parser", reason="the 'docs' extra is not installed")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The manual, built as its CI builds it (warnings are errors)."""
    out = tmp_path_factory.mktemp("html")
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", str(DOCS), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return out


def _text(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def _rows(page: str) -> list[str]:
    """The text of each row of the page's tables, header rows included."""
    return [_text(row) for row in re.findall(r"<tr.*?</tr>", page, re.S)]


def test_the_built_options_table_has_a_row_per_option(built: Path) -> None:
    page = (built / "profiler.html").read_text(encoding="utf-8")
    rows = _rows(page)
    assert len(rows) == 1 + len(OPTIONS) + 5, "the header, the options, 5 more variables"
    for row, option in zip(rows[1:], OPTIONS, strict=False):
        assert row.split()[0] == option.name
    assert "ASYNCFLOW_ENDPOINT_PROCESS" in rows[-2]
    assert "ASYNCFLOW_GIL_HAND_OVER" in rows[-1]
    assert 'href="endpoint.html#the-endpoint"' in page


def test_the_built_metrics_tables_have_a_row_per_metric(built: Path) -> None:
    rows = _rows((built / "exporters.html").read_text(encoding="utf-8"))
    families = [m.prometheus for m in METRICS if m.prometheus is not None]
    instruments = [m.otel for m in METRICS if m.otel is not None]
    assert len(rows) == 2 + len(families) + len(instruments)
    named = [row.split()[0] for row in rows]
    assert named == ["metric", *families, "instrument", *instruments]
