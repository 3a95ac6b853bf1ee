"""The ``asyncflow`` command: ``run`` in a child process as a user would; snapshot; report."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

import asyncflow
from asyncflow import cli, schema
from tests.test_server import workload

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def asyncflow_cmd(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m asyncflow ARGS`` (the ``asyncflow`` script calls the same main())."""
    return subprocess.run(
        [sys.executable, "-m", "asyncflow", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_run_a_script_with_its_arguments_and_every_task_tracked(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    done = asyncflow_cmd(
        "run", "--format", "json", "--output", str(report), str(EXAMPLES / "crawler.py"),
        "--workers", "4",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("asyncflow: profiling 'crawler'; endpoint: http://127.0.0.1:")
    assert "crawled 92 pages, 24 timed out, 1 malformed" in done.stdout  # as without asyncflow
    document = orjson.loads(report.read_bytes())
    futures = {f["label"]: f for f in document["futures"]["futures"]}
    assert {"fetch", "parse", "crawl_one", "worker", "main"} <= set(futures)
    assert futures["main"]["tracked_by"] == "task"  # asyncio.run's main task, tracked
    assert not any(label.startswith("BaseEventLoop.") for label in futures)  # asyncio's own


@pytest.mark.parametrize("example", ["memory_stream.py", "blocked_loop.py", "pipeline.py"])
def test_run_every_other_example(example: str) -> None:
    done = asyncflow_cmd("run", str(EXAMPLES / example))
    assert done.returncode == 0, done.stderr
    name = Path(example).stem
    assert done.stderr.startswith(f"asyncflow: profiling {name!r}; endpoint: http://")
    assert done.stderr.count(" · elapsed ") == 1  # one report, the host's
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


PROGRAM = """
import asyncio, sys

async def work(q):
    await q.put(len(sys.argv))
    return await q.get()

async def main():
    q = asyncio.Queue()
    return await asyncio.create_task(work(q))

print("argv", sys.argv[1:], __name__)
print(asyncio.run(main()))
with asyncio.Runner() as runner:
    print(runner.run(main()))
loop = asyncio.new_event_loop()
print(loop.run_until_complete(main()))
loop.close()
"""


def test_run_a_package_with_dash_m_on_every_loop(tmp_path: Path) -> None:
    write(tmp_path / "app" / "__init__.py", "")
    main = write(tmp_path / "app" / "__main__.py", PROGRAM)
    report = tmp_path / "report.json"
    done = asyncflow_cmd(
        "run", "--format", "json", "--output", str(report), "-m", "app", "a", "--b",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["argv ['a', '--b'] __main__", "3", "3", "3"]
    document = orjson.loads(report.read_bytes())
    futures = {f["label"]: f for f in document["futures"]["futures"]}
    assert futures["work"]["call_count"] == 3  # tracked on all three loops
    assert futures["main"]["call_count"] == 3
    assert document["status"]["name"] == "app"
    line = PROGRAM.splitlines().index("    q = asyncio.Queue()") + 1
    made_there = [
        c for c in document["channels"]["channels"] if c["label"] == f"{main.name}:{line}"
    ]
    assert [c["sent_count"] for c in made_there] == [1, 1, 1]  # one queue per run of main()


def test_run_no_queues_leaves_queues_alone(tmp_path: Path) -> None:
    script = write(tmp_path / "prog.py", PROGRAM)
    report = tmp_path / "report.json"
    done = asyncflow_cmd(
        "run", "--no-queues", "--format", "json", "--output", str(report), str(script)
    )
    assert done.returncode == 0, done.stderr
    assert orjson.loads(report.read_bytes())["channels"]["channels"] == []


def test_a_program_that_raises_exits_1_with_its_own_traceback_and_a_report(
    tmp_path: Path,
) -> None:
    script = write(
        tmp_path / "boom.py",
        "import asyncio\n\nasync def main():\n    raise ValueError('boom')\n\n"
        "asyncio.run(main())\n",
    )
    done = asyncflow_cmd("run", str(script))
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert 'boom.py", line 4, in main' in done.stderr and "ValueError: boom" in done.stderr
    assert "asyncflow/cli.py" not in done.stderr and "runpy" not in done.stderr
    assert "asyncflow · boom · elapsed" in done.stderr  # the report, still


def test_sys_exit_code_is_the_programs(tmp_path: Path) -> None:
    script = write(tmp_path / "three.py", "import sys\nprint('bye')\nsys.exit(3)\n")
    done = asyncflow_cmd("run", str(script))
    assert (done.returncode, done.stdout) == (3, "bye\n")
    assert "asyncflow · three · elapsed" in done.stderr
    script = write(tmp_path / "text.py", "import sys\nsys.exit('went wrong')\n")
    done = asyncflow_cmd("run", str(script))
    assert done.returncode == 1 and "went wrong" in done.stderr


def test_a_program_that_profiles_itself_joins_the_run(tmp_path: Path) -> None:
    done = asyncflow_cmd("run", str(EXAMPLES / "pipeline.py"), "--pages", "20")
    assert done.returncode == 0, done.stderr
    assert "already running" not in done.stderr
    assert done.stderr.count("asyncflow · pipeline · elapsed") == 1  # one report, not two
    assert "\nraw pages " in done.stderr  # the program's own queue names win


def test_a_program_that_stops_the_profiler_does_not_end_the_run(tmp_path: Path) -> None:
    script = write(
        tmp_path / "stopper.py",
        "import asyncio, asyncflow\n\n"
        "async def before():\n    await asyncio.sleep(0)\n\n"
        "async def after():\n    await asyncio.sleep(0)\n\n"
        "asyncflow.start('mine')\nasyncio.run(before())\n"
        "print(asyncflow.stop() is not None)\nasyncio.run(after())\n",
    )
    report = tmp_path / "report.json"
    done = asyncflow_cmd("run", "--format", "json", "--output", str(report), str(script))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "True\n"
    labels = {f["label"] for f in orjson.loads(report.read_bytes())["futures"]["futures"]}
    assert {"before", "after"} <= labels  # still profiling after the program's stop()


def test_ctrl_c_still_reports(tmp_path: Path) -> None:
    script = write(
        tmp_path / "forever.py",
        "import asyncio\n\nasync def main():\n    print('ready', flush=True)\n"
        "    await asyncio.Event().wait()\n\nasyncio.run(main())\n",
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "asyncflow", "run", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "ready\n"
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130
    assert "KeyboardInterrupt" in err and "asyncflow · forever · elapsed" in err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["run", "missing.py"], "no such file: 'missing.py'"),
        (["run", "-m", "no_such_module_here"], "no module named 'no_such_module_here'"),
        (["run"], "give a script to run"),
        (["run", "--port", "http", "x.py"], "port='http': expected a port"),
        (["run", "--limit", "-3", "x.py"], "limit=-3: expected a whole number"),
        (["run", "--format", "xml", "x.py"], "invalid choice: 'xml'"),
        (["run", "--sampling", "0", "x.py"], "sampling=0: expected 'auto', or a whole number"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["report", "nothing.json"], "cannot read 'nothing.json'"),
        (["snapshot", "localhost:6780", "-o", "s.json"], "'localhost:6780' is not an endpoint URL"),
        (["top", "127.0.0.1:6780"], "'127.0.0.1:6780' is not an endpoint URL"),
        (["snapshot"], "the following arguments are required: -o/--output"),
    ],
)
def test_mistakes_get_one_line_and_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    write(tmp_path / "x.py", "print('never runs')\n")
    done = asyncflow_cmd(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith("asyncflow") and says in lines[0]


def test_a_busy_port_is_one_line_and_exit_1(tmp_path: Path) -> None:
    script = write(tmp_path / "x.py", "print('never runs')\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = asyncflow_cmd("run", "--port", str(port), str(script))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip() == (
        f"asyncflow: error: port {port} on 127.0.0.1 is already in use; pass port= another "
        "port (or port=0 for any free one), or set ASYNCFLOW_PORT"
    )


def test_help_lists_every_option_with_its_default() -> None:
    done = asyncflow_cmd("run", "--help")
    assert done.returncode == 0
    for option in ("--name", "--port", "--host", "--format", "--output", "--limit"):
        assert option in done.stdout
    for option in ("--percentiles", "--duration", "--sampling", "--no-queues", "-m MODULE"):
        assert option in done.stdout
    assert "[6780]" in done.stdout and "[127.0.0.1]" in done.stdout
    for command in ("top", "snapshot", "report"):
        done = asyncflow_cmd(command, "--help")
        assert done.returncode == 0 and "usage: asyncflow " + command in done.stdout
    assert "http://127.0.0.1:6780" in asyncflow_cmd("top", "--help").stdout


def test_snapshot_then_report_reads_a_production_profile_later(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "snap.json"
    with asyncflow.profile("prod", format="none", port=0, token="tok") as prof:
        asyncio.run(workload())
        assert prof.url is not None
        assert cli.main(["snapshot", prof.url, "-o", str(saved), "--token", "tok"]) == 0
        assert cli.main(["snapshot", prof.url, "-o", str(saved) + ".x"]) == 1  # no token
    err = capsys.readouterr().err
    assert "saved" in err and "answered 401: the bearer token is missing" in err
    snapshot = schema.load(schema.Snapshot, orjson.loads(saved.read_bytes()))
    assert snapshot.status.name == "prod"
    assert cli.main(["report", str(saved), "--limit", "0"]) == 0
    table = capsys.readouterr().out
    assert table.startswith("asyncflow · prod · elapsed")
    assert "\nproduce " in table and "\nwork " in table and "\nnumbers " in table


def test_report_reads_a_json_exit_report_and_refuses_other_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exit_report = tmp_path / "exit.json"
    with asyncflow.profile("exited", format="json", output=str(exit_report), port=0):
        asyncio.run(workload())
    assert cli.main(["report", str(exit_report), "--percentiles", "90"]) == 0
    out = capsys.readouterr().out
    assert "p90 poll" in out and "\nconsume " in out

    not_json = write(tmp_path / "bad.json", "{not json")
    wrong = write(tmp_path / "wrong.json", '{"schema": 1, "futures": 3}')
    newer = write(tmp_path / "newer.json", '{"schema": 99}')
    for path, says in (
        (not_json, "is not JSON"),
        (wrong, "is not an asyncflow snapshot: Snapshot"),
        (newer, "has schema 99; this asyncflow reads schema 1"),
    ):
        assert cli.main(["report", str(path)]) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1


def test_snapshot_of_an_unreachable_endpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert cli.main(["snapshot", f"http://127.0.0.1:{port}", "-o", str(tmp_path / "s")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"asyncflow: error: cannot reach http://127.0.0.1:{port}")
    assert not (tmp_path / "s").exists()


def test_the_console_script_is_declared() -> None:
    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert 'asyncflow = "asyncflow.cli:main"' in text
    assert os.path.isfile(Path(cli.__file__).parent / "__main__.py")
