"""The hints that say what to install name what is missing and work in a checkout.

The distribution is not on the package index under any name asyncflow could give (the name
``asyncflow`` there is another project's), so a hint names an extra of this checkout's
``pyproject.toml``, or the missing package itself.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

from asyncflow import cli
from asyncflow.errors import AsyncflowError
from asyncflow.render import otel

PYPROJECT = tomllib.loads(
    (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text(encoding="utf-8")
)
EXTRAS: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0] for requirement in requirements}


def check_hint(message: str, extra: str, package: str) -> None:
    """``message`` says ``pip install '.[extra]'`` in a checkout, or ``pip install package``,
    and both would install ``package``."""
    assert f"pip install '.[{extra}]' in asyncflow's checkout" in message, message
    assert package in _requirement_names(EXTRAS[extra])
    assert f"pip install '{package}" in message or f"pip install {package}" in message, message
    assert "asyncflow-profiler[" not in message  # no index has it under that name
    assert "asyncflow[" not in message  # the index's asyncflow is another project


def test_the_otel_hint_names_this_checkout_s_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(otel, "_INSTALLED", False)
    with pytest.raises(AsyncflowError) as caught:
        otel.OtelReporter()
    check_hint(str(caught.value), "otel", "opentelemetry-sdk")


@pytest.mark.parametrize("missing", [("textual", "rich"), ("textual",), ("rich",)])
def test_the_top_hint_names_textual_whatever_import_failed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], missing: tuple[str, ...]
) -> None:
    """Without the ``top`` extra, importing the view fails on rich (textual's dependency,
    imported first) or on textual: either way the user is to install textual."""
    monkeypatch.delitem(sys.modules, "asyncflow.render.top", raising=False)
    for name in list(sys.modules):
        if name.split(".")[0] in missing:
            monkeypatch.delitem(sys.modules, name)
    for name in missing:
        monkeypatch.setitem(sys.modules, name, None)  # import name: ModuleNotFoundError
    assert cli.main(["top", "http://127.0.0.1:9"]) == cli.FAILED
    error = capsys.readouterr().err
    assert ": error: the live view needs textual, which is not installed: " in error, error
    assert "rich" not in error
    assert error.count("\n") == 1
    check_hint(error, "top", "textual")
