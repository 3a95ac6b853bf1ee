"""``asyncflow run`` gives the program what ``python`` gives it, and its outputs can be captured.

Each test runs the command in a child process, as a user would, beside plain ``python`` where
the two must agree.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.support.commands import ASYNCFLOW, asyncflow_cmd, console_script, write

SHOW_MAIN = """\
import json, os, sys
import __main__

def where():
    pass

print(json.dumps({
    "file": __file__,
    "code": where.__code__.co_filename,
    "argv": sys.argv,
    "path0": sys.path[0],
    "name": __name__,
    "package": __package__,
    "spec": __spec__ and [__spec__.name, __spec__.origin],
    "loader": type(__loader__).__name__,
    "cached": globals().get("__cached__"),
    "main_is_me": __main__.__dict__ is globals(),
    "annotations_future": where.__code__.co_flags & 0x1000000 != 0,
}))
"""


def _plain_and_profiled(
    command: list[str], script: str, cwd: Path, *args: str
) -> tuple[object, object]:
    plain = subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, timeout=60, cwd=cwd
    )
    assert plain.returncode == 0, plain.stderr
    done = subprocess.run(
        [*command, "run", "--format", "none", script, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr
    return orjson.loads(done.stdout), orjson.loads(plain.stdout)


@pytest.mark.parametrize("launcher", ["console script", "python -m asyncflow"])
@pytest.mark.parametrize("given", ["relative", "through a symlink", "absolute"])
def test_run_gives_the_script_the_file_argv_and_path_python_does(
    tmp_path: Path, launcher: str, given: str
) -> None:
    real = write(tmp_path / "scripts" / "show.py", SHOW_MAIN)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    if given == "through a symlink":
        (cwd / "link.py").symlink_to(real)
        script = "link.py"
    else:
        script = str(real) if given == "absolute" else os.path.join("..", "scripts", "show.py")
    command = console_script(tmp_path) if launcher == "console script" else ASYNCFLOW
    profiled, plain = _plain_and_profiled(command, script, cwd, "x")
    assert profiled == plain
    assert isinstance(plain, dict) and os.path.isabs(plain["file"])  # what Python promises


def test_run_a_script_that_changes_directory_still_finds_its_data(tmp_path: Path) -> None:
    write(tmp_path / "app" / "data.txt", "found\n")
    write(
        tmp_path / "app" / "main.py",
        "import os\n"
        "here = os.path.dirname(__file__)\n"
        "os.chdir(os.sep)  # as a daemon does\n"
        "with open(os.path.join(here, 'data.txt')) as f:\n"
        "    print(f.read().strip())\n",
    )
    done = asyncflow_cmd("run", "--format", "none", os.path.join("app", "main.py"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "found\n"


def test_run_dash_m_gives_the_module_the_file_and_argv_python_dash_m_does(
    tmp_path: Path,
) -> None:
    project = write(tmp_path / "project" / "showmod.py", SHOW_MAIN).parent
    plain = subprocess.run(
        [sys.executable, "-m", "showmod", "a"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=project,
    )
    assert plain.returncode == 0, plain.stderr
    done = asyncflow_cmd("run", "--format", "none", "-m", "showmod", "a", cwd=project)
    assert done.returncode == 0, done.stderr
    profiled, expected = orjson.loads(done.stdout), orjson.loads(plain.stdout)
    assert profiled == expected


# -- the exit report on a stream: the document alone -------------------------------------------

QUIET = "import sys\nsys.stderr.write('the program says this on standard error\\n')\n"


def _start_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert lines[0].startswith("asyncflow: profiling 'quiet'; endpoint: "), stderr
    return "\n".join(lines[1:])


@pytest.mark.parametrize("format", ["json", "json-pretty"])
def test_run_writes_a_json_report_alone_on_standard_output(tmp_path: Path, format: str) -> None:
    write(tmp_path / "quiet.py", QUIET)
    done = asyncflow_cmd("run", "--format", format, "quiet.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout)["status"]["name"] == "quiet"  # the whole stream parses
    # standard error: asyncflow's start line and the program's own, nothing of the report
    assert _start_line(done.stderr) == "the program says this on standard error"


@pytest.mark.parametrize("how", ["--output -", "ASYNCFLOW_OUTPUT=-"])
@pytest.mark.parametrize("format", ["json", "table"])
def test_run_output_dash_is_standard_output(tmp_path: Path, how: str, format: str) -> None:
    write(tmp_path / "quiet.py", QUIET)
    flags = ["--output", "-"] if how == "--output -" else []
    env = {"ASYNCFLOW_OUTPUT": "-"} if how == "ASYNCFLOW_OUTPUT=-" else None
    done = asyncflow_cmd("run", "--format", format, *flags, "quiet.py", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "-").exists()
    assert _start_line(done.stderr) == "the program says this on standard error"
    if format == "json":
        assert orjson.loads(done.stdout)["status"]["name"] == "quiet"
    else:
        assert done.stdout.startswith("asyncflow · quiet · elapsed ")


def test_run_table_report_stays_on_standard_error(tmp_path: Path) -> None:
    write(tmp_path / "quiet.py", "print('the program output')\n")
    done = asyncflow_cmd("run", "quiet.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "the program output\n"
    assert _start_line(done.stderr).startswith("asyncflow · quiet · elapsed ")


def test_a_profile_s_output_dash_is_standard_output(tmp_path: Path) -> None:
    """The library's ``output="-"`` too; a directory that cannot be written is no matter."""
    script = write(
        tmp_path / "lib.py",
        "import asyncflow\n"
        "with asyncflow.profile('lib', format='json', output='-', port=None):\n"
        "    pass\n",
    )
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    readonly.chmod(0o555)
    try:
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=readonly
        )
    finally:
        readonly.chmod(0o755)
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout)["status"]["name"] == "lib"
    assert done.stderr == ""


def test_run_help_says_where_the_report_goes() -> None:
    done = asyncflow_cmd("run", "--help", env={"COLUMNS": "400"})  # no line is wrapped
    said = " ".join(done.stdout.split())
    assert "'-' for standard output" in said, said
    assert "[standard error for the table, standard output for json and json-pretty]" in said


# -- errors name the subcommand that failed, and what to do ------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["run", "--bogus", "x.py"],
            "unrecognized arguments: --bogus (see 'asyncflow run --help')",
        ),
        (["run", "--format", "yaml", "x.py"], "argument --format: invalid choice: 'yaml'"),
        (["top", "--bogus"], "unrecognized arguments: --bogus (see 'asyncflow top --help')"),
        (
            ["snapshot", "--bogus", "-o", "s.json"],
            "unrecognized arguments: --bogus (see 'asyncflow snapshot --help')",
        ),
    ],
)
def test_a_bad_flag_is_named_by_its_subcommand(
    capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    from asyncflow import cli

    assert cli.main(args) == cli.USAGE
    error = capsys.readouterr().err
    assert error.startswith(f"asyncflow {args[0]}: error: {says}"), error
    assert error.count("\n") == 1


def test_a_taken_port_is_an_error_of_run(tmp_path: Path) -> None:
    write(tmp_path / "x.py", "print('never runs')\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = asyncflow_cmd("run", "--port", str(port), "x.py", cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(
        f"asyncflow run: error: port {port} on 127.0.0.1 is already in use"
    )


@pytest.mark.parametrize("command", ["snapshot", "trace"])
def test_with_no_profiler_running_snapshot_says_so(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    """No URL, none registered, nothing at the default port: not 'Connection refused'."""
    from asyncflow import cli

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    monkeypatch.setattr(cli, "DEFAULT_URL", f"http://127.0.0.1:{port}")  # nothing listens there
    assert cli.main([command, "-o", str(tmp_path / "s.json")]) == cli.FAILED
    error = capsys.readouterr().err
    assert error == (
        f"asyncflow {command}: error: no profiler is running here ('asyncflow ps' lists none, "
        f"and nothing answers at http://127.0.0.1:{port}): start one, e.g. with "
        "'asyncflow run script.py', or give its URL\n"
    )
    # a URL given, where nothing answers: said as plainly
    assert cli.main([command, f"http://127.0.0.1:{port}", "-o", str(tmp_path / "s.json")]) == 1
    error = capsys.readouterr().err
    assert error == (
        f"asyncflow {command}: error: nothing answers at http://127.0.0.1:{port}: is the "
        "profiler running, with its endpoint there?\n"
    )
    assert not (tmp_path / "s.json").exists()


MANUAL = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


@pytest.mark.parametrize("flags", ["--block-threshold 0", "--host 0.0.0.0"])
def test_the_manual_quotes_run_s_errors_as_run_says_them(flags: str) -> None:
    lines = MANUAL.read_text(encoding="utf-8").splitlines()
    asked = f"$ asyncflow run {flags} examples/crawler.py"
    quoted = lines[lines.index(asked) + 1]
    done = asyncflow_cmd("run", *flags.split(), "examples/crawler.py", cwd=MANUAL.parent.parent)
    assert done.returncode == 2
    assert done.stderr == quoted + "\n"


def test_run_help_gives_the_block_threshold_s_range() -> None:
    done = asyncflow_cmd("run", "--help", env={"COLUMNS": "400"})
    assert "blocks the loop, from 0.001 to 3600 [0.1]" in done.stdout, done.stdout
