"""The front door: ``asyncflow.__all__`` is exactly what the package exports."""

from __future__ import annotations

import ast
from pathlib import Path

import asyncflow


def test_all_lists_every_public_reexport_and_nothing_else() -> None:
    source = Path(asyncflow.__file__).read_text()
    tree = ast.parse(source)
    reexported = {
        alias.asname
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.asname is not None
    }
    assert set(asyncflow.__all__) == reexported
    assert asyncflow.__all__ == sorted(asyncflow.__all__)
    for name in asyncflow.__all__:
        assert getattr(asyncflow, name) is not None


def test_version_matches_the_installed_distribution() -> None:
    from importlib.metadata import version

    assert asyncflow.__version__ == version("asyncflow")
