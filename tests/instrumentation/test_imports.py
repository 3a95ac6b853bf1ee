"""Hooks that run right after the program imports a module, which asyncflow never imports."""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from asyncflow.instrumentation import _imports


@pytest.fixture
def module_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on sys.path for modules written by the test; forgotten afterwards."""
    sys.path.insert(0, str(tmp_path))
    before = set(sys.modules)
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in set(sys.modules) - before:
            del sys.modules[name]


def test_a_hook_runs_right_after_the_programs_import_on_its_thread(module_dir: Path) -> None:
    (module_dir / "late_lib.py").write_text("VALUE = 1\nimport threading\n")
    seen: list[tuple[int, str]] = []

    def hook(module: Any) -> None:
        seen.append((module.VALUE, threading.current_thread().name))
        module.VALUE = 2  # adapted before the importer sees it

    _imports.after_import("late_lib", hook)
    assert "late_lib" not in sys.modules  # asking imports nothing
    assert _imports.waiting() == {"late_lib": 1} and sys.meta_path[0] is _imports._watch

    def importer() -> None:
        late_lib = importlib.import_module("late_lib")
        seen.append((late_lib.VALUE, "importer saw"))

    thread = threading.Thread(target=importer, name="importer")
    thread.start()
    thread.join()
    assert seen == [(1, "importer"), (2, "importer saw")]
    assert _imports.waiting() == {} and _imports._watch not in sys.meta_path


def test_a_module_imported_already_is_adapted_at_once(module_dir: Path) -> None:
    (module_dir / "early_lib.py").write_text("VALUE = 1\n")
    early_lib = importlib.import_module("early_lib")

    seen: list[ModuleType] = []
    cancel = _imports.after_import("early_lib", seen.append)
    assert seen == [early_lib] and _imports.waiting() == {}
    cancel()  # nothing left to cancel


def test_a_cancelled_hook_never_runs_and_the_finder_leaves(module_dir: Path) -> None:
    (module_dir / "unused_lib.py").write_text("VALUE = 1\n")
    seen: list[ModuleType] = []
    cancel = _imports.after_import("unused_lib", seen.append)
    kept = _imports.after_import("unused_lib", lambda m: seen.append(m))
    cancel()
    cancel()  # idempotent
    assert _imports.waiting() == {"unused_lib": 1}
    kept()
    assert _imports.waiting() == {} and _imports._watch not in sys.meta_path
    unused_lib = importlib.import_module("unused_lib")

    assert unused_lib.VALUE == 1 and seen == []


def test_a_hook_that_raises_is_logged_and_the_import_goes_on(
    module_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (module_dir / "fragile_lib.py").write_text("VALUE = 1\n")
    seen: list[ModuleType] = []

    def broken(module: ModuleType) -> None:
        raise RuntimeError("adapter bug")

    _imports.after_import("fragile_lib", broken)
    _imports.after_import("fragile_lib", seen.append)  # the next hook still runs
    with caplog.at_level(logging.ERROR, logger="asyncflow"):
        fragile_lib = importlib.import_module("fragile_lib")

    assert fragile_lib.VALUE == 1 and seen == [fragile_lib]
    assert "adapting fragile_lib after its import" in caplog.text
    assert "adapter bug" in caplog.text


def test_a_module_that_fails_to_import_fails_as_it_would(module_dir: Path) -> None:
    (module_dir / "broken_lib.py").write_text("raise ImportError('its own')\n")
    seen: list[ModuleType] = []
    cancel = _imports.after_import("broken_lib", seen.append)
    with pytest.raises(ImportError, match="its own"):
        importlib.import_module("broken_lib")
    assert seen == []
    cancel()
    assert _imports._watch not in sys.meta_path
