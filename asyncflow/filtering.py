"""Target filtering for whole-program mode: which tasks' coroutines become tracked futures.

``include``/``exclude`` patterns (``--include 'myapp.*'``, ``ASYNCFLOW_EXCLUDE='aiohttp'``,
``profile(..., exclude=["aiohttp.*"])``) are matched against the module that defines a task's
coroutine function and its qualified name. The decision is taken once per code object, when the
first task running it is created, and cached: a filtered-out task then costs the task factory
one call and one dictionary lookup, and is never wrapped (its polls cost nothing).

Filters apply to tasks tracked by ``instrument_tasks`` (and ``asyncflow run``) only: a coroutine
decorated with ``@asyncflow.future`` or passed to ``asyncflow.instrument`` was asked for by name
and is always tracked.
"""

from __future__ import annotations

import fnmatch
import re
import types
import weakref
from collections.abc import Iterable
from typing import Any

__all__ = ["TargetFilter", "matches", "parse_patterns"]

#: the characters that make a pattern a glob; without them a pattern names a module or package
#: (and everything in it) or a qualified name exactly
_GLOB = re.compile(r"[*?\[]")
#: the most patterns one filter takes, and the longest pattern
MAX_PATTERNS = 256
MAX_PATTERN = 1000


def parse_patterns(value: object, source: str) -> tuple[str, ...]:
    """Patterns from an option: a comma-separated string, or an iterable of strings.

    Raises:
        ValueError: not strings, an empty pattern list, one too long, or a malformed pattern;
            the message names ``source``.
    """
    if isinstance(value, str):
        items: list[object] = [p.strip() for p in value.split(",")]
        items = [p for p in items if p]
    elif isinstance(value, Iterable) and not isinstance(value, (bytes, bytearray)):
        items = list(value)
    else:
        raise ValueError(
            f"{source}={value!r}: expected module or qualified-name patterns, such as "
            "'myapp.*,worker.run' (a string) or a list of them"
        )
    if not items:  # given, but naming nothing: a mistake, not "every task"
        raise ValueError(
            f"{source}={value!r}: names no pattern; give one, such as 'myapp.*', or leave "
            "the option out to track every task"
        )
    patterns: list[str] = []
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise ValueError(f"{source}: patterns are non-empty strings, got {item!r}")
        pattern = item.strip()
        if len(pattern) > MAX_PATTERN or not pattern.isprintable() or " " in pattern:
            raise ValueError(
                f"{source}: {pattern[:40]!r} is not a module or qualified-name pattern "
                f"(printable, no spaces, at most {MAX_PATTERN} characters)"
            )
        _check_sets(pattern, source)
        patterns.append(pattern)
    if len(patterns) > MAX_PATTERNS:
        raise ValueError(f"{source}: at most {MAX_PATTERNS} patterns, got {len(patterns)}")
    return tuple(dict.fromkeys(patterns))  # in order, without repeats


def _check_sets(pattern: str, source: str) -> None:
    """Refuse a ``[`` that opens no character set and a ``]`` that closes none, read as
    fnmatch reads them (``[]x]`` and ``[!]x]`` are sets holding ``]``): fnmatch would take
    them as literal characters, which no module or qualified name contains."""
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "]":
            raise ValueError(
                f"{source}: {pattern!r} has a ']' without its '[' (a glob's character set)"
            )
        if c != "[":
            continue
        j = i + 1 if i < n and pattern[i] == "!" else i
        if j < n and pattern[j] == "]":
            j += 1  # a ']' first in the set is one of its characters
        end = pattern.find("]", j)
        if end < 0:
            raise ValueError(f"{source}: {pattern!r} has an unclosed '[' (a glob's character set)")
        i = end + 1


def _names(module: str, qualname: str) -> tuple[str, str, str]:
    return module, f"{module}.{qualname}", f"{module}:{qualname}"


def matches(pattern: str, module: str, qualname: str) -> bool:
    """Whether ``pattern`` names a coroutine function of ``module`` called ``qualname``.

    A glob (``*``, ``?``, ``[...]``) matches the module (``aiohttp.*`` matches
    ``aiohttp.web_protocol``), the dotted ``module.qualname`` (``myapp.Worker.*``) or
    ``module:qualname`` (``*:Worker.run``). A plain name matches a module and everything in it
    (``aiohttp`` matches ``aiohttp`` and ``aiohttp.web_protocol``) or one function
    (``myapp.jobs.run``, ``__main__:main``).
    """
    names = _names(module, qualname)
    if _GLOB.search(pattern):
        return any(fnmatch.fnmatchcase(name, pattern) for name in names)
    prefix = pattern + "."
    return any(name == pattern or name.startswith(prefix) for name in names)


class TargetFilter:
    """Decides, once per code object, whether tasks running it are tracked.

    A task is tracked when ``include`` is empty or one of its patterns matches, and none of
    ``exclude`` matches: exclude wins.
    """

    __slots__ = ("_decided", "_refs", "exclude", "include", "rejected")

    def __init__(self, include: Iterable[str] = (), exclude: Iterable[str] = ()) -> None:
        self.include = tuple(include)
        self.exclude = tuple(exclude)
        #: id(code) -> whether it is tracked; an entry leaves with its code object
        self._decided: dict[int, bool] = {}
        self._refs: dict[int, weakref.ref[types.CodeType]] = {}
        #: code objects decided against so far (the document shows how much was left out)
        self.rejected = 0

    def __bool__(self) -> bool:
        return bool(self.include or self.exclude)

    def admits(self, module: str, qualname: str) -> bool:
        """Whether a coroutine function ``qualname`` of ``module`` is tracked."""
        if self.include and not any(matches(p, module, qualname) for p in self.include):
            return False
        return not any(matches(p, module, qualname) for p in self.exclude)

    def __call__(self, coro: Any) -> bool:
        """The task factory's hook: whether the task running ``coro`` is tracked (cached)."""
        code = coro.cr_code
        decided = self._decided.get(id(code))
        if decided is not None:
            return decided
        return self._decide(coro, code)

    def _decide(self, coro: Any, code: types.CodeType) -> bool:
        frame = coro.cr_frame
        module = frame.f_globals.get("__name__", "?") if frame is not None else "?"
        decided = self.admits(str(module), code.co_qualname)
        key = id(code)
        decided_map, refs = self._decided, self._refs

        def forget(_: object) -> None:  # the code object is gone: its id may be reused
            decided_map.pop(key, None)
            refs.pop(key, None)

        refs[key] = weakref.ref(code, forget)
        decided_map[key] = decided
        if not decided:
            self.rejected += 1
        return decided
