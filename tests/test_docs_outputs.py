"""The manual's runnable examples print what the manual shows, numbers aside.

A Python block marked ``<!-- docs:output -->`` in docs/*.md is run as a program of its own, and
what it prints is compared, line by line, with the plain block that follows it: every number
(a duration, a count) may differ from run to run, every word and the order of the lines may not.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MARKED = re.compile(r"<!-- docs:output -->\n```python\n(.*?)^```\n\n```\n(.*?)^```", re.S | re.M)


def examples() -> list[tuple[str, str, str]]:
    """(page:line, the program, the output shown) of every marked example."""
    found = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for m in MARKED.finditer(text):
            line = text.count("\n", 0, m.start()) + 2
            found.append((f"{page.name}:{line}", m.group(1), m.group(2)))
    return found


def masked(text: str) -> list[str]:
    return [re.sub(r"\d[\d,.]*", "N", line).rstrip() for line in text.strip().splitlines()]


def test_numbers_are_masked_and_words_kept() -> None:
    assert masked("read: 3,186 ns (self 1.5 ns)\n") == ["read: N ns (self N ns)"]
    assert masked("fetch: raised KeyError after 10.7 ms") != masked("fetch: returned after 1 ms")


def test_the_manual_marks_its_runnable_examples() -> None:
    assert len(examples()) >= 2


@pytest.mark.parametrize(("where", "code", "shown"), examples(), ids=[e[0] for e in examples()])
def test_a_runnable_example_prints_what_the_manual_shows(where: str, code: str, shown: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCFLOW_")}
    env["ASYNCFLOW_PORT"] = "0"  # a profiler the example starts serves on a free port
    if os.environ.get("ASYNCFLOW_NO_EXTENSIONS"):  # (the hot path the suite runs on)
        env["ASYNCFLOW_NO_EXTENSIONS"] = os.environ["ASYNCFLOW_NO_EXTENSIONS"]
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, f"{where}: {done.stderr}"
    assert masked(done.stdout) == masked(shown), where
