"""The one options table (``config.OPTIONS``): the variables ``resolve_options()`` reads, the
flags of ``asyncflow run`` and docs/profiler.md's options table (rendered at build time by the
``asyncflow-options`` directive, docs/_ext) all come from it, so that a new option is one row
(and its ``Options`` field) instead of six edits that drift (issue 25)."""

from __future__ import annotations

import argparse
import dataclasses

from asyncflow import cli, config
from asyncflow.config import OPTIONS, Options
from tests.support.markdown import DOCS as _DOCS
from tests.support.markdown import directives, extension, table


def _row(option: config.Option) -> list[str]:
    """The option's row of docs/profiler.md's table, as the table should say it."""
    if option.env is None:
        variable = "(none: given in code)"
    else:
        variable = f"`{option.env}`" + (f" (`{option.example}`)" if option.example else "")
    return [f"`{option.name}`", variable, option.default, option.help]


def test_the_rendered_options_table_is_the_options_table() -> None:
    rows = extension("asyncflow_rows")
    assert rows.option_rows() == [_row(option) for option in OPTIONS]
    assert rows.OPTIONS_HEADER == ("option", "variable", "default", "meaning")


def test_profiler_md_renders_the_options_table_and_lists_no_option_by_hand() -> None:
    text = (_DOCS / "profiler.md").read_text(encoding="utf-8")
    ((argument, extra),) = directives(text, "asyncflow-options")
    assert argument == ""
    # what follows the options are variables that are no option's, with an empty first cell
    variables = {option.env for option in OPTIONS if option.env is not None}
    assert extra, "ASYNCFLOW_DISABLE and the other variables follow the options"
    for row in table("| option | - |\n| - |\n" + "\n".join(extra), "option"):
        assert row[0] == "" and row[1].strip("`") not in variables, row
    assert not any(line.startswith("| option |") for line in text.splitlines())
    pasted = [o.name for o in OPTIONS if f"| `{o.name}` |" in text]
    assert pasted == [], "the options table is rendered from config.OPTIONS: remove these rows"


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
