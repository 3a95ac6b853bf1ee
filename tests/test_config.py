"""Options: explicit argument, then ASYNCFLOW_* variable, then default; bad values are refused."""

from __future__ import annotations

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
        ("output", 42, "file path"),
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
