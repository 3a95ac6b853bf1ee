"""The ``asyncflow-options`` and ``asyncflow-metrics`` directives: the options' and the metrics'
tables, rendered from the code's tables at build time.

docs/profiler.md's options table is ``asyncflow.config.OPTIONS`` (each option's docs row) and
docs/exporters.md's two metrics tables are ``asyncflow.render.metrics.METRICS``, so that a new
option or metric is one edit in one place, never a docs edit as well (issue 25). The rows are
asyncflow_rows.py's, which the tests check too.
"""

from __future__ import annotations

from typing import Any, ClassVar

from asyncflow_rows import (
    OPTIONS_HEADER,
    OTEL_HEADER,
    PROMETHEUS_HEADER,
    metric_rows,
    option_rows,
    table,
)
from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective


def _parsed(directive: SphinxDirective, lines: list[str]) -> list[nodes.Node]:
    """Markdown lines parsed in place of the directive."""
    container = nodes.container()
    source = directive.get_source_info()[0]
    directive.state.nested_parse(
        StringList(lines, source=source), directive.content_offset, container
    )
    children: list[nodes.Node] = container.children
    return children


class OptionsTable(SphinxDirective):
    """``{asyncflow-options}``: the options table; rows given as content (variables that are
    no option) follow the options'."""

    has_content = True

    def run(self) -> list[nodes.Node]:
        return _parsed(self, table(OPTIONS_HEADER, option_rows(), tuple(self.content)))


class MetricsTable(SphinxDirective):
    """``{asyncflow-metrics} prometheus`` or ``otel``: that export's metrics table."""

    required_arguments = 1
    option_spec: ClassVar[dict[str, Any]] = {}

    def run(self) -> list[nodes.Node]:
        export = directives.choice(self.arguments[0], ("prometheus", "otel"))
        header = PROMETHEUS_HEADER if export == "prometheus" else OTEL_HEADER
        return _parsed(self, table(header, metric_rows(export)))


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("asyncflow-options", OptionsTable)
    app.add_directive("asyncflow-metrics", MetricsTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
