"""Where the program created an object, and its label there: one function for every kind that
whole-program mode labels by creation site (queues, locks and the other primitives).

The creating frame is found by walking out from the constructor, past asyncflow's own hooks and
the object's own constructor chain (a subclass's ``__init__`` calling ``super().__init__()``),
never by reading a frame's ``f_locals``: on 3.11 and 3.12 that stores a snapshot of the locals
on the frame, which keeps alive what the frame then deletes (anyio's ``del self  # Break the
reference cycle``). A frame is part of the constructor chain when its code is the ``__init__``
or ``__new__`` of a class in the object's MRO; a ``Pipeline.__init__`` making three queues is
not, and each queue is labelled by its own line there.
"""

from __future__ import annotations

import asyncio
import dis
import os
import sys
import types
import weakref
from typing import Any

__all__ = ["creation_frame", "site_label"]

#: asyncflow's hooks (a patched __init__, the helpers it calls) are no part of a creation site
_OURS = os.path.dirname(__file__) + os.sep
_ASYNCIO_DIR = os.path.dirname(asyncio.__file__) + os.sep
#: anyio's constructor chain: a primitive made through these is the caller's
_ANYIO_CHAIN = frozenset(
    {
        "__new__",
        "__init__",
        "create_lock",
        "create_semaphore",
        "create_capacity_limiter",
        "create_event",
    }
)
_CONSTRUCTORS = ("__init__", "__new__")
#: anyio's directory, once anyio is imported (asyncflow never imports it itself)
_anyio_dir: str | None = None


def _anyio() -> str | None:
    global _anyio_dir
    if _anyio_dir is None:
        anyio = sys.modules.get("anyio")
        path = getattr(anyio, "__file__", None)
        if path:
            _anyio_dir = os.path.dirname(path) + os.sep
    return _anyio_dir


def _constructs(code: types.CodeType, obj: Any) -> bool:
    """Whether ``code`` is the ``__init__`` or ``__new__`` of a class of ``obj`` (its MRO)."""
    name = code.co_name
    for cls in type(obj).__mro__:
        method = cls.__dict__.get(name)
        if isinstance(method, staticmethod):  # __new__
            method = method.__func__
        if getattr(method, "__code__", None) is code:
            return True
    return False


def creation_frame(
    obj: Any, frame: types.FrameType | None, *, library_parts: bool = False
) -> types.FrameType | None:
    """The frame of the code that created ``obj``, walking out from ``frame`` (the constructor's
    caller, or further in): past asyncflow's own frames and ``obj``'s constructor chain.

    Args:
        obj: the object just made (its ``__init__`` has run).
        frame: where to start.
        library_parts: None for an object asyncio or anyio made for its own use (a Condition's
            lock, a Barrier's condition, an anyio Event's asyncio.Event): it is part of the
            primitive that made it. Otherwise a library's object is labelled where the library
            made it, as the program's are.

    Returns:
        The creating frame, or None (a library's part; no frame left).
    """
    anyio_dir = _anyio() if library_parts else None
    while frame is not None:
        code = frame.f_code
        filename = code.co_filename
        name = code.co_name
        if filename.startswith(_OURS) or (name in _CONSTRUCTORS and _constructs(code, obj)):
            frame = frame.f_back
            continue
        if not library_parts:
            return frame
        if anyio_dir is not None and filename.startswith(anyio_dir):
            if name in _ANYIO_CHAIN and name != "__init__":  # create_lock()... on the way
                frame = frame.f_back
                continue
            return None  # made by anyio (an adapter's primitive takes the adapter's record)
        if filename.startswith(_ASYNCIO_DIR):
            return None  # made by asyncio for its own use (a Condition's lock, a Queue's Event)
        return frame
    return None


#: opcodes that call something: a line with more than one of them gets a column in its label
_CALLS = frozenset(
    dis.opmap[name] for name in ("CALL", "CALL_FUNCTION_EX", "CALL_KW") if name in dis.opmap
)
_SITES_KEPT = 1024
#: (id(code), instruction offset) -> (the code, weakly; the label): a site's label is worked out
#: once. Weak, and checked on use, so a freed code object neither stays alive nor is mistaken
#: for a new one at the same address.
_sites: dict[tuple[int, int], tuple[weakref.ref[types.CodeType], str]] = {}


def site_label(frame: types.FrameType) -> str:
    """``file.py:line`` of the call that creates an object, and ``file.py:line:column`` when
    that line makes more than one call (``raw, out = asyncio.Queue(10), asyncio.Queue(5)``):
    the label names the place in the code, so every object made there shares it."""
    code, offset = frame.f_code, frame.f_lasti
    key = (id(code), offset)
    known = _sites.get(key)
    if known is not None and known[0]() is code:
        return known[1]
    line = frame.f_lineno
    label = f"{code.co_filename.rsplit('/', 1)[-1]}:{line}"
    column = None
    calls = 0
    raw = code.co_code
    for index, (start, _, col, _) in enumerate(code.co_positions()):
        if start == line and raw[2 * index] in _CALLS:
            calls += 1
        if 2 * index == offset:
            column = col
    if calls > 1 and column is not None:
        label = f"{label}:{column + 1}"
    if len(_sites) >= _SITES_KEPT:
        _sites.clear()
    _sites[key] = (weakref.ref(code), label)
    return label
