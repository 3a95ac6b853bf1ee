"""The registry of running profilers: ``asyncflow ps``, and ``top``/``snapshot`` without a URL."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest

import asyncflow
from asyncflow import cli
from asyncflow.serve import registry
from tests.support.commands import asyncflow_cmd

#: a profiled program that serves until its standard input closes; argv: its name
CHILD = """
import asyncio, sys
import asyncflow

@asyncflow.future
async def work():
    await asyncio.sleep(0)

with asyncflow.profile(sys.argv[1], port=0, format="none") as prof:
    asyncio.run(work())
    print(prof.url, flush=True)
    sys.stdin.readline()
"""
TIMEOUT = 30.0


@contextmanager
def profiled(
    tmp_path: Path, *names: str, tokens: dict[str, str] | None = None
) -> Iterator[list[tuple[int, str]]]:
    """Run one profiled child per name, at once (with its token, if ``tokens`` gives one);
    yields each one's (pid, url) once it serves, and ends them all (closing their standard
    input) on the way out."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    tokens = tokens or {}
    children = [
        subprocess.Popen(
            [sys.executable, str(script), name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "ASYNCFLOW_TOKEN": tokens[name]} if name in tokens else None,
        )
        for name in names
    ]
    try:
        with ThreadPoolExecutor(len(children)) as pool:
            lines = [pool.submit(child.stdout.readline) for child in children]  # type: ignore[union-attr]
            urls = [line.result(timeout=TIMEOUT).strip() for line in lines]
        assert all(url.startswith("http://127.0.0.1:") for url in urls), urls
        yield [(child.pid, url) for child, url in zip(children, urls, strict=True)]
    finally:
        for child in children:
            end(child)


def end(child: subprocess.Popen[str]) -> int:
    """Close a child's standard input (it stops its profiler and exits); its exit code."""
    try:
        if child.stdin is not None and not child.stdin.closed:
            child.stdin.close()
        return child.wait(TIMEOUT)
    except BaseException:
        child.kill()
        child.wait(TIMEOUT)
        raise
    finally:
        if child.stdout is not None:
            child.stdout.close()


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_ps_lists_every_running_profiler_and_forgets_those_that_stop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # (one test, for three programs start in seconds on a small machine)
    with profiled(tmp_path, "alpha", "beta", "gamma", tokens={"gamma": "s3cr3t-t0ken"}) as served:
        code, out, err = run_cli(capsys, "ps", "--json")
        assert (code, err) == (0, "")
        listed = orjson.loads(out)
        assert {(e["pid"], e["url"]) for e in listed} == set(served)
        assert sorted(e["name"] for e in listed) == ["alpha", "beta", "gamma"]
        for entry in listed:
            assert entry["token"] is (entry["name"] == "gamma")
            assert entry["argv"][-1] == entry["name"]
            assert entry["argv"][-2].endswith("child.py")
        assert [e["started"] for e in listed] == sorted(e["started"] for e in listed)
        # the registry says a token is needed, and never holds it
        for path in registry.directory().iterdir():
            assert b"s3cr3t-t0ken" not in path.read_bytes()
        if hasattr(os, "getuid"):
            assert registry.directory().stat().st_mode & 0o777 == 0o700
            for path in registry.directory().iterdir():
                assert path.stat().st_mode & 0o077 == 0

        code, out, err = run_cli(capsys, "ps")
        assert (code, err) == (0, "")
        header, *rows = out.splitlines()
        assert header.split() == ["PID", "PARENT", "NAME", "URL", "TOKEN", "UP", "COMMAND"]
        assert len(rows) == 3
        for entry in listed:
            (row,) = [row.split() for row in rows if row.split()[0] == str(entry["pid"])]
            assert row[1:5] == ["-", entry["name"], entry["url"], "yes" if entry["token"] else "no"]

        # several, and no URL given: not at a terminal, one line and exit 2
        saved = tmp_path / "snap.json"
        monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
        for command in (["snapshot", "-o", str(saved)], ["top"]):
            code, out, err = run_cli(capsys, *command)
            assert (code, out) == (2, "")
            (line,) = err.splitlines()
            assert line.startswith(f"asyncflow {command[0]}: error: 3 profilers run here: ")
            for pid, url in served:
                assert f"(pid {pid}) at {url}" in line
            assert f"give one's URL (asyncflow {command[0]} URL; 'asyncflow ps' lists them)" in line
        assert not saved.exists()

        # at a terminal, the user picks one
        monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
        monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
        asked: list[str] = []
        beta = [e["name"] for e in listed].index("beta")  # (gamma would want its token)

        def answer(prompt: str) -> str:
            asked.append(prompt)
            return str(beta + 1)

        monkeypatch.setattr("builtins.input", answer)
        code, _, err = run_cli(capsys, "snapshot", "-o", str(saved))
        assert code == 0, err
        assert asked == ["which one? [1-3] "]
        assert err.startswith("3 profilers run here:\n#  PID")
        assert f"\n{beta + 1}  {listed[beta]['pid']}" in err
        assert orjson.loads(saved.read_bytes())["status"]["pid"] == listed[beta]["pid"]

        monkeypatch.setattr("builtins.input", lambda prompt: "4")
        code, _, err = run_cli(capsys, "snapshot", "-o", str(saved))
        assert code == 2
        assert err.splitlines()[-1] == "asyncflow snapshot: error: '4' is not a number from 1 to 3"

    # every child stopped its profiler on the way out: nothing is left
    assert registry.entries() == []
    assert list(registry.directory().iterdir()) == []
    code, out, err = run_cli(capsys, "ps", "--json")
    assert (code, orjson.loads(out)) == (0, [])
    message = f"asyncflow: no profiler is running here ({registry.directory()})\n"
    assert run_cli(capsys, "ps")[1:] == ("", message)


def test_snapshot_and_top_without_a_url_pick_the_only_profiler(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = tmp_path / "snap.json"
    with profiled(tmp_path, "only") as served:
        code, _, err = run_cli(capsys, "snapshot", "-o", str(saved))
        assert code == 0, err
        assert err == f"asyncflow: saved 1 future from {served[0][1]} to {saved}\n"
        assert orjson.loads(saved.read_bytes())["status"]["pid"] == served[0][0]
        # top reaches the same endpoint (its app is not run here: only the URL it was given)
        opened: list[str] = []

        class FakeTop:
            def __init__(self, url: str, token: str | None, interval: float) -> None:
                opened.append(url)

            def run(self) -> None:
                pass

        monkeypatch.setattr("asyncflow.render.top.TopApp", FakeTop)
        assert run_cli(capsys, "top")[0] == 0
        assert opened == [served[0][1]]


def test_stale_files_are_ignored_and_removed_and_foreign_files_left_alone() -> None:
    with asyncflow.profile("here", format="none", port=0) as prof:
        folder = registry.directory()
        (ours,) = registry.entries()
        assert (ours.pid, ours.name, ours.url) == (os.getpid(), "here", prof.url)
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait(TIMEOUT)
        template = orjson.loads((folder / f"{os.getpid()}.json").read_bytes())
        # a process that ended without removing its file (killed)
        (folder / f"{gone.pid}.json").write_bytes(orjson.dumps({**template, "pid": gone.pid}))
        # a pid that now belongs to another process: the start time does not match
        reused = subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE)
        try:
            recorded = {**template, "pid": reused.pid, "process_start": 1}
            (folder / f"{reused.pid}.json").write_bytes(orjson.dumps(recorded))
            (folder / "notes.txt").write_text("not ours")
            (folder / "12.json").write_text("{ not json")
            assert [e.pid for e in registry.entries()] == (
                [os.getpid()]
                if registry.process_start(reused.pid) is not None
                else sorted([os.getpid(), reused.pid])
            )
        finally:
            end(reused)  # type: ignore[arg-type]
        names = sorted(p.name for p in folder.iterdir())
        assert names == sorted(["12.json", "notes.txt", f"{os.getpid()}.json"])
    assert sorted(p.name for p in folder.iterdir()) == ["12.json", "notes.txt"]


def test_a_directory_others_can_write_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("ASYNCFLOW_RUNTIME_DIR", str(shared))
    with asyncflow.profile("careful", format="none", port=0) as prof:
        assert prof.running and prof.url is not None
        assert list(shared.iterdir()) == []
        assert registry.entries() == []


def test_profilers_without_an_endpoint_do_not_register() -> None:
    with asyncflow.profile("quiet", format="none", port=None):
        assert registry.entries() == []
        assert not registry.directory().exists() or list(registry.directory().iterdir()) == []


def test_the_directory_is_the_users_runtime_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ASYNCFLOW_RUNTIME_DIR")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert registry.directory() == tmp_path / "asyncflow"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    if hasattr(os, "getuid"):
        assert registry.directory() == tmp_path / f"asyncflow-{os.getuid()}"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_never_removes_its_parents_file(tmp_path: Path) -> None:
    script = tmp_path / "forks.py"
    script.write_text(
        "import os, sys, warnings\n"
        "import asyncflow\n"
        "from asyncflow.serve import registry\n"
        "prof = asyncflow.start('parent', format='none', port=0)\n"
        "registration = prof._registration\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    registration.remove()  # directly, and by the child's own stop and exit\n"
        "    asyncflow.stop()\n"
        "    sys.exit(0)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print('child', os.waitstatus_to_exitcode(status))\n"
        "print('kept', [e.name for e in registry.entries()])\n"
        "prof.stop()\n"
        "print('left', [e.name for e in registry.entries()])\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == "child 0\nkept ['parent']\nleft []\n"


def test_stray_files_named_like_no_process_are_ignored(tmp_path: Path) -> None:
    """A file in the registry named by a number no process id can be (or by digits that are
    not ASCII ones) is not anyone's: ``ps`` lists nothing, and says so, instead of failing on
    it."""
    folder = tmp_path / "registry"
    folder.mkdir(mode=0o700)
    for stray in ("99999999999999999999.sock", "99999999999999999999.json", "²³.sock"):
        (folder / stray).write_text("")
    done = asyncflow_cmd("ps", env={"ASYNCFLOW_RUNTIME_DIR": str(folder)})
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "no profiler is running here" in done.stdout + done.stderr


def test_a_registry_that_cannot_be_used_is_said_by_ps(tmp_path: Path) -> None:
    """A file, or a directory other users can write, is never used as the registry: profilers
    then register nowhere, and ``ps`` says why instead of "no profiler is running here"."""
    (tmp_path / "a-file").write_text("")
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    for folder, why in ((tmp_path / "a-file", "is not a directory"), (shared, "other users")):
        done = asyncflow_cmd("ps", env={"ASYNCFLOW_RUNTIME_DIR": str(folder)})
        assert done.returncode == 2, done.stderr
        assert why in done.stderr and "ASYNCFLOW_RUNTIME_DIR" in done.stderr, done.stderr
        assert "no profiler is running here" not in done.stderr
    # and a profiler told to register there says, once, that it is not listed
    (tmp_path / "app.py").write_text("pass\n")
    done = asyncflow_cmd(
        "run", "--port", "0", "--format", "none", "app.py",
        cwd=tmp_path, env={"ASYNCFLOW_RUNTIME_DIR": str(shared)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "not listed" in line]
    assert said == [
        f"asyncflow: not listed by 'asyncflow ps': ASYNCFLOW_RUNTIME_DIR {str(shared)!r} can be "
        "written by other users"
    ]
