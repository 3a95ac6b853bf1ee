"""Reading the docs' markdown, for the tests that check it against the code: its tables, the
directives that render the code's tables into it, and the manual's own extensions."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

DOCS = Path(__file__).resolve().parent.parent.parent / "docs"


def table(text: str, header: str) -> list[list[str]]:
    """The rows of the markdown table whose header row starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header} |"))
    rows: list[list[str]] = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def directives(text: str, name: str) -> list[tuple[str, list[str]]]:
    """Every ```{name} directive of a MyST page: its argument and its content's lines."""
    found = re.findall(
        rf"^```\{{{re.escape(name)}\}}[ \t]*(.*?)\n(.*?)^```[ \t]*$", text, re.M | re.S
    )
    return [(argument.strip(), content.splitlines()) for argument, content in found]


def extension(name: str) -> ModuleType:
    """A module of docs/_ext (the manual's own extensions), imported from its file."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, DOCS / "_ext" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
