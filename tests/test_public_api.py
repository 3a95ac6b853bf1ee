"""The front door: ``asyncflow.__all__`` is exactly what the package exports."""

from __future__ import annotations

import ast
import pkgutil
import types
from pathlib import Path

import pytest

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
    # Lazy names: re-exported for type checkers under TYPE_CHECKING, imported on first use.
    typed = {
        alias.asname
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for inner in node.body
        if isinstance(inner, ast.ImportFrom)
        for alias in inner.names
        if alias.asname is not None
    }
    assert typed == set(asyncflow._LAZY)
    assert set(asyncflow.__all__) == reexported | typed
    assert set(asyncflow.__all__) <= set(dir(asyncflow))
    assert asyncflow.__all__ == sorted(asyncflow.__all__)
    for name in asyncflow.__all__:
        assert getattr(asyncflow, name) is not None


def test_version_matches_the_installed_distribution() -> None:
    from importlib.metadata import version

    assert asyncflow.__version__ == version("asyncflow-profiler")  # the distribution's name


def test_lazy_names_are_the_very_objects_of_their_modules() -> None:
    from asyncflow import schema

    assert asyncflow.Snapshot is schema.Snapshot
    with pytest.raises(AttributeError, match="no attribute 'Snapshott'"):
        asyncflow.Snapshott  # noqa: B018


def test_no_public_name_shadows_a_module_of_the_package() -> None:
    # `import asyncflow.X as m` binds the package's attribute X, so a public name X beside a module
    # X gives the name, not the module (`asyncflow.instrument` was the function, not the hot path)
    modules = {
        info.name for info in pkgutil.iter_modules(asyncflow.__path__) if info.name != "__main__"
    }
    assert not modules & set(asyncflow.__all__)
    for name in sorted(modules):
        namespace: dict[str, object] = {}
        exec(f"import asyncflow.{name} as m", namespace)
        assert isinstance(namespace["m"], types.ModuleType), name
