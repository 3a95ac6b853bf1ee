"""``asyncflow diff`` over real runs: two runs of one program diff clean (exit 0), a run where
one coroutine got four times slower exits 1 naming it, and every bad input is one line, exit 2.

The command is declared by :func:`asyncflow.render.diff.add_diff_command`; these tests build a
parser with it, as the CLI does, and call its handler.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from asyncflow import schema
from asyncflow.render.diff import add_diff_command, read_document, render_diff
from asyncflow.views.diff import DiffOptions, diff
from tests.support.commands import ASYNCFLOW

ORDERS = Path(__file__).resolve().parent.parent / "support" / "docs_programs" / "orders.py"


def _run(out: Path, slow: str = "1", *extra: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCFLOW_")}
    if os.environ.get("ASYNCFLOW_NO_EXTENSIONS"):
        env["ASYNCFLOW_NO_EXTENSIONS"] = os.environ["ASYNCFLOW_NO_EXTENSIONS"]
    done = subprocess.run(
        [*ASYNCFLOW, "run", "--format", "json", "--output", str(out), *extra, str(ORDERS)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "ASYNCFLOW_PORT": "0", "ORDERS_SLOW": slow},
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Runs of one program: base, again, one with pricing 4x slower, and one recorded (its
    recorder, on the profiler's thread, takes the interpreter from the program now and then,
    which the others need not share)."""
    where = tmp_path_factory.mktemp("diff")
    _run(where / "base.json")
    _run(where / "again.json")
    _run(where / "slow.json", "4")
    _run(where / "recorded.json", "1", "--record", str(where / "recorded.rec"))
    return where


@pytest.fixture
def run_diff(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """``asyncflow diff ARGV`` through a parser made as the CLI makes it: (status, out, err)."""

    def run(*argv: str) -> tuple[int, str, str]:
        parser = argparse.ArgumentParser(prog="asyncflow")
        add_diff_command(parser.add_subparsers(dest="command"))
        args = parser.parse_args(["diff", *argv])
        capsys.readouterr()
        status: int = args.handler(args)
        out, err = capsys.readouterr()
        return status, out, err

    return run


def test_two_runs_of_one_program_diff_clean(
    run_diff: Callable[..., tuple[int, str, str]], runs: Path
) -> None:
    status, out, err = run_diff(str(runs / "base.json"), str(runs / "again.json"))
    assert (status, err) == (0, ""), out
    assert out.endswith("passed: no figure got worse by more than 2x\n")
    assert "only in" not in out  # the same futures and queue, matched by label
    # the coroutines' own figures did not move (the machine's load may move a queue's)
    assert "  future " not in out, out


def test_a_coroutine_four_times_slower_fails_naming_it(
    run_diff: Callable[..., tuple[int, str, str]], runs: Path
) -> None:
    status, out, err = run_diff(str(runs / "base.json"), str(runs / "slow.json"))
    assert (status, err) == (1, "")
    table = out.split("\n\n")[1].splitlines()
    assert table[1].split()[:4] == ["kind", "name", "figure", "base"]
    first = table[2].split()
    assert first[:4] == ["future", "price", "call", "p50"] and first[-2:] == ["worse", "FAIL"]
    assert 2.5 < float(first[-3].rstrip("x")) < 5.0  # four times, give or take the timer
    verdict = out.splitlines()[-1]
    assert verdict.startswith("FAILED: ") and "future `price`: call p50 " in verdict
    assert "`check`" not in verdict  # checking did not slow down


def test_json_output_names_the_failure(
    run_diff: Callable[..., tuple[int, str, str]], runs: Path
) -> None:
    status, out, _ = run_diff(str(runs / "base.json"), str(runs / "slow.json"), "--format", "json")
    assert status == 1
    document = orjson.loads(out)
    assert list(document) == [
        "format",
        "base",
        "new",
        "options",
        "changes",
        "appeared",
        "vanished",
        "findings_appeared",
        "findings_vanished",
        "compared",
        "percentiles_skipped",
        "failed",
        "failures",
        "cautions",
    ]
    assert document["format"] == 1 and document["failed"] is True
    price = document["changes"][0]
    assert (price["kind"], price["name"], price["figure"], price["unit"]) == (
        "future",
        "price",
        "call p50",
        "ns",
    )
    assert price["verdict"] == "worse" and price["failed"] and price["new"] > 3 * price["base"]
    assert document["failures"][0].startswith("future `price`: call p50 ")


def test_a_recording_is_compared_as_its_end_state(
    run_diff: Callable[..., tuple[int, str, str]], runs: Path
) -> None:
    status, out, err = run_diff(str(runs / "recorded.rec"), str(runs / "recorded.json"))
    assert (status, err) == (0, "")
    assert "no figure changed beyond noise" in out  # one run, read two ways


def test_fail_over_inf_never_fails(
    run_diff: Callable[..., tuple[int, str, str]], runs: Path
) -> None:
    status, out, _ = run_diff(
        str(runs / "base.json"), str(runs / "slow.json"), "--fail-over", "inf"
    )
    assert status == 0
    assert out.splitlines()[-1] == "passed: with --fail-over inf, no figure fails the comparison"


def test_entries_in_one_run_only_are_listed(
    run_diff: Callable[..., tuple[int, str, str]], runs: Path, tmp_path: Path
) -> None:
    data = orjson.loads((runs / "base.json").read_bytes())
    for entry in data["futures"]["futures"]:
        if entry["label"] == "check":
            entry["label"] = entry["source"] = "verify"
    (tmp_path / "renamed.json").write_bytes(orjson.dumps(data))
    status, out, _ = run_diff(str(runs / "base.json"), str(tmp_path / "renamed.json"))
    assert status == 0  # the same run, but for one future's name
    assert "only in new:\n  future `verify` (verify): 24 calls\n" in out
    assert "only in base:\n  future `check` (__main__:check): 24 calls\n" in out


def test_the_table_says_no_change_and_the_noise(
    run_diff: Callable[..., tuple[int, str, str]], runs: Path
) -> None:
    same = read_document(str(runs / "base.json"))
    text = render_diff(diff(same, same), "table", "a.json", "b.json")
    lines = text.splitlines()
    assert lines[0].startswith("base: a.json (orders, ")
    assert lines[1].startswith("new: b.json (orders, ")
    assert lines[2].startswith("noise: a change under 1.25x, or under 1 ms (a percentile), 10 ms")
    assert lines[4].startswith("no figure changed beyond noise (5 entries compared")
    with pytest.raises(ValueError, match="format='xml'"):
        render_diff(diff(same, same), "xml")


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "cannot read '{path}': No such file or directory"),
        (b"not json", "'{path}' is not JSON: "),
        (
            b"[1, 2]",
            "'{path}' is not an asyncflow snapshot: Snapshot: expected an object, got list",
        ),
        (b'{"schema": 1, "status": {}}', "'{path}' is not an asyncflow snapshot: "),
        (
            b'{"schema": 2}',
            "'{path}' has schema 2; this asyncflow reads schema 1 (a newer asyncflow wrote it: "
            "read it with that one)",
        ),
        (b"asyncflow-recording {bad\n", "'{path}': the recording's header does not read"),
    ],
)
def test_a_bad_input_is_one_line_and_exit_2(
    run_diff: Callable[..., tuple[int, str, str]],
    runs: Path,
    tmp_path: Path,
    content: bytes | None,
    said: str,
) -> None:
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_bytes(content)
    for argv in ([str(bad), str(runs / "base.json")], [str(runs / "base.json"), str(bad)]):
        status, out, err = run_diff(*argv)
        assert (status, out) == (2, "")
        assert err.startswith("asyncflow diff: error: " + said.format(path=bad)), err
        assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--fail-over", "0.5"], "--fail-over 0.5: expected a ratio >= 1, e.g. 1.5"),
        (["--threshold", "1"], "--threshold 1.0: expected a ratio above 1, e.g. 1.25"),
        (["--min-time", "-1"], "--min-time -1: expected milliseconds from 0 to 9e+12"),
        (["--min-total", "inf"], "--min-total inf: expected milliseconds from 0 to 9e+12"),
        (["--min-share", "100"], "--min-share 100: expected a percentage from 0 to 100"),
        (["--min-count", "0"], "--min-count 0: expected a count >= 1"),
        (["--min-samples", "0"], "--min-samples 0: expected a count >= 1"),
    ],
)
def test_a_bad_flag_is_named(
    run_diff: Callable[..., tuple[int, str, str]], runs: Path, flags: list[str], said: str
) -> None:
    base = str(runs / "base.json")
    assert run_diff(base, base, *flags) == (2, "", f"asyncflow diff: error: {said}\n")


def test_the_parser_refuses_what_is_not_a_number(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="asyncflow")
    add_diff_command(parser.add_subparsers(dest="command"))
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["diff", "a.json", "b.json", "--fail-over", "lots"])
    assert exited.value.code == 2
    assert "argument --fail-over: invalid float value: 'lots'" in capsys.readouterr().err


def test_a_document_of_the_same_schema_with_new_fields_is_read(
    run_diff: Callable[..., tuple[int, str, str]], runs: Path, tmp_path: Path
) -> None:
    data = orjson.loads((runs / "base.json").read_bytes())
    data["futures"]["futures"][0]["a_newer_field"] = 1
    (tmp_path / "newer.json").write_bytes(orjson.dumps(data))
    assert isinstance(read_document(str(tmp_path / "newer.json")), schema.Snapshot)


def test_through_the_cli_main(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's own parser has the command: it exits as the CLI does, and its usage errors
    are said as the CLI's other commands say theirs."""
    from asyncflow import cli

    assert cli.main(["diff", str(runs / "base.json"), str(runs / "slow.json")]) == 1
    assert "FAILED: " in capsys.readouterr().out
    assert cli.main(["diff", str(runs / "base.json"), str(runs / "again.json")]) == 0
    capsys.readouterr()
    assert cli.main(["diff", "a.json", "b.json", "--fail-over", "lots"]) == 2
    assert capsys.readouterr().err == (
        "asyncflow diff: error: argument --fail-over: invalid float value: 'lots' "
        "(see 'asyncflow diff --help')\n"
    )


_KINDS = """\
import asyncio
import time

import asyncflow


@asyncflow.stream
async def ticks():
    for i in range(30):
        await asyncio.sleep(0)
        yield i


async def worker(lock):
    async with lock:
        await asyncio.sleep(0.001)


async def main():
    lock = asyncio.Lock()
    await asyncio.gather(*(worker(lock) for _ in range(30)))
    loop = asyncio.get_running_loop()
    for _ in range(25):
        await loop.run_in_executor(None, time.sleep, 0.001)
    async for _ in ticks():
        pass


asyncio.run(main())
"""


def test_every_kind_is_matched_and_compared(tmp_path: Path) -> None:
    """A lock, the default executor (whose label names its loop's address, another in each
    run), a stream and futures: each matched from one run to the next, and a figure of each
    compared."""
    program = tmp_path / "kinds.py"
    program.write_text(_KINDS)
    done = subprocess.run(
        [*ASYNCFLOW, "run", "--format", "json", "--output", "one.json", str(program)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "ASYNCFLOW_PORT": "0"},
    )
    assert done.returncode == 0, done.stderr
    data = orjson.loads((tmp_path / "one.json").read_bytes())
    data["loop"] = None  # no lateness to raise the floors: the figures below are exact
    (tmp_path / "base.json").write_bytes(orjson.dumps(data))
    (lock,) = data["resources"]["resources"]
    (pool,) = data["executors"]["executors"]
    (ticks,) = data["streams"]["streams"]
    assert pool["label"].startswith("default executor (") and " 0x" in pool["label"]
    # another run: another address; the lock's waits 3x longer, the executor's jobs 4x
    pool["label"] = pool["label"].replace(" 0x", " 0x1")
    lock["wait_ns"] = {k: v * 3 for k, v in lock["wait_ns"].items()}
    pool["run_ns"] = {k: v * 4 for k, v in pool["run_ns"].items()}
    ticks["items_yielded"] *= 2
    ticks["total_wait_ns"] += 1_000_000_000
    (tmp_path / "new.json").write_bytes(orjson.dumps(data))
    base, new = (read_document(str(tmp_path / f"{name}.json")) for name in ("base", "new"))
    result = diff(base, new, DiffOptions(min_time_ns=0))
    assert result.appeared == [] and result.vanished == []
    named = {(c.kind, c.name, c.figure, c.verdict) for c in result.changes}
    assert named == {
        ("resource", lock["label"], "wait p50", "worse"),
        ("executor", pool["label"], "run p50", "worse"),
        ("stream", "ticks", "items", "changed"),
        ("stream", "ticks", "total wait (trimmed)", "worse"),
    } | {  # p95 and p99 of 29 waits and 25 jobs have too few samples above them
        (kind, label, f"{figure} p{q}", "worse")
        for kind, label, figure, samples in (
            ("resource", lock["label"], "wait", lock["waits"]),
            ("executor", pool["label"], "run", pool["completed"]),
        )
        for q in (95, 99)
        if samples * (100 - q) / 100 >= 10
    }


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (["--min-samples", "99999999999999999999"], "--min-samples 99999999999999999999: expected"),
        (["--min-count", "99999999999999999999"], "--min-count 99999999999999999999: expected"),
        (["--min-time", "1e300"], "--min-time 1e+300: expected milliseconds from 0 to"),
        (["--min-total", "1e300"], "--min-total 1e+300: expected milliseconds from 0 to"),
    ],
)
def test_a_noise_option_too_large_for_the_document_is_a_bad_input(
    runs: Path, capsys: pytest.CaptureFixture[str], option: list[str], says: str
) -> None:
    """Each format takes the same options: one that no document could hold is said in one
    line, exit 2 (not a TypeError at the JSON output, exit 1, read as a regression)."""
    from asyncflow import cli

    base, again = str(runs / "base.json"), str(runs / "again.json")
    for output in ("table", "json"):
        assert cli.main(["diff", base, again, "--format", output, *option]) == 2
        assert capsys.readouterr().err.startswith(f"asyncflow diff: error: {says}")
