"""The rows of the manual's options' and metrics' tables, from the code's tables: the
``asyncflow-options`` and ``asyncflow-metrics`` directives (asyncflow_tables.py) render them,
and the tests check them (no Sphinx needed here)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

OPTIONS_HEADER = ("option", "variable", "default", "meaning")
PROMETHEUS_HEADER = ("metric family", "type", "labels", "what")
OTEL_HEADER = ("instrument", "kind", "unit", "what")


def option_rows() -> list[list[str]]:
    """docs/profiler.md's options table, a row per option of ``config.OPTIONS``, in order."""
    from asyncflow.config import OPTIONS

    rows = []
    for option in OPTIONS:
        if option.env is None:
            variable = "(none: given in code)"
        else:
            variable = f"`{option.env}`" + (f" (`{option.example}`)" if option.example else "")
        rows.append([f"`{option.name}`", variable, option.default, option.help])
    return rows


class _Any:
    """A stand-in for any entry of the figures: every attribute, item and element is another
    one, so that a metric's labels and points can be called to learn the label names they
    give, without a profile."""

    def __getattr__(self, name: str) -> _Any:
        return _Any()

    def __getitem__(self, key: object) -> _Any:
        return _Any()

    def __iter__(self) -> Iterator[_Any]:
        return iter((_Any(),))

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 0

    def __int__(self) -> int:
        return 1

    def __float__(self) -> float:
        return 1.0

    def __truediv__(self, other: object) -> float:
        return 1.0

    def __str__(self) -> str:
        return "any"

    def items(self) -> list[tuple[str, int]]:
        """A mapping's items (percentiles, errors): one."""
        return [("p50", 1)]


def _labels(metric: Any) -> str:
    """A Prometheus family's labels, as docs/exporters.md says them: its subject's, then its
    points' (a summary's ``quantile`` said apart)."""
    names: list[str] = []
    try:
        pairs: list[tuple[str, str]] = []
        for entry in metric.subject.entries(_Any()):
            pairs += metric.subject.labels(entry)
            for _suffix, extra, _value in metric.points(entry):
                pairs += extra
    except Exception as e:
        raise RuntimeError(
            f"{metric.prometheus}: its labels could not be read with a stand-in entry "
            f"(docs/_ext/asyncflow_rows.py's _Any lacks what it uses: {e!r})"
        ) from e
    for name, _ in pairs:
        if name not in names:
            names.append(str(name))
    quantile = metric.type == "summary" and "quantile" in names
    said = ", ".join(f"`{n}`" for n in names if not (quantile and n == "quantile"))
    return said + " (+ `quantile`)" if quantile else said


def metric_rows(export: str) -> list[list[str]]:
    """docs/exporters.md's table of the Prometheus families (``prometheus``) or of the OTel
    instruments (``otel``), a row per metric of ``METRICS`` that has a name there, in order."""
    from asyncflow.render.metrics import METRICS

    if export == "prometheus":
        return [
            [f"`{m.prometheus}`", m.type, _labels(m), m.help]
            for m in METRICS
            if m.prometheus is not None
        ]
    if export == "otel":
        return [
            [f"`{m.otel}`", f"observable {m.kind}", f"`{m.unit}`", m.description]
            for m in METRICS
            if m.otel is not None
        ]
    raise ValueError(f"asyncflow-metrics: expected prometheus or otel, not {export!r}")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(header: tuple[str, ...], rows: list[list[str]], more: tuple[str, ...] = ()) -> list[str]:
    """A markdown table's lines: the header, the rows, then ``more`` lines as they are."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines + list(more)
