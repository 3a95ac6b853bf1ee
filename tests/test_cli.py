"""The ``asyncflow`` command: ``run`` in a child process as a user would; snapshot; report."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import tomllib
from importlib import metadata
from pathlib import Path

import orjson
import pytest

import asyncflow
from asyncflow import cli, schema
from tests.support.commands import (
    ASYNCFLOW,
    EXAMPLES,
    asyncflow_cmd,
    console_script,
    python_cmd,
    write,
)
from tests.support.workload import workload


def signalled(
    command: list[str], signum: int, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Start ``command``, wait for it to print ``ready``, send it ``signum``; bounded.

    The command starts with ``signum``'s default disposition: a background job of a
    non-interactive shell (a CI runner's) inherits SIGINT ignored, and Python then keeps
    ignoring it, so neither a plain run nor ``asyncflow run`` would see the Ctrl-C."""
    reset = (
        f"import os, signal, sys; signal.signal({int(signum)}, signal.SIG_DFL); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", reset, *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()  # the program prints it once its handlers are set
        assert first == "ready\n", process.communicate(timeout=30)
        process.send_signal(signum)
        out, err = process.communicate(timeout=30)
    finally:
        if process.returncode is None:
            process.kill()
            process.communicate(timeout=30)
    return subprocess.CompletedProcess(command, process.returncode, first + out, err)


def test_run_a_script_with_its_arguments_and_every_task_tracked(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    done = asyncflow_cmd(
        "run", "--format", "json", "--output", str(report), str(EXAMPLES / "crawler.py"),
        "--workers", "4", "--timeout", "0.25",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("asyncflow: profiling 'crawler'; endpoint: http://127.0.0.1:")
    # as without asyncflow; the timeout is long enough that no stall of a loaded machine
    # makes a fast page time out (the README's run, with the default 0.05 s, says the same)
    assert "crawled 92 pages, 24 timed out, 1 malformed" in done.stdout
    document = orjson.loads(report.read_bytes())
    futures = {f["label"]: f for f in document["futures"]["futures"]}
    assert {"fetch", "parse", "crawl_one", "worker", "main"} <= set(futures)
    # asyncio.run's main task, tracked: its coroutine function is the program's own
    assert futures["main"]["tracked_by"] == "own_code"
    assert not any(label.startswith("BaseEventLoop.") for label in futures)  # asyncio's own


@pytest.mark.parametrize(
    "example",
    [
        "memory_stream.py",
        "blocked_loop.py",
        "pipeline.py",
        # these turn whole-program modes on themselves, as `run` does: the modes nest
        "connection_pool.py",
        "slow_service.py",
        "every_problem.py",
    ],
)
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


def test_the_run_takes_the_name_the_program_gives_its_profile(tmp_path: Path) -> None:
    # The program names its profile; `run` without --name reports (and lists) it by that
    # name, not by the script's file name. --name still wins.
    done = asyncflow_cmd("run", str(EXAMPLES / "blocked_loop.py"))
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("asyncflow · blocked-loop · elapsed") == 1, done.stderr
    assert "asyncflow · blocked_loop ·" not in done.stderr
    named = asyncflow_cmd("run", "--name", "mine", str(EXAMPLES / "blocked_loop.py"))
    assert named.returncode == 0, named.stderr
    assert named.stderr.count("asyncflow · mine · elapsed") == 1, named.stderr


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


SHOW_PATH = (
    "import json, sys\nprint(json.dumps({'path': sys.path, 'argv': sys.argv, 'name': __name__}))\n"
)


@pytest.mark.parametrize("launcher", ["console script", "python -m asyncflow"])
def test_run_dash_m_finds_the_module_as_python_dash_m_does(tmp_path: Path, launcher: str) -> None:
    project = write(tmp_path / "project" / "mymod.py", SHOW_PATH).parent
    command = console_script(tmp_path) if launcher == "console script" else ASYNCFLOW
    plain = subprocess.run(
        [sys.executable, "-m", "mymod", "a"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=project,
    )
    assert plain.returncode == 0, plain.stderr
    done = subprocess.run(
        [*command, "run", "--format", "none", "-m", "mymod", "a"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=project,
    )
    assert done.returncode == 0, done.stderr
    # the same sys.path (the current directory first, as python -m puts it), argv and __name__
    assert orjson.loads(done.stdout) == orjson.loads(plain.stdout)


@pytest.mark.parametrize("launcher", ["console script", "python -m asyncflow"])
def test_run_a_script_sees_the_sys_path_python_gives_it(tmp_path: Path, launcher: str) -> None:
    write(tmp_path / "scripts" / "show.py", SHOW_PATH)
    elsewhere = (tmp_path / "elsewhere").resolve()
    elsewhere.mkdir()
    command = console_script(tmp_path) if launcher == "console script" else ASYNCFLOW
    script = os.path.join("..", "scripts", "show.py")
    plain = subprocess.run(
        [sys.executable, script, "b"], capture_output=True, text=True, timeout=60, cwd=elsewhere
    )
    assert plain.returncode == 0, plain.stderr
    done = subprocess.run(
        [*command, "run", "--format", "none", script, "b"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=elsewhere,
    )
    assert done.returncode == 0, done.stderr
    shown = orjson.loads(done.stdout)
    assert shown == orjson.loads(plain.stdout)  # the script's directory first, not the cwd
    assert str(elsewhere) not in shown["path"]


FOREVER = (
    "import asyncio\n\nasync def main():\n    print('ready', flush=True)\n"
    "    await asyncio.Event().wait()\n\nasyncio.run(main())\n"
)


def test_sigterm_reports_then_ends_the_program_as_sigterm_does(tmp_path: Path) -> None:
    script = write(tmp_path / "served.py", FOREVER)
    plain = signalled([sys.executable, str(script)], signal.SIGTERM)
    assert plain.returncode == -signal.SIGTERM and plain.stderr == ""
    done = signalled([*ASYNCFLOW, "run", str(script)], signal.SIGTERM)
    assert done.returncode == -signal.SIGTERM, done.stderr  # killed by SIGTERM, as python is
    assert done.stdout == plain.stdout == "ready\n"
    assert done.stderr.count("asyncflow · served · elapsed") == 1  # the report, once
    assert "\nmain " in done.stderr and "Traceback" not in done.stderr
    # main's call never returned: the report says it shows the moment SIGTERM ended it
    assert "asyncflow: SIGTERM ended the program: the report is its state then" in done.stderr
    quiet = signalled([*ASYNCFLOW, "run", "--format", "none", str(script)], signal.SIGTERM)
    assert quiet.returncode == -signal.SIGTERM, quiet.stderr
    assert "SIGTERM ended" not in quiet.stderr  # (no report: nothing to say of it)


def test_sigterm_reports_when_it_interrupts_the_main_thread_holding_a_lock(
    tmp_path: Path,
) -> None:
    # SIGTERM's handler runs on the main thread wherever it was interrupted: in a heartbeat
    # of the loop monitor (which holds the loop's lock), in a lazy import. Stopping needs that
    # lock, and the program used to die without its report, held 5 s in the handler. The
    # program here holds the lock until the handler has let it go on (a state, not a time).
    script = write(
        tmp_path / "held.py",
        "import asyncio, threading\nimport asyncflow\n\nasync def main():\n"
        "    profiler = asyncflow.active_profiler()\n"
        "    (state,) = profiler._collector.monitor.states.values()\n"
        "    with state.lock:  # as a heartbeat holds it\n"
        "        print('ready', flush=True)\n"
        "        names = lambda: {t.name for t in threading.enumerate()}\n"
        "        while 'asyncflow-sigterm-wake' not in names():\n"
        "            pass\n"
        "    print('let go', flush=True)\n"
        "    await asyncio.Event().wait()\n\nasyncio.run(main())\n",
    )
    done = signalled([*ASYNCFLOW, "run", str(script)], signal.SIGTERM)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert done.stdout == "ready\nlet go\n"
    assert done.stderr.count("asyncflow · held · elapsed") == 1, done.stderr


def test_sigterm_reaches_a_handler_the_program_installs(tmp_path: Path) -> None:
    script = write(
        tmp_path / "graceful.py",
        "import asyncio, signal\n\nasync def main():\n    stop = asyncio.Event()\n"
        "    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)\n"
        "    print('ready', flush=True)\n    await stop.wait()\n    print('drained')\n\n"
        "asyncio.run(main())\nprint('exiting', flush=True)\n",
    )
    plain = signalled([sys.executable, str(script)], signal.SIGTERM)
    assert (plain.returncode, plain.stdout) == (0, "ready\ndrained\nexiting\n")
    done = signalled([*ASYNCFLOW, "run", str(script)], signal.SIGTERM)
    assert (done.returncode, done.stdout) == (0, plain.stdout), done.stderr
    assert done.stderr.count("asyncflow · graceful · elapsed") == 1


def test_sigterm_reaches_the_programs_own_signal_handler(tmp_path: Path) -> None:
    script = write(
        tmp_path / "own.py",
        "import signal, sys, threading\n\n"
        "def bye(signum, frame):\n    print('bye', signum, flush=True)\n    sys.exit(7)\n\n"
        "signal.signal(signal.SIGTERM, bye)\nprint('ready', flush=True)\n"
        "threading.Event().wait()\n",
    )
    plain = signalled([sys.executable, str(script)], signal.SIGTERM)
    done = signalled([*ASYNCFLOW, "run", str(script)], signal.SIGTERM)
    assert (
        (done.returncode, done.stdout) == (plain.returncode, plain.stdout) == (7, "ready\nbye 15\n")
    )
    assert done.stderr.count("asyncflow · own · elapsed") == 1


def test_ctrl_c_traceback_is_pythons_own_then_the_report(tmp_path: Path) -> None:
    script = write(
        tmp_path / "waits.py",
        "import threading\n\nprint('ready', flush=True)\nthreading.Event().wait()\n",
    )
    plain = signalled([sys.executable, str(script)], signal.SIGINT)
    assert plain.returncode == -signal.SIGINT  # python exits through SIGINT (shells say 130)
    done = signalled([*ASYNCFLOW, "run", str(script)], signal.SIGINT)
    assert done.returncode == -signal.SIGINT, done.stderr
    banner, rest = done.stderr.split("\n", 1)
    assert banner.startswith("asyncflow: profiling 'waits'")
    shown, report = rest.split("asyncflow · waits · elapsed")
    # Python's own traceback: the line the signal landed on varies, the shape does not
    for traceback in (plain.stderr, shown):
        assert traceback.startswith(f'Traceback (most recent call last):\n  File "{script}", line ')
        assert traceback.endswith("\nKeyboardInterrupt\n")
        files = re.findall(r'^  File "([^"]+)"', traceback, re.MULTILINE)
        stdlib = os.path.dirname(threading.__file__)
        assert all(f == str(script) or f.startswith(stdlib + os.sep) for f in files), files
    assert "(no futures were tracked: no event loop ran where asyncflow watched" in report


def test_ctrl_c_in_asyncio_run_still_reports(tmp_path: Path) -> None:
    script = write(tmp_path / "forever.py", FOREVER)
    plain = signalled([sys.executable, str(script)], signal.SIGINT)
    done = signalled([*console_script(tmp_path), "run", str(script)], signal.SIGINT)
    assert done.returncode == plain.returncode == -signal.SIGINT, done.stderr
    last = "Traceback (most recent call last):\n"
    ours, report = done.stderr.split("asyncflow · forever · elapsed")
    assert ours.rsplit(last, 1)[1] == plain.stderr.rsplit(last, 1)[1]  # asyncio.run's frames
    assert "asyncflow/cli.py" not in ours and "runpy" not in ours
    assert "\nmain " in report


def test_the_programs_own_excepthook_prints_its_error(tmp_path: Path) -> None:
    script = write(
        tmp_path / "hooked.py",
        "import sys\n\ndef hook(typ, value, tb):\n"
        "    where = tb.tb_frame.f_code.co_filename\n"
        "    print('hooked', typ.__name__, value, where, file=sys.stderr)\n"
        "\nsys.excepthook = hook\nraise LookupError('gone')\n",
    )
    plain = python_cmd(str(script))
    done = asyncflow_cmd("run", str(script))
    assert done.returncode == plain.returncode == 1
    assert plain.stderr == f"hooked LookupError gone {script}\n"
    assert plain.stderr in done.stderr and "Traceback" not in done.stderr


def test_block_threshold_flag_sets_the_option(tmp_path: Path) -> None:
    script = write(tmp_path / "x.py", "print('ran')\n")
    report = tmp_path / "report.json"
    done = asyncflow_cmd(
        "run", "--block-threshold", "0.25", "--format", "json", "--output", str(report),
        str(script),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert orjson.loads(report.read_bytes())["loop"]["block_threshold_ns"] == 250_000_000
    assert "--block-threshold SECONDS" in asyncflow_cmd("run", "--help").stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["run", "missing.py"], "no such file: 'missing.py'"),
        (["run", "--", "missing.py"], "no such file: 'missing.py'"),
        (["run", "."], "'.' is a directory with no __main__.py to run"),
        (["run", "-m", "no_such_module_here"], "no module named 'no_such_module_here'"),
        (["run"], "give a script to run"),
        (["run", "--port", "http", "x.py"], "--port 'http': expected a port"),
        (["run", "--limit", "-3", "x.py"], "--limit -3: expected a whole number"),
        (["run", "--format", "xml", "x.py"], "invalid choice: 'xml'"),
        (["run", "--sampling", "0", "x.py"], "--sampling 0: expected 'auto', or a whole number"),
        (["run", "--percentiles", "0", "x.py"], "--percentiles: percentile 0 is outside (0, 100]"),
        (["run", "--block-threshold", "0", "x.py"], "--block-threshold 0.0: expected seconds"),
        (["run", "--block-threshold", "soon", "x.py"], "--block-threshold 'soon': expected"),
        (["run", "--host", "", "x.py"], "--host '': expected a host name or IP address"),
        (["run", "--host", "0.0.0.0", "x.py"], "--host 0.0.0.0 serves other machines too: set"),
        (["run", "--host", "999.1.1.1", "x.py"], "--host 999.1.1.1: not an IPv4 address"),
        (["report", "nothing.json", "--percentiles", "x"], "--percentiles 'x': percentiles are"),
        (["report", "nothing.json", "--percentiles", ""], "--percentiles: give at least one"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["report", "nothing.json"], "cannot read 'nothing.json'"),
        (["report", "/dev/zero"], "cannot read '/dev/zero': not a regular file"),
        (["report", "bin.json"], "'bin.json' is not JSON: it is not UTF-8 text (byte 0xff at"),
        (["snapshot", "localhost:6780", "-o", "s.json"], "'localhost:6780' is not an endpoint URL"),
        (["top", "127.0.0.1:6780"], "'127.0.0.1:6780' is not an endpoint URL"),
        (["snapshot"], "the following arguments are required: -o/--output"),
        (["snapshot", "http://[::1", "-o", "s.json"], "is not an endpoint URL (Invalid IPv6"),
        (["trace", "http://127.0.0.1:abc", "-o", "t.json"], "is not an endpoint URL (Port"),
        (["snapshot", "http://127.0.0.1:1", "--token", "a\nb", "-o", "s"], "holds a line break"),
        (["dump", "99999999999999999999"], "99999999999999999999 is not a process id"),
        # an output that would overwrite the program, or another output (the file is kept)
        (["run", "--record", "x.py", "x.py"], "--record 'x.py' is the program itself"),
        (["run", "--output", "./x.py", "x.py"], "--output './x.py' is the program itself"),
        (["run", "--output", "o", "--record", "o", "x.py"], "--record 'o' is --output's file"),
        (["run", "--trace", "t", "--output", "t", "x.py"], "--output 't' is --trace's file"),
        (["run", "--format", "none", "--output", "r.json", "x.py"], "--output 'r.json' with"),
    ],
)
def test_mistakes_get_one_line_and_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    write(tmp_path / "x.py", "print('never runs')\n")
    (tmp_path / "bin.json").write_bytes(b'{"a": 1, ' + bytes(range(255, 200, -1)))
    done = asyncflow_cmd(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith("asyncflow") and says in lines[0]
    assert (tmp_path / "x.py").read_text() == "print('never runs')\n"  # nothing overwritten


@pytest.mark.parametrize(
    ("module", "says"),
    [
        ("lib", "no module named 'lib.__main__': 'lib' is a package and cannot be run"),
        ("broken.sub", "cannot import module 'broken.sub': RuntimeError: no config file"),
    ],
)
def test_a_module_that_cannot_run_is_one_line_and_exit_2(
    tmp_path: Path, module: str, says: str
) -> None:
    """``-m`` a package with no ``__main__``, or a module in a package whose ``__init__``
    raises: one line, as for a module not found, not a traceback through asyncflow."""
    write(tmp_path / "lib" / "__init__.py", "")
    write(tmp_path / "broken" / "__init__.py", "raise RuntimeError('no config file')\n")
    write(tmp_path / "broken" / "sub.py", "print('never runs')\n")
    done = asyncflow_cmd("run", "--port", "off", "-m", module, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [f"asyncflow run: error: {says}"]


def test_run_a_directory_python_runs_and_a_script_after_dashes(tmp_path: Path) -> None:
    """``python app/`` runs ``app/__main__.py``; ``--`` ends the options, as elsewhere."""
    write(tmp_path / "app" / "__main__.py", "import sys\nprint('app runs', sys.argv[1:])\n")
    for args in (["app", "x"], ["--", "app", "x"]):
        done = asyncflow_cmd("run", "--port", "off", "--format", "none", *args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert done.stdout == "app runs ['x']\n"


def test_the_reports_go_where_they_were_asked_for_when_the_program_changes_directory(
    tmp_path: Path,
) -> None:
    """A service that changes directory (to its data, as daemons do) after starting: its report
    and trace go where `asyncflow run` was asked, not into the directory it moved to, whose
    file of that name stays as it was."""
    (tmp_path / "reports").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "out.json").write_text("the service's own file")
    write(
        tmp_path / "daemon.py",
        f"import asyncio, os\nos.chdir({str(tmp_path / 'data')!r})\n"
        "async def main():\n    await asyncio.sleep(0)\nasyncio.run(main())\n",
    )
    done = asyncflow_cmd(
        "run", "--port", "off", "--format", "json", "--output", "out.json",
        "--trace", "reports/trace.json", "daemon.py", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "internal error" not in done.stderr
    assert orjson.loads((tmp_path / "out.json").read_bytes())["schema"] == schema.SCHEMA
    assert "traceEvents" in orjson.loads((tmp_path / "reports" / "trace.json").read_bytes())
    assert (tmp_path / "data" / "out.json").read_text() == "the service's own file"


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--host", "192.0.2.1"], {}, "--host 192.0.2.1: cannot serve there"),
        ([], {"ASYNCFLOW_HOST": "192.0.2.1"}, "ASYNCFLOW_HOST=192.0.2.1: cannot serve there"),
        ([], {"ASYNCFLOW_HOST": "::"}, "ASYNCFLOW_HOST=:: serves other machines too: set"),
    ],
)
def test_a_host_that_cannot_be_served_is_a_bad_option(
    tmp_path: Path, args: list[str], env: dict[str, str], says: str
) -> None:
    """192.0.2.1 is a documentation address (RFC 5737): never one of this machine's."""
    write(tmp_path / "x.py", "print('never runs')\n")
    token = {} if "::" in env.values() else {"ASYNCFLOW_TOKEN": "t0ken"}
    done = asyncflow_cmd("run", *args, "x.py", cwd=tmp_path, env={**token, **env})
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("asyncflow run: error: " + says), lines


def test_a_busy_port_is_one_line_and_exit_1(tmp_path: Path) -> None:
    script = write(tmp_path / "x.py", "print('never runs')\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = asyncflow_cmd("run", "--port", str(port), str(script))
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.strip().splitlines()  # the wording is tests/test_profiler.py's
    assert len(lines) == 1
    assert lines[0].startswith(f"asyncflow run: error: port {port} on 127.0.0.1 is already in use")


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
        assert cli.main(["snapshot", prof.url, "-o", "-", "--token", "tok"]) == 0  # stdout
        printed = capsys.readouterr()
        assert schema.load(schema.Snapshot, orjson.loads(printed.out)).status.name == "prod"
        assert not (tmp_path / "-").exists() and not Path("-").exists()
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
    assert cli.main(["report", str(exit_report), "--percentiles", "99,50"]) == 0
    out = capsys.readouterr().out
    assert "  p50 poll  p99 poll  max poll\n" in out and "\nconsume " in out

    not_json = write(tmp_path / "bad.json", "{not json")
    wrong = write(tmp_path / "wrong.json", '{"schema": 1, "futures": 3}')
    newer = write(tmp_path / "newer.json", '{"schema": 99}')
    # a field this asyncflow does not know, deep in an optional document: the message names it
    # (it said "Snapshot.channels: expected null, got dict")
    document = orjson.loads(exit_report.read_bytes())
    document["channels"]["channels"][0]["added_later"] = 1
    unknown = write(tmp_path / "unknown.json", orjson.dumps(document).decode())
    for path, says in (
        (not_json, "is not JSON"),
        (wrong, "is not an asyncflow snapshot: Snapshot"),
        (newer, "has schema 99; this asyncflow reads schema 1"),
        (unknown, "Snapshot.channels.channels[0]: unknown field(s) added_later"),
    ):
        assert cli.main(["report", str(path)]) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1


def test_report_shows_only_the_percentiles_the_snapshot_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    default, own = tmp_path / "default.json", tmp_path / "own.json"
    with asyncflow.profile("p", format="json", output=str(default), port=0):
        asyncio.run(workload())
    assert cli.main(["report", str(default), "--percentiles", "90,99"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"asyncflow report: error: --percentiles 90,99: {str(default)!r} holds p50, p95 and p99 "
        "only (a profile keeps the percentiles it was started with: percentiles= or "
        "ASYNCFLOW_PERCENTILES)\n"
    )
    with asyncflow.profile("q", format="json", output=str(own), port=0, percentiles=[90, 99.9]):
        asyncio.run(workload())
    assert cli.main(["report", str(own)]) == 0  # no --percentiles: the ones it holds
    assert "  p90 poll  p99.9 poll  max poll\n" in capsys.readouterr().out


def test_snapshot_of_an_unreachable_endpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert cli.main(["snapshot", f"http://127.0.0.1:{port}", "-o", str(tmp_path / "s")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"asyncflow snapshot: error: nothing answers at http://127.0.0.1:{port}")
    assert not (tmp_path / "s").exists()


ROOT = Path(__file__).resolve().parent.parent


def test_the_console_script_is_declared() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert 'asyncflow = "asyncflow.cli:main"' in text
    assert os.path.isfile(Path(cli.__file__).parent / "__main__.py")


def test_the_distribution_has_a_name_of_its_own() -> None:
    """'asyncflow' on the package index is an unrelated project: installing 'asyncflow[top]'
    from there would bring in that one. The import name and the command stay asyncflow."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "asyncflow-profiler"
    assert metadata.version("asyncflow-profiler") == asyncflow.__version__
    assert metadata.distribution("asyncflow-profiler").entry_points.select(
        group="console_scripts", name="asyncflow"
    )


def test_every_install_command_in_the_readme_and_the_manual_installs_this_checkout() -> None:
    """A name after 'pip install' would be looked up on the package index; a path is this."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    text = "\n".join(page.read_text(encoding="utf-8") for page in pages)
    commands = re.findall(r"pip install ([^\n`&;#]*)", text)
    assert commands, "the README says how to install"
    for command in commands:
        targets = [t.strip("'\"") for t in command.split() if not t.startswith("-")]
        assert targets and all(t.split("[")[0] == "." for t in targets), command


WAITING_PROGRAM = """\
import asyncio
import concurrent.futures
import threading
import time

go = threading.Event()


def convert(n):
    go.wait(5)
    return n


async def notify(n):
    return n


async def main():
    notify(0)  # never awaited: the program's bug
    guard = asyncio.Lock()
    async with guard:
        pass
    loop = asyncio.get_running_loop()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        jobs = [loop.run_in_executor(pool, convert, n) for n in range(6)]
        go.set()
        print(sum(await asyncio.gather(*jobs)))
    print(await asyncio.to_thread(convert, 4))


asyncio.run(main())
"""


def test_run_sees_executors_and_never_awaited_coroutines_without_code_changes(
    tmp_path: Path,
) -> None:
    script = write(tmp_path / "prog.py", WAITING_PROGRAM)
    report = tmp_path / "report.json"
    done = asyncflow_cmd("run", "--format", "json", "--output", str(report), str(script))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["15", "4"]
    assert "coroutine 'notify' was never awaited" in done.stderr  # Python's warning, as ever
    document = orjson.loads(report.read_bytes())
    executors = {e["label"]: e for e in document["executors"]["executors"]}
    assert executors["ThreadPoolExecutor"]["submitted"] == 6
    default = next(e for label, e in executors.items() if label.startswith("default executor"))
    assert [f["name"] for f in default["functions"]] == ["__main__.convert"]
    (orphan,) = document["futures"]["never_awaited"]
    assert (orphan["function"], orphan["count"]) == ("notify", 1)
    assert "never-awaited" in {w["kind"] for w in document["warnings"]}
    line = WAITING_PROGRAM.splitlines().index("    guard = asyncio.Lock()") + 1
    (guard,) = [r for r in document["resources"]["resources"] if r["label"] == f"prog.py:{line}"]
    assert (guard["primitive"], guard["acquisitions"]) == ("lock", 1)

    done = asyncflow_cmd(
        "run", "--no-executors", "--no-never-awaited", "--no-locks", "--format", "json",
        "--output", str(report), str(script),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    document = orjson.loads(report.read_bytes())
    assert document["executors"]["executors"] == []
    assert document["futures"]["never_awaited"] == []
    assert document["resources"]["resources"] == []


@pytest.mark.parametrize("module", [["-m", "app"], ["-mapp"]])
def test_the_arguments_after_dash_m_module_are_the_modules_own(
    tmp_path: Path, module: list[str]
) -> None:
    """As python -m: 'run -m uvicorn --port 8000 app:app' must not set asyncflow's --port, and
    gunicorn's '-k' must not be refused as one of run's unknown options."""
    write(tmp_path / "app" / "__init__.py", "")
    write(tmp_path / "app" / "__main__.py", "import sys\nprint(sys.argv[1:])\n")
    done = asyncflow_cmd(
        "run", "--format", "none", *module, "--port", "1", "-k", "x", "--name", "y",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["['--port', '1', '-k', 'x', '--name', 'y']"]
    endpoint = done.stderr.split("endpoint: ", 1)[1].split()[0]
    assert "profiling 'app'" in done.stderr and not endpoint.endswith(":1"), endpoint


def test_a_program_that_closes_every_inherited_descriptor_keeps_its_own_files(
    tmp_path: Path,
) -> None:
    """A daemon closes every descriptor it inherited (``os.closerange``), asyncflow's among
    them, then opens its own, which take the same numbers. asyncflow's thread stops; it must
    then touch none of those numbers (closing or writing one would be the program's file), say
    so in one line, and still write the report at exit."""
    write(
        tmp_path / "daemon.py",
        """\
import asyncio, os, socket
os.closerange(3, 4096)  # as a daemon does

async def main():
    a, b = socket.socketpair()
    loop = asyncio.get_running_loop()
    with open("journal.txt", "w") as journal:
        for i in range(20):
            await asyncio.sleep(0.02)
            await loop.sock_sendall(a, b"x")
            assert await loop.sock_recv(b, 16) == b"x"
            journal.write(f"entry {i}\\n")
            journal.flush()
    return "20 round trips"

print(asyncio.run(main()))
""",
    )
    done = asyncflow_cmd(
        "run", "--port", "0", "--format", "json", "--output", "report.json", "--record",
        "run.afrec", "daemon.py", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "20 round trips\n"
    assert (tmp_path / "journal.txt").read_text() == "".join(f"entry {i}\n" for i in range(20))
    assert "Traceback" not in done.stderr, done.stderr
    said = [line for line in done.stderr.splitlines() if "descriptor" in line]
    lost = "asyncflow: the program closed the profiler's file descriptors"
    assert len([line for line in said if line.startswith(lost)]) == 1, said
    # (and the recording's, before or after, if it had still to write: it ends at its last tick)
    assert all(line.startswith("asyncflow: the program closed the") for line in said), said
    assert len(said) <= 2 and "internal error" not in done.stderr, done.stderr
    report = orjson.loads((tmp_path / "report.json").read_bytes())
    assert report["schema"] == schema.SCHEMA


def test_a_program_that_recurses_to_its_limit_gets_nothing_more_on_stderr(
    tmp_path: Path,
) -> None:
    """A program that catches the RecursionError of an unbounded await chain prints what it
    prints plainly, and asyncflow adds no line to its standard error: the error its hooks met
    at the limit is counted, not logged (nor raised from a finaliser)."""
    script = write(
        tmp_path / "deep.py",
        "import asyncio\n"
        "async def deep(n):\n"
        "    return await deep(n + 1)\n"
        "try:\n"
        "    asyncio.run(deep(0))\n"
        "except RecursionError:\n"
        "    print('caught RecursionError')\n",
    )
    plain = python_cmd(str(script))
    assert (plain.stdout, plain.stderr) == ("caught RecursionError\n", "")
    done = asyncflow_cmd("run", "--format", "none", str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == plain.stdout
    assert [line for line in done.stderr.splitlines() if not line.startswith("asyncflow: ")] == []


def test_a_program_module_named_like_the_standard_librarys_is_said(tmp_path: Path) -> None:
    """The program's own ``http.py`` replaces the standard library's ``http`` run plainly;
    asyncflow loaded that one already, so the program gets it: one line says so before the
    program runs. ``python -m asyncflow`` run from that directory still imports its own."""
    write(tmp_path / "http.py", "def get(url):\n    return f'fetched {url}'\n")
    write(tmp_path / "app.py", "import http\nprint(hasattr(http, 'get'))\n")
    plain = python_cmd("app.py", cwd=tmp_path)
    assert plain.stdout == "True\n"
    done = asyncflow_cmd("run", "--format", "none", "app.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "False\n"
    (line,) = [line for line in done.stderr.splitlines() if "http.py" in line]
    assert line.startswith("asyncflow: the program's http.py would replace the standard library's")
    # one that asyncflow's own first imports load (python -m puts this directory first)
    write(tmp_path / "dataclasses.py", "field = None\n")
    done = asyncflow_cmd("run", "--format", "none", "app.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "the program's dataclasses.py, http.py would replace" in done.stderr
