"""Reading the docs' markdown tables, for the tests that check them against the code."""

from __future__ import annotations


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
