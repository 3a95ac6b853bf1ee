"""Recordings (``record=``, ``asyncflow run --record``): the format read back, its refusals and
its cut tails, the size budget, ``asyncflow report FILE --at``, and ``asyncflow replay``."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import zlib
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

import asyncflow
from asyncflow import cli, schema
from asyncflow.render import record
from asyncflow.render.record import MAGIC, Frame, Recording, RecordingError, read_recording
from tests.support.commands import ASYNCFLOW, asyncflow_cmd, write
from tests.support.recording import moments
from tests.support.recording import profiled as _profiled

#: the queue of issue 29: full (200 waiting) for its first second, then drained
QUEUE_DEMO = """\
import asyncio


async def main() -> None:
    queue: asyncio.Queue[int] = asyncio.Queue(maxsize=200)
    for i in range(200):
        queue.put_nowait(i)
    await asyncio.sleep(1.0)  # nobody reads yet: the queue stays full
    while not queue.empty():
        queue.get_nowait()
        await asyncio.sleep(0)
    await asyncio.sleep(0.2)


asyncio.run(main())
"""


async def _queue_filled_then_drained() -> None:
    queue: asyncio.Queue[int] = asyncio.Queue(maxsize=50)
    for i in range(50):
        queue.put_nowait(i)
    await moments(3)  # full for at least three of the recording's moments
    while not queue.empty():
        await queue.get()


def test_a_recording_reads_back_its_moments_and_its_end_state(tmp_path: Path) -> None:
    path = tmp_path / "run.afrec"
    final = _profiled(path, _queue_filled_then_drained)
    rec = read_recording(str(path))
    assert rec.notes == []
    assert rec.header["version"] == record.VERSION and rec.header["name"] == "rec"
    assert path.read_bytes().startswith(MAGIC)
    assert len(rec.frames) >= 3 and rec.frames[-1].final
    assert [f.t for f in rec.frames] == sorted(f.t for f in rec.frames)
    # the end state is the final snapshot, section for section
    assert schema.dumps(rec.snapshot()) == schema.dumps(final)

    def depth(index: int) -> int | None:
        channels = rec.snapshot(index).channels
        assert channels is not None
        queues = [c.queue_size for c in channels.channels if c.kind == "asyncio.Queue"]
        return queues[0] if queues else None  # None: not made yet

    depths = [depth(i) for i in range(len(rec.frames))]
    full = depths.index(50)  # full for a while (at least three ticks of 0.1 s)...
    assert rec.snapshot(rec.index_at(rec.frames[full].t + 0.01)) == rec.snapshot(full)
    assert depths[-1] == 0  # ... and drained at the end
    assert rec.index_at(-1.0) == 0 and rec.index_at(1e9) == len(rec.frames) - 1


def test_a_tick_of_the_gap_between_two_moments_lands_on_the_later_one() -> None:
    """A replay plays a moment on by adding the gap to the moment before: with these times,
    0.127229305 + (0.397935541 - 0.127229305) rounds to just under 0.397935541."""
    a, b = 0.127229305, 0.397935541
    assert a + (b - a) < b  # (the rounding this is about)
    rec = Recording("r.afrec", {}, [Frame(0.0, {}), Frame(a, {}), Frame(b, {})])
    assert rec.index_at(a + (b - a)) == 2
    assert rec.index_at(b - 1e-6) == 1  # a microsecond before it is still the moment before


def test_a_newer_format_is_refused_by_number(tmp_path: Path) -> None:
    path = tmp_path / "new.afrec"
    header = {"version": record.VERSION + 1, "asyncflow": "99.0"}
    path.write_bytes(MAGIC + orjson.dumps(header) + b"\n" + zlib.compress(b"{}\n"))
    with pytest.raises(RecordingError) as caught:
        read_recording(str(path))
    assert f"is a recording of format {record.VERSION + 1}, written by asyncflow 99.0" in str(
        caught.value
    )
    assert "upgrade asyncflow to read it" in str(caught.value)
    done = asyncflow_cmd("report", str(path))
    assert done.returncode == 2 and "upgrade asyncflow" in done.stderr, done.stderr
    other = write(tmp_path / "other.afrec", "hello\n")
    with pytest.raises(RecordingError, match="is not an asyncflow recording"):
        read_recording(str(other))


def test_a_cut_tail_is_left_out_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "run.afrec"
    _profiled(path, _queue_filled_then_drained)
    whole = path.read_bytes()
    frames = len(read_recording(str(path)).frames)
    cut = tmp_path / "cut.afrec"
    seen: set[str] = set()
    for keep in range(len(whole) - 1, len(whole) // 2, -max(1, len(whole) // 40)):
        cut.write_bytes(whole[:keep])
        try:
            rec = read_recording(str(cut))
        except RecordingError as exc:
            # cut inside the first moment (all of its sections: the largest by far, the more
            # so in a long test session whose leftovers the documents list): nothing to read
            assert "holds no moment yet" in str(exc)
            seen.add("no moment")
            continue
        if len(rec.frames) == frames:  # only the stream's trailer was cut: every moment is there
            assert rec.frames[-1].final and rec.notes == []
            continue
        assert 1 <= len(rec.frames) < frames
        assert not rec.frames[-1].final
        assert any("no end state" in note for note in rec.notes), rec.notes
        rec.snapshot()  # the last whole moment reads
        seen.update(n.split(" (")[0] for n in rec.notes)
    assert "the recording ends mid-write" in seen  # some cuts fell inside a moment


def test_a_busy_program_stays_within_its_budget(tmp_path: Path) -> None:
    path = tmp_path / "busy.afrec"
    budget = 0.06  # megabytes

    async def busy() -> None:
        # many futures, many calls and a busy queue: every tick changes every section
        futures = [asyncflow.future(name=f"f{i}")(_step) for i in range(60)]
        queue: asyncio.Queue[int] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        end = loop.time() + 1.5
        n = 0
        while loop.time() < end:
            await asyncio.gather(*(f(n) for f in futures))
            queue.put_nowait(n)
            await queue.get()
            n += 1

    _profiled(path, busy, record_budget=budget)
    size = path.stat().st_size
    assert size <= budget * 1_000_000, size
    rec = read_recording(str(path))
    assert rec.frames[-1].final and rec.notes == []
    assert len(rec.frames) >= 3  # detail went before time
    # the big sections were thinned: some moments hold no change to the logs
    assert any("future_logs" not in _line_sections(path, i) for i in range(1, len(rec.frames)))
    assert rec.snapshot().futures.total >= 60
    # a thinned moment says how old its big sections are
    thinned = [f for f in rec.frames if f.stale]
    assert thinned and all(t < f.t for f in thinned for t in f.stale.values())
    assert set(thinned[0].stale) <= record.BIG
    shown = asyncflow_cmd("report", str(path), "--at", f"{thinned[0].t}")
    assert shown.returncode == 0 and "to keep the recording within its budget" in shown.stderr


async def _step(n: int) -> int:
    await asyncio.sleep(0)
    return n


def _line_sections(path: Path, index: int) -> set[str]:
    """The sections written on the recording's line ``index`` (those that changed)."""
    body = path.read_bytes().partition(b"\n")[2]
    line = zlib.decompressobj().decompress(body).split(b"\n")[index]
    sections: dict[str, Any] = orjson.loads(line)["s"]
    return set(sections)


def test_report_at_shows_the_queue_as_it_was_and_the_end_drained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    program = write(tmp_path / "demo.py", QUEUE_DEMO)
    path = tmp_path / "demo.afrec"
    done = asyncflow_cmd(
        "run", "--record", str(path), "--port", "0", "--format", "none", str(program)
    )
    assert done.returncode == 0, done.stderr
    assert path.stat().st_size < 5_000_000

    def report(*args: str) -> tuple[int, str, str]:
        """``asyncflow report`` in this process (the command's own main())."""
        code = cli.main(["report", *args])
        out, err = capsys.readouterr()
        return code, out, err

    def queue_row(*args: str) -> tuple[list[str], str]:
        code, out, err = report(str(path), *args)
        assert code == 0, err
        row = next(line for line in out.splitlines() if line.startswith("demo.py:5"))
        return row.split(), err

    # the program starts a while after the profile (later on the pure-Python path): the queue
    # is full from its first moment for a second
    rec = read_recording(str(path))
    made = next(f.t for f in rec.frames if f.sections["channels"]["channels"])
    at, said = queue_row("--at", f"{made + 0.3:.2f}")
    assert "200/200" in at and at[3] == "0", at  # 200 waiting, none received yet
    assert "the moment at " in said, said
    end, said = queue_row()
    assert "0/200" in end and end[3] == "200", end
    assert "the end state" in said
    code, out, err = report(
        str(path), "--between", f"{made:.2f}", f"{made + 0.8:.2f}", "--format", "json"
    )
    assert code == 0, err
    assert [w["kind"] for w in orjson.loads(out)["warnings"]] == ["channel-unread"]
    # --at on a file that is no recording, a moment past the end, a moment before the start
    snap = tmp_path / "snap.json"
    snap.write_text(report(str(path), "--format", "json")[1])
    code, _, err = report(str(snap), "--at", "1")
    assert code == 2 and "is not a recording" in err, err
    code, _, err = report(str(path), "--at", "99")
    assert code == 0 and "past the recording's end" in err
    code, _, err = report(str(path), "--at", "-1")
    assert code == 2 and "is not seconds" in err
    code, _, err = report(str(path), "--between", "2", "1")
    assert code == 2 and "A must not be after B" in err


def test_a_killed_program_leaves_a_readable_recording(tmp_path: Path) -> None:
    program = write(
        tmp_path / "forever.py",
        "import asyncio, sys\n\nasync def main():\n    while True:\n"
        "        await asyncio.sleep(0.01)\n\nasyncio.run(main())\n",
    )
    path = tmp_path / "killed.afrec"
    child = subprocess.Popen(
        [*ASYNCFLOW, "run", "--record", str(path), "--port", "0", str(program)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        for _ in range(400):  # bounded: 20 s at most
            if path.exists() and _main_recorded(path):
                break
            try:
                child.wait(timeout=0.05)  # the program runs until it is killed
            except subprocess.TimeoutExpired:
                continue
            assert child.stderr is not None
            pytest.fail(f"the program ended by itself: {child.stderr.read()!r}")
        else:
            pytest.fail("the recording never got a moment with main running")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        assert child.stderr is not None
        child.stderr.close()
    rec = read_recording(str(path))
    assert len(rec.frames) >= 2 and not rec.frames[-1].final
    assert any("no end state" in n for n in rec.notes)
    shown = asyncflow_cmd("report", str(path))
    assert shown.returncode == 0 and "no end state" in shown.stderr
    assert "main" in shown.stdout


def _main_recorded(path: Path) -> bool:
    """Whether a whole moment of the recording, and one after it, has main's call (the
    program starts a while after the profiler, longer on a loaded machine)."""
    body = path.read_bytes().partition(b"\n")[2]
    lines = zlib.decompressobj().decompress(body).split(b"\n")[:-1]
    seen = [i for i, line in enumerate(lines) if b'"label":"main"' in line]
    return bool(seen) and len(lines) > seen[0] + 1


def test_record_refuses_a_path_it_cannot_write(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="record="):
        asyncflow.profile("x", record=str(tmp_path / "no" / "such" / "dir.afrec"), port=None)
    with pytest.raises(ValueError, match="record_budget=0: expected megabytes"):
        asyncflow.profile("x", record=str(tmp_path / "a.afrec"), record_budget=0, port=None)


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return "asyncio", {"debug": False}  # textual under asyncio's debug mode is 3x slower


async def test_replay_steps_through_the_moments_and_jumps_to_a_finding(tmp_path: Path) -> None:
    from asyncflow.render.replay import ReplayApp

    path = tmp_path / "run.afrec"
    await anyio.to_thread.run_sync(_profiled, path, _queue_filled_then_drained)
    rec = read_recording(str(path))
    app = ReplayApp(rec, interval=3600)  # the tests play explicitly: the timer never fires
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.press("c")
        await pilot.pause()
        assert app.source.index == 0
        assert "❚❚ paused · " in app.replay_line()
        first = app.source.index
        await pilot.press("right")
        await pilot.pause()
        assert app.source.index == first + 1
        assert f"moment {first + 2}/{len(rec.frames)}" in app.replay_line()
        await pilot.press("end")
        await pilot.pause()
        assert app.source.index == len(rec.frames) - 1 and "(end state)" in app.replay_line()
        (row,) = [r for r in app.table_text() if r[0].startswith("test_record.py")]
        assert row[1] == "0/50"  # drained at the end
        await pilot.press("home")
        await pilot.pause()
        await pilot.press("n")  # the first moment the queue's finding holds
        await pilot.pause()
        assert app.source.index in rec.findings_start()
        (row,) = [r for r in app.table_text() if r[0].startswith("test_record.py")]
        assert row[1] == "50/50"
        await pilot.press("left")
        await pilot.pause()
        assert app.error is None
        at = app.source.index
        await pilot.press("space")
        assert app.playing and "▶ playing" in app.replay_line()
        app.interval = rec.frames[at + 1].t - rec.frames[at].t
        await app._play()  # the timer's tick: the next moment's time later
        assert app.source.index > at
        await pilot.press("space")
        assert not app.playing


@pytest.mark.parametrize("how", ["spawn", "os.fork"])
def test_each_child_records_beside_the_parents_recording(tmp_path: Path, how: str) -> None:
    from tests.test_children import CHILDREN

    script = write(tmp_path / "app.py", CHILDREN)
    path = tmp_path / "run.afrec"
    done = asyncflow_cmd(
        "run", "--record", str(path), "--format", "none", str(script), how, cwd=tmp_path
    )
    assert done.returncode == 3, done.stderr  # the child's exit code, passed on
    role = "fork-1" if how == "os.fork" else "process-1"
    parent, child = read_recording(str(path)), read_recording(str(tmp_path / f"run.{role}.afrec"))
    assert parent.header["name"] == "app" and parent.frames[-1].final
    assert child.header["name"] == f"app/{role}" and child.frames[-1].final
    labels = {f.label for f in child.snapshot().futures.futures if f.call_count}
    assert {"child_main", "crunch"} <= labels, labels
    called = {f.label for f in parent.snapshot().futures.futures if f.call_count}
    assert "parent_main" in called and "child_main" not in called  # each its own


def test_findings_that_are_not_a_list_are_a_bad_recording(tmp_path: Path) -> None:
    """A recording made or changed by hand whose moments' findings are not a list is said to
    be one this asyncflow cannot read, for every command and option that reads findings across
    moments (not a TypeError), exit 2 as for any bad input."""
    path = tmp_path / "run.afrec"
    _profiled(path, _queue_filled_then_drained)
    head, _, body = path.read_bytes().partition(b"\n")
    moments = [orjson.loads(line) for line in zlib.decompress(body).split(b"\n") if line]
    for moment in moments:
        moment["s"]["warnings"] = 5
    lines = b"\n".join(orjson.dumps(m) for m in moments) + b"\n"
    path.write_bytes(head + b"\n" + zlib.compress(lines))
    with pytest.raises(RecordingError, match=r"Snapshot\.warnings: expected a list, got int"):
        read_recording(str(path)).findings_start()
    for args in (["report", str(path)], ["report", str(path), "--between", "0", "1"]):
        done = asyncflow_cmd(*args)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr and "Snapshot.warnings" in done.stderr


def test_a_recording_damaged_before_its_first_moment_says_so(tmp_path: Path) -> None:
    """One flipped byte early in the compressed body: not 'the program stopped at its
    start?', which would send the user looking at the program."""
    path = tmp_path / "run.afrec"
    _profiled(path, _queue_filled_then_drained)
    data = bytearray(path.read_bytes())
    data[data.index(b"\n") + 40] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(RecordingError, match="is damaged: not one of its moments reads"):
        read_recording(str(path))
