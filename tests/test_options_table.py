"""The one options table (``config.OPTIONS``): the variables ``resolve_options()`` reads, the
flags of ``asyncflow run`` and docs/profiler.md's options table all come from it, so that a new
option is one row (and its ``Options`` field) instead of six edits that drift (issue 25)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from asyncflow import cli, config
from asyncflow.config import OPTIONS, Options
from tests.markdown import table

_DOCS = Path(__file__).parent.parent / "docs"


def _row(option: config.Option) -> list[str]:
    """The option's row of docs/profiler.md's table, as the table should say it."""
    if option.env is None:
        variable = "(none: given in code)"
    else:
        variable = f"`{option.env}`" + (f" (`{option.example}`)" if option.example else "")
    return [f"`{option.name}`", variable, option.default, option.help]


def test_the_docs_options_table_is_the_optionstable() -> None:
    rows = table((_DOCS / "profiler.md").read_text(encoding="utf-8"), "option")
    listed = [row for row in rows if row[0]]  # the rows after them are variables, not options
    declared = [_row(option) for option in OPTIONS]
    wanted = "\n".join("| " + " | ".join(row) + " |" for row in declared)
    assert listed == declared, f"docs/profiler.md's options table should begin:\n{wanted}"


def _run_parser() -> argparse.ArgumentParser:
    parser = cli._parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    run: argparse.ArgumentParser = commands.choices["run"]
    return run


def test_run_has_the_flag_of_each_option_with_its_help() -> None:
    actions = {a.dest: a for a in _run_parser()._actions}
    for option in OPTIONS:
        if option.flag is None:
            assert option.name not in actions, option.name
            continue
        assert option.flag == "--" + option.name.replace("_", "-")
        action = actions[option.name]
        assert action.option_strings == [option.flag]
        assert action.help == option.flag_help and option.flag_help.strip()
        assert action.metavar == option.metavar
        cli_md = (_DOCS / "cli.md").read_text(encoding="utf-8")
        assert f"`{option.flag}" in cli_md, f"docs/cli.md's run options should name {option.flag}"


def test_each_option_is_a_field_of_options_and_has_its_own_variable() -> None:
    names = [option.name for option in OPTIONS]
    assert len(set(names)) == len(names)
    fields = {field.name for field in dataclasses.fields(Options)}
    set_by_options = {f for option in OPTIONS for f in option.fields or (option.name,)}
    assert set_by_options <= fields
    # every field but the name and who chose the port is an option's
    assert fields - set_by_options == {"name", "port_source"}
    for option in OPTIONS:
        assert option.env in (None, "ASYNCFLOW_" + option.name.upper()), option.name
        assert option.kind in ("value", "switch", "append"), option.name
        assert option.flag is None or option.env is not None, "a flag's option has a variable"
