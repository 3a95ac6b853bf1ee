"""The manual's code blocks that show output: found, run as their marker says, and compared.

A block that shows output (a fence with no language, ``text``, ``json`` or ``console``) in
docs/*.md or README.md has a marker on the line above its fence:

``<!-- docs:skip REASON -->``
    it is not run, and the reason says why (a benchmark, a live terminal screen...).
``<!-- docs:run WORDS -->``
    it is run and compared. The words (shell-quoted) say how:

    what is run (one of):
      the block's own ``$ command`` lines (a shell session: the default when it has them);
      ``cmd='...'``: a shell command whose output is the block;
      ``python``: the ``python`` block just above, run as a program;
      ``curl``: the lines of the ``sh`` block just above that ask the endpoint (they name
      ``localhost:`` or ``127.0.0.1``).
    where: ``setup='...'`` runs first (its output is not compared; cached, so that blocks that
      read one run's files share it); ``with=NAME[+NAME]`` starts live programs of
      :data:`LIVE` first (once per name) and points the commands' ports at the first one;
      ``stream=stdout|stderr`` keeps one stream (both, merged, by default).
    how it is compared:
      ``mask=numbers,ports``: the figures that vary (every number; a port after a host) are
      masked; ``mask-re='REGEX'`` masks what a regular expression matches; ``keys=a,b``: in
      JSON, those keys' values; ``lists``: in JSON, a list is compared by its first item;
      ``excerpt``: the block is a run of consecutive lines of the output, not all of it;
      ``lines``: each of its lines (or JSON documents) is in the output, in that order;
      ``sort``: lines are compared in any order (rows sorted by a figure that varies);
      ``reflow``: an item wrapped over several lines (a warning, indented under its first line)
      is compared as one line (where a sentence wraps depends on its figures' widths);
      ``optional='REGEX'``: an item of the block (a line the expression matches, and the lines
      indented under it) may be missing from the output (a warning whose threshold a run may
      just miss); ``extra='REGEX'``: the output may have more such items than the block
      shows (a warning a loaded machine adds).

Always: runs of spaces count as one (columns are as wide as their figures), the checkout's
path reads ``/work/main`` and the interpreter ``.venv/bin/python``, as on the pages, the
report's mention of the pure-Python hot path (the suite runs on both) is left out, and a line
``…`` alone stands for any number of lines. Everything else must match: lines, headers, column
names, row labels, warnings' kinds and words, JSON keys and their order.
"""

from __future__ import annotations

import difflib
import json
import os
import queue
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "LIVE",
    "Block",
    "Spec",
    "Workspace",
    "compare",
    "find_blocks",
    "output_blocks",
]

ROOT = Path(__file__).resolve().parent.parent.parent
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
PROGRAMS = Path(__file__).resolve().parent / "docs_programs"
OUTPUT_LANGS = frozenset({"", "text", "json", "console"})

_FENCE = re.compile(r"^(```+|~~~+)\s*(\S*)")
_MARKER = re.compile(r"^<!-- docs:(run|skip)\b(.*?)-->\s*$")
_ANY_LINES = "…"


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: str  #: the page's path in the checkout (docs/cli.md)
    line: int  #: the line of its opening fence, from 1
    lang: str  #: the fence's language ("" for none; "{directive}" for MyST directives)
    body: str  #: what the fences enclose
    marker: str | None  #: "run" or "skip", from the line above the fence
    words: str  #: the marker's words (the reason of a skip)
    above: Block | None  #: the code block before it on the page (a run's input)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def find_blocks(pages: list[Path] | None = None) -> list[Block]:
    """Every fenced code block of the pages, with the marker above it."""
    found: list[Block] = []
    for page in pages or PAGES:
        lines = page.read_text(encoding="utf-8").split("\n")
        name = str(page.relative_to(ROOT))
        above: Block | None = None
        i = 0
        while i < len(lines):
            opening = _FENCE.match(lines[i])
            if opening is None:
                i += 1
                continue
            fence = opening.group(1)
            end = i + 1
            while end < len(lines) and not lines[end].startswith(fence):
                end += 1
            marked = _MARKER.match(lines[i - 1]) if i > 0 else None
            block = Block(
                page=name,
                line=i + 1,
                lang=opening.group(2),
                body="\n".join(lines[i + 1 : end]),
                marker=marked.group(1) if marked else None,
                words=marked.group(2).strip() if marked else "",
                above=above,
            )
            found.append(block)
            above = block
            i = end + 1
    return found


def output_blocks(pages: list[Path] | None = None) -> list[Block]:
    """The blocks that show output, and those a marker says are to be run."""
    return [b for b in find_blocks(pages) if b.lang in OUTPUT_LANGS or b.marker is not None]


@dataclass(frozen=True)
class Spec:
    """A ``docs:run`` marker's words, read."""

    cmd: str | None = None
    python: bool = False
    curl: bool = False
    setup: str | None = None
    live: tuple[str, ...] = ()
    stream: str = "both"
    masks: tuple[str, ...] = ()
    mask_res: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    lists: bool = False
    mode: str = "whole"  #: "whole", "excerpt" or "lines"
    sort: bool = False
    json: bool = False
    optional: str | None = None  #: items starting with a line this matches may be absent
    reflow: bool = False  #: wrapped items are compared unwrapped
    extra: str | None = None  #: items of the output starting with a line this matches may be more

    @classmethod
    def parse(cls, words: str, lang: str = "") -> Spec:
        """Read a marker's words; an unknown word is an error naming it."""
        values: dict[str, Any] = {"json": lang == "json"}
        mask_res: list[str] = []
        for word in shlex.split(words):
            name, eq, value = word.partition("=")
            if not eq:
                if name in ("python", "curl", "lists", "sort", "json", "reflow"):
                    values[name] = True
                elif name in ("excerpt", "lines"):
                    values["mode"] = name
                else:
                    raise ValueError(f"docs:run: unknown word {word!r}")
            elif name in ("cmd", "setup"):
                values[name] = value
            elif name == "with":
                unknown = [n for n in value.split("+") if n not in LIVE]
                if unknown:
                    raise ValueError(f"docs:run: with={value}: no live program {unknown[0]!r}")
                values["live"] = tuple(value.split("+"))
            elif name == "stream":
                if value not in ("stdout", "stderr", "both"):
                    raise ValueError(f"docs:run: stream={value}: stdout, stderr or both")
                values["stream"] = value
            elif name == "mask":
                masks = tuple(value.split(","))
                unknown = [m for m in masks if m not in _MASKS]
                if unknown:
                    raise ValueError(f"docs:run: mask={value}: no mask {unknown[0]!r}")
                values["masks"] = masks
            elif name == "mask-re":
                re.compile(value)
                mask_res.append(value)
            elif name in ("optional", "extra"):
                re.compile(value)
                values[name] = value
            elif name == "keys":
                values["keys"] = tuple(value.split(","))
            else:
                raise ValueError(f"docs:run: unknown word {word!r}")
        return cls(**values, mask_res=tuple(mask_res))


# -- comparing ---------------------------------------------------------------------------------

_UNIT = r"(?:\s?(?:ns|µs|ms|s|m|h|B|KB|KiB|MB|MiB|GB|GiB)(?![\w/]))?"
_MASKS = {
    # every figure with its unit (1.6 s in one run is 980 ms in the next), but digits glued
    # to a word, which are a name (p50, pdf_1)
    "numbers": (re.compile(r"(?<![A-Za-z_\d])\d(?:[\d,.]*\d)?(?:e[+-]?\d+)?" + _UNIT), "N"),
    # the port after a host name (the live programs bind free ones)
    "ports": (
        re.compile(r"((?:127\.0\.0\.1|localhost|0\.0\.0\.0|evil\.example)[:,]\s?)\d+"),
        r"\1PORT",
    ),
}


def _normal(text: str) -> str:
    """What varies with the checkout, never with the program: its path, the interpreter, and
    the hot path the suite runs on (the report's first line names the pure-Python one)."""
    text = text.replace(" · pure-Python hot path", "")
    return text.replace(sys.executable, ".venv/bin/python").replace(str(ROOT), "/work/main")


def _masked_line(line: str, spec: Spec) -> str:
    for pattern in spec.mask_res:
        line = re.sub(pattern, "X", line)
    for name in spec.masks:
        regex, replacement = _MASKS[name]
        line = regex.sub(replacement, line)
    return re.sub(r"\s+", " ", line).strip()


def _json_documents(text: str) -> list[Any]:
    """The JSON documents of a text, one after another (curl's answers end with no newline)."""
    decoder = json.JSONDecoder()
    documents: list[Any] = []
    at = 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at >= len(text):
            return documents
        if text[at : at + 1] == _ANY_LINES:
            documents.append(_ANY_LINES)
            at += 1
            continue
        document, at = decoder.raw_decode(text, at)
        documents.append(document)


def _json_masked(value: Any, spec: Spec) -> Any:
    if isinstance(value, dict):
        return {k: "X" if k in spec.keys else _json_masked(v, spec) for k, v in value.items()}
    if isinstance(value, list):
        items = value[:1] if spec.lists else value
        return [_json_masked(v, spec) for v in items]
    return value


def _reflowed(lines: list[str]) -> list[str]:
    """Each item on one line: a line indented deeper than the line that begins its item (a
    warning's sentence, wrapped where its figures' widths put the breaks) joins that line; a
    hint (``→ ...``) begins an item, and its own lines at its indent join it."""
    out: list[str] = []
    head = -1  # the indent of the line that began the current item
    arrow = False  # whether that line is a hint
    for line in lines:
        depth = len(line) - len(line.lstrip())
        hint = line.lstrip().startswith("→")
        joins = bool(out and out[-1].strip() and line.strip()) and not hint
        if joins and (depth > head or (arrow and depth == head)):
            out[-1] += " " + line.strip()
            continue
        out.append(line)
        head, arrow = depth, hint
    return out


def _units(text: str, spec: Spec) -> list[str]:
    """The text as the units compared: masked lines, or masked JSON documents."""
    if spec.json:
        units = []
        for document in _json_documents(text):
            if document == _ANY_LINES:
                units.append(_ANY_LINES)
                continue
            dumped = json.dumps(_json_masked(document, spec), ensure_ascii=False, indent=1)
            units.append("\n".join(_masked_line(line, spec) for line in dumped.split("\n")))
        return units
    raw = text.strip("\n").split("\n")
    lines = [_masked_line(line, spec) for line in (_reflowed(raw) if spec.reflow else raw)]
    if not spec.sort:
        return lines
    # rows in any order within each paragraph (a table sorted by a figure that varies)
    paragraphs = "\n".join(lines).split("\n\n")
    return "\n\n".join("\n".join(sorted(p.split("\n"))) for p in paragraphs).split("\n")


def _matches(shown: list[str], actual: list[str]) -> bool:
    """Whether the shown units are the actual ones, a lone ``…`` standing for any number."""
    if not shown:
        return not actual
    if shown[0] == _ANY_LINES:
        return any(_matches(shown[1:], actual[i:]) for i in range(len(actual) + 1))
    return bool(actual) and shown[0] == actual[0] and _matches(shown[1:], actual[1:])


def _in_order(shown: list[str], actual: list[str]) -> bool:
    rest = iter(actual)
    return all(any(unit == seen for seen in rest) for unit in shown if unit != _ANY_LINES)


def _without_optional(shown: str, pattern: str) -> str:
    """The shown text without the items (a line and the lines indented under it) that start
    with a line the pattern matches."""
    kept: list[str] = []
    indent = None  # the indent of the item being left out
    for line in shown.split("\n"):
        depth = len(line) - len(line.lstrip())
        if indent is not None and line.strip() and depth > indent:
            continue
        indent = depth if re.search(pattern, line) else None
        if indent is None:
            kept.append(line)
    return "\n".join(kept)


def _agrees(want: list[str], got: list[str], mode: str) -> bool:
    if mode == "whole":
        return _matches(want, got)
    if mode == "excerpt":
        return any(_matches([*want, _ANY_LINES], got[i:]) for i in range(len(got) + 1))
    return _in_order(want, got)


def compare(shown: str, actual: str, spec: Spec) -> str | None:
    """None when the output is what the block shows, masks aside; else a diff saying how not."""
    want = _units(shown, spec)
    got = _units(_normal(actual), spec)
    wants = [want]
    if spec.optional:
        wants.append(_units(_without_optional(shown, spec.optional), spec))
    gots = [got]
    if spec.extra:
        gots.append(_units(_without_optional(_normal(actual), spec.extra), spec))
    if any(_agrees(w, g, spec.mode) for w in wants for g in gots):
        return None
    diff = difflib.unified_diff(
        "\n".join(want).split("\n"), "\n".join(got).split("\n"), "shown", "printed", lineterm=""
    )
    lines = list(diff)
    cut = [f"... ({len(lines) - 80} more lines of diff)"] if len(lines) > 80 else []
    return f"({spec.mode}) masked, shown vs printed now:\n" + "\n".join(lines[:80] + cut)


# -- running -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Live:
    """A program that keeps its endpoint up while blocks ask it."""

    argv: tuple[str, ...]  #: run in the workspace; "python" is this interpreter
    ready: str  #: a line it prints once it can be asked
    env: tuple[tuple[str, str], ...] = ()
    linger: bool = False  #: run under ``asyncflow run`` by a script that waits at the end
    flags: tuple[str, ...] = ()  #: ``asyncflow run``'s options, when it lingers
    asked: tuple[str, str] | None = None  #: then, until the endpoint's PATH answers TEXT


# A script that runs a program (an example), then waits, under `asyncflow run`: its endpoint
# stays up to be asked, as "a script that ran it, then slept" on the pages.
_LINGER = """\
import runpy, sys, time
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit:
    pass
print("lingering", flush=True)
time.sleep(600)
"""

LIVE: dict[str, Live] = {
    "crawler": Live(("python", "examples/crawler.py", "--linger", "90"), "endpoint stays up"),
    "pipeline-token": Live(
        (
            "python",
            "-m",
            "asyncflow",
            "run",
            "--port",
            "0",
            "examples/pipeline.py",
            "--pages",
            "200000",
        ),
        "endpoint: ",
        env=(("ASYNCFLOW_TOKEN", "s3cr3t"),),
    ),
    "pool": Live(  # stuck once its health check waits on the exhausted pool
        ("python", "examples/connection_pool.py", "--linger", "90"),
        "stuck for",
        asked=("/tasks", '"health-check"'),
    ),
    "thumbs": Live(("python", "thumbs.py"), "waiting"),  # tests/support/docs_programs/
    "shop": Live(("examples/shop_timing.py",), "lingering", linger=True),
    "pipeline": Live(
        (str(ROOT / "examples" / "pipeline.py"),),
        "lingering",
        linger=True,
        flags=("--trace", "pipeline-live.json"),
    ),
}


@dataclass
class _Started:
    process: subprocess.Popen[str]
    url: str
    lines: list[str] = field(default_factory=list)


class Workspace:
    """A scratch directory where the pages' commands run as a user's would: ``asyncflow`` and
    ``python`` on the PATH, ``examples/`` and the programs of ``docs_programs/`` beside them,
    no ASYNCFLOW_* variable of the test run (but the hot path's), free ports, and a directory
    of running profilers of its own."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="asyncflow-docs-"))
        (self.dir / "examples").symlink_to(ROOT / "examples")
        (self.dir / "benchmarks").symlink_to(ROOT / "benchmarks")
        for program in PROGRAMS.glob("*.py"):  # programs a page describes, not in examples/
            (self.dir / program.name).symlink_to(program)
        bin_dir = self.dir / "bin"
        bin_dir.mkdir()
        for name, target in (("python", ""), ("python3", ""), ("asyncflow", " -m asyncflow")):
            shim = bin_dir / name
            shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)}{target} "$@"\n')
            shim.chmod(0o755)
        (self.dir / "linger.py").write_text(_LINGER)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCFLOW_")}
        if os.environ.get("ASYNCFLOW_NO_EXTENSIONS"):
            env["ASYNCFLOW_NO_EXTENSIONS"] = os.environ["ASYNCFLOW_NO_EXTENSIONS"]
        env.update(
            PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
            PYTHONUNBUFFERED="1",  # stdout and stderr interleave as on a terminal
            ASYNCFLOW_PORT="0",
            ASYNCFLOW_RUNTIME_DIR=str(self.dir / "run"),
            COLUMNS="200",
        )
        self.env = env
        self._runs: dict[tuple[str, ...], str] = {}
        self._live: dict[tuple[str, ...], list[_Started]] = {}

    def close(self) -> None:
        for group in self._live.values():
            for started in group:
                started.process.kill()
                started.process.wait(10)
                if started.process.stdout is not None:
                    started.process.stdout.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _command(self, text: str) -> str:
        """A page's command as typed here: `.venv/bin/python` is this interpreter."""
        return text.replace(".venv/bin/python", "python")

    def run(self, command: str, spec: Spec, env: dict[str, str] | None = None) -> str:
        """What the shell command prints (cached: blocks that show one run share it)."""
        key = (command, spec.stream, *spec.live)
        if key not in self._runs:
            streams: dict[str, Any] = {
                "both": {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT},
                "stdout": {"stdout": subprocess.PIPE, "stderr": subprocess.DEVNULL},
                "stderr": {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE},
            }[spec.stream]
            done = subprocess.run(
                ["bash", "-c", self._command(command)],
                cwd=self.dir,
                env=env or self.env,
                text=True,
                timeout=180,
                **streams,
            )
            self._runs[key] = done.stdout if spec.stream != "stderr" else done.stderr
        return self._runs[key]

    def live(self, names: tuple[str, ...]) -> list[_Started]:
        """The live programs, started on first use (in a directory of profilers of their own,
        so that `asyncflow ps` lists them and only them)."""
        if names in self._live:
            return self._live[names]
        runtime = self.dir / ("run-" + "+".join(names))
        runtime.mkdir()
        group: list[_Started] = []
        self._live[names] = group
        for name in names:
            live = LIVE[name]
            argv = [sys.executable if a == "python" else a for a in live.argv]
            if live.linger:
                run = [sys.executable, "-m", "asyncflow", "run", "--port", "0", *live.flags]
                argv = [*run, "linger.py", *argv]
            env = {**self.env, **dict(live.env), "ASYNCFLOW_RUNTIME_DIR": str(runtime)}
            process = subprocess.Popen(
                argv,
                cwd=self.dir,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            started = _Started(process, "")
            group.append(started)
            self._wait(started, live.ready, name)
            if live.asked is not None:
                self._ask_until(started.url + live.asked[0], live.asked[1], name)
        return group

    @staticmethod
    def _ask_until(url: str, text: str, name: str) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with urllib.request.urlopen(url, timeout=10) as response:
                if text in response.read().decode():
                    return
            time.sleep(0.05)  # the program's own pace: nothing to wait on but its endpoint
        raise AssertionError(f"{name}: {url} did not answer {text} within 60 s")

    def _wait(self, started: _Started, ready: str, name: str) -> None:
        lines: queue.Queue[str | None] = queue.Queue()

        def read() -> None:
            assert started.process.stdout is not None
            for line in started.process.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + 60
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{name} did not print {ready!r} within 60 s") from None
            if line is None:
                raise AssertionError(f"{name} exited before {ready!r}: {started.lines}")
            started.lines.append(line)
            found = re.search(r"endpoint: (http://\S+)", line)
            if found:
                started.url = found.group(1)
            if ready in line and started.url:
                return

    def output(self, block: Block, spec: Spec) -> str:
        """What the block's commands print now (the workspace's path reads as the checkout's:
        `examples/` is linked there)."""
        return self._output(block, spec).replace(str(self.dir), str(ROOT))

    def _output(self, block: Block, spec: Spec) -> str:
        env = None
        port = ""
        if spec.live:
            group = self.live(spec.live)
            port = group[0].url.rsplit(":", 1)[1]
            env = {
                **self.env,
                "ASYNCFLOW_RUNTIME_DIR": str(self.dir / ("run-" + "+".join(spec.live))),
            }

        def aimed(command: str) -> str:  # a page's port is the live program's
            return re.sub(r"(?<=[:,])\d{4,5}\b", port, command) if port else command

        if spec.setup is not None:
            self.run(spec.setup, Spec(), env)
        session = [line[2:] for line in block.body.split("\n") if line.startswith("$ ")]
        if spec.cmd is not None:  # how the block's one `$ command` (if any) is run here
            assert len(session) <= 1, f"{block.where}: cmd= stands for one $ command"
            typed = [f"$ {command}" for command in session]
            return "\n".join([*typed, self.run(aimed(spec.cmd), spec, env)])
        if spec.python:
            assert block.above is not None and block.above.lang == "python", block.where
            script = self.dir / f"block-{block.line}.py"
            script.write_text(block.above.body)
            return self.run(f"python {script.name}", spec, env)
        if spec.curl:
            assert block.above is not None and block.above.lang == "sh", block.where
            asks = [
                line
                for line in block.above.body.split("\n")
                if "localhost:" in line or "127.0.0.1" in line
            ]
            return "\n".join(self.run(aimed(line), spec, env).rstrip("\n") for line in asks)
        assert session, f"{block.where}: docs:run with nothing to run"
        printed = []
        for command in session:
            printed.append(f"$ {command}")
            printed.append(self.run(aimed(command.split("  #")[0]), spec, env).rstrip("\n"))
        return "\n".join(printed)


def main(argv: list[str]) -> int:
    """``python -m tests.support.docs_blocks PAGE:LINE...``: what each block's command prints
    now, unmasked, to paste into the page when the block is stale."""
    blocks = {b.where: b for b in output_blocks()}
    space = Workspace()
    try:
        for where in argv:
            block = blocks[where]
            print(f"--- {where}", flush=True)
            print(_normal(space.output(block, Spec.parse(block.words, block.lang))).rstrip("\n"))
    finally:
        space.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
