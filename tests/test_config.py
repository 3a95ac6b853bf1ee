"""Options: explicit argument, then ASYNCFLOW_* variable, then default; bad values are refused."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from asyncflow.config import Options, check_type, disabled, resolve_options


def test_defaults() -> None:
    o = resolve_options("svc", {}, environ={})
    assert o == Options(name="svc")
    assert o.percentiles == (50.0, 95.0, 99.0)
    assert (o.limit, o.format, o.output, o.recent_logs, o.duration) == (15, "table", None, 50, None)


def test_environment_then_argument_precedence(tmp_path: Path) -> None:
    env = {
        "ASYNCFLOW_PERCENTILES": "90, 50",
        "ASYNCFLOW_LIMIT": "3",
        "ASYNCFLOW_FORMAT": "json",
        "ASYNCFLOW_OUTPUT": str(tmp_path / "r.json"),
        "ASYNCFLOW_RECENT_LOGS": "7",
        "ASYNCFLOW_DURATION": "2.5",
    }
    o = resolve_options("svc", {}, environ=env)
    assert o.percentiles == (50.0, 90.0)
    assert (o.limit, o.format, o.recent_logs, o.duration) == (3, "json", 7, 2.5)
    assert o.output == str(tmp_path / "r.json")
    o = resolve_options("svc", {"limit": 0, "format": "table"}, environ=env)
    assert (o.limit, o.format) == (0, "table")


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("percentiles", [0], "outside (0, 100]"),
        ("percentiles", [101], "outside (0, 100]"),
        ("percentiles", "fifty", "numbers in (0, 100]"),
        ("percentiles", [], "at least one"),
        ("percentiles", ["50"], "numbers in (0, 100]"),
        ("limit", -1, "whole number >= 0"),
        ("limit", 2.5, "whole number >= 0"),
        ("limit", True, "whole number >= 0"),
        ("format", "xml", "table, json, json-pretty, none"),
        ("recent_logs", -5, "whole number from 0"),
        ("duration", 0, "number > 0"),
        ("duration", "soon", "number > 0"),
        ("duration", float("inf"), "finite"),
        ("output", "/no/such/dir/report.txt", "does not exist"),
        ("output", 42, "file path, '-' for standard output"),
        ("reporter", object(), "report(snapshot)"),
    ],
)
def test_bad_values_name_the_option_and_what_is_accepted(
    option: str, value: Any, words: str
) -> None:
    with pytest.raises(ValueError, match=option) as info:
        resolve_options("svc", {option: value}, environ={})
    assert words in str(info.value)


def test_bad_environment_value_names_the_variable() -> None:
    with pytest.raises(ValueError, match="ASYNCFLOW_LIMIT='many'"):
        resolve_options("svc", {}, environ={"ASYNCFLOW_LIMIT": "many"})


def test_output_that_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is a directory"):
        resolve_options("svc", {"output": tmp_path}, environ={})


def test_unknown_option_and_bad_name() -> None:
    with pytest.raises(TypeError, match=r"unknown asyncflow option.*colour"):
        resolve_options("svc", {"colour": "red"}, environ={})
    with pytest.raises(ValueError, match="name"):
        resolve_options("", {}, environ={})


@pytest.mark.parametrize(("value", "expected"), [("", False), ("0", False), ("1", True)])
def test_disable_variable(value: str, expected: bool) -> None:
    assert disabled({"ASYNCFLOW_DISABLE": value}) is expected


def test_endpoint_options_from_arguments_and_environment() -> None:
    options = resolve_options("svc", {}, {})
    assert (options.host, options.port, options.token) == ("127.0.0.1", 6780, None)
    assert options.block_threshold == 0.1
    env = {
        "ASYNCFLOW_HOST": "::1",
        "ASYNCFLOW_PORT": "0",
        "ASYNCFLOW_TOKEN": "t0ken",
        "ASYNCFLOW_BLOCK_THRESHOLD": "0.25",
    }
    options = resolve_options("svc", {}, env)
    assert (options.host, options.port, options.token) == ("::1", 0, "t0ken")
    assert options.block_threshold == 0.25
    options = resolve_options("svc", {"port": 7000, "block_threshold": 1}, env)
    assert options.port == 7000 and options.block_threshold == 1.0
    assert resolve_options("svc", {"port": None}, env).port is None  # no endpoint at all
    assert resolve_options("svc", {}, {"ASYNCFLOW_PORT": "off"}).port is None


def test_sampling_is_adaptive_unless_a_fixed_interval_is_asked_for() -> None:
    assert resolve_options("svc", {}, {}).sampling == 0  # 0: adaptive
    assert resolve_options("svc", {}, {"ASYNCFLOW_SAMPLING": "16"}).sampling == 16
    assert resolve_options("svc", {"sampling": "auto"}, {"ASYNCFLOW_SAMPLING": "16"}).sampling == 0
    assert resolve_options("svc", {"sampling": 1}, {}).sampling == 1


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("port", 70000, "port=70000: expected a port from 0 to 65535"),
        ("port", "http", "port='http': expected a port"),
        ("host", "", "host='': expected a host name"),
        ("host", "a b", "host='a b'"),
        ("token", "has space", "token: expected a non-empty token without spaces"),
        ("block_threshold", 0, "block_threshold=0: expected seconds"),
        ("block_threshold", "soon", "block_threshold='soon': expected seconds"),
        ("sampling", 0, "sampling=0: expected 'auto', or a whole number from 1 to 65536"),
        ("sampling", "often", "sampling='often': expected 'auto'"),
        ("sampling", 1.5, "sampling=1.5: expected 'auto'"),
    ],
)
def test_bad_endpoint_options(option: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        resolve_options("svc", {option: value}, {})


def test_instrumentation_options_are_type_checked_with_the_call_named() -> None:
    check_type("stream", "log_items", False, bool)
    check_type("stream", "name", None, str, optional=True)
    with pytest.raises(
        TypeError, match=re.escape("asyncflow.stream(log_items=...) must be a bool, got 1")
    ):
        check_type("stream", "log_items", 1, bool)
    with pytest.raises(
        TypeError, match=re.escape("asyncflow.future(name=...) must be a str, got None")
    ):
        check_type("future", "name", None, str)


_UNBOUNDED = [
    # numbers that pass "> 0" but overflow, or are not numbers at all, once used
    ("block_threshold", 1e300, "from 0.001 to 3600"),
    ("block_threshold", 10**400, "from 0.001 to 3600"),
    ("block_threshold", float("nan"), "from 0.001 to 3600"),
    ("block_threshold", float("inf"), "from 0.001 to 3600"),
    ("block_threshold", "1e300", "from 0.001 to 3600"),
    ("block_threshold", 1e-300, "from 0.001 to 3600"),
    ("block_threshold", -1, "from 0.001 to 3600"),
    ("duration", 1e300, "at most 31536000"),
    ("duration", 10**400, "at most 31536000"),
    ("duration", float("nan"), "number > 0"),
    ("duration", "nan", "number > 0"),
    ("percentiles", [10**400], "outside (0, 100]"),
    ("percentiles", [float("nan")], "outside (0, 100]"),
    ("percentiles", [float("inf")], "outside (0, 100]"),
    ("percentiles", "50,1e400", "outside (0, 100]"),
    ("percentiles", list(range(1, 41)), "at most 32"),
    ("limit", 10**400, "whole number >= 0"),
    ("limit", "9" * 5000, "whole number >= 0"),
    ("recent_logs", 10**20, "whole number from 0"),
    ("sampling", 10**20, "whole number from 1"),
    ("port", -1, "a port from 0 to 65535"),
    ("port", 10**20, "a port from 0 to 65535"),
    ("port", 80.0, "a port from 0 to 65535"),
    ("host", "local\x00host", "host name or IP address"),
    ("host", "h" * 300, "host name or IP address"),
    ("token", "sec\x00ret", "printable ASCII"),
    ("token", "sécret", "printable ASCII"),
    ("output", "report\x00.txt", "NUL"),
    ("output", "x" * 300 + ".txt", "too long"),
    ("output", b"report.txt", "file path"),
]


@pytest.mark.parametrize(
    ("option", "value", "words"),
    _UNBOUNDED,
    ids=[f"{option}={str(value)[:12]!r}" for option, value, _ in _UNBOUNDED],
)
def test_every_option_is_bounded_before_anything_starts(
    option: str, value: Any, words: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # relative report paths land here
    with pytest.raises(ValueError, match=option) as info:
        resolve_options("svc", {option: value}, environ={})
    assert words in str(info.value)


def test_output_in_a_directory_that_cannot_be_written(tmp_path: Path) -> None:
    import os

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root writes anywhere: nothing to refuse
            pytest.skip("running as a user who can write anywhere")
        with pytest.raises(ValueError, match="cannot be written"):
            resolve_options("svc", {"output": str(locked / "r.txt")}, environ={})
    finally:
        locked.chmod(0o700)


def test_bounds_accept_their_edges() -> None:
    o = resolve_options(
        "svc",
        {"block_threshold": 3600, "duration": 31_536_000, "percentiles": [0.001, 100]},
        environ={},
    )
    assert (o.block_threshold, o.duration, o.percentiles) == (3600.0, 31_536_000.0, (0.001, 100.0))
    assert resolve_options("svc", {"block_threshold": "0.001"}, environ={}).block_threshold == 0.001


def test_where_the_port_came_from() -> None:
    assert resolve_options("svc", {}, environ={}).port_source is None  # the default
    assert resolve_options("svc", {"port": 7000}, environ={}).port_source == "port"
    env = {"ASYNCFLOW_PORT": "7001"}
    assert resolve_options("svc", {}, environ=env).port_source == "ASYNCFLOW_PORT"
    assert resolve_options("svc", {"port": 7000}, environ=env).port_source == "port"


def _a_value_of_each_variable(tmp_path: Path) -> dict[str, str]:
    """For every ``ASYNCFLOW_*`` option, its variable set to a value that is not the default."""
    return {
        "percentiles": "90",
        "limit": "3",
        "format": "json",
        "output": str(tmp_path / "r.json"),
        "recent_logs": "7",
        "duration": "2.5",
        "host": "127.0.0.2",
        "port": "7001",
        "token": "sekrit",
        "block_threshold": "0.5",
        "block_min": "0.05",
        "trace": "1",
        "trace_events": "10",
        "sampling": "4",
        "allowed_hosts": "myhost",
        "warn": "long_poll=0.05",
        "otel": "1",
        "metric_ids": "1",
        "include": "myapp.*",
        "exclude": "worker",
        "no_own_code": "1",
        "no_routes": "1",
        "cpu": "1",
        "allocations": "1",
        "no_children": "1",
        "record": str(tmp_path / "r.afrec"),
        "record_budget": "2",
    }


def test_an_explicit_none_is_the_default_whatever_the_environment_says(tmp_path: Path) -> None:
    # None given for an option is an explicit argument, so it wins over the variable, as every
    # argument does; it means the option's default (port=None: no endpoint at all). Once only
    # port=None did; every other None fell through to the variable.
    from asyncflow import config

    values = _a_value_of_each_variable(tmp_path)
    assert set(values) == set(config._ENV), "every option with a variable is tried"
    default = resolve_options("svc", {}, environ={})
    took_the_variable = []
    for option, value in values.items():
        env = {config._ENV[option]: value}
        assert resolve_options("svc", {}, environ=env) != default, f"{option}: no effect"
        got = resolve_options("svc", {option: None}, environ=env)
        expected = dataclasses.replace(default, port=None) if option == "port" else default
        if got != expected:
            took_the_variable.append(option)
    assert took_the_variable == []


@pytest.mark.parametrize("option", ["reporter", "reporters"])
def test_none_for_an_option_without_a_variable_is_its_default(option: str) -> None:
    assert resolve_options("svc", {option: None}, environ={}) == Options(name="svc")
