"""The program's own coroutine functions as futures, under ``asyncflow run``, with no code change.

A web framework registers a route handler when the module defining it runs (``@app.get(...)``),
so a handler can only be tracked if it is wrapped when it is *created*. While
:func:`track_own_code` is on, the modules of the program's own code (under its directories, never
the standard library, site-packages or asyncflow) and the script ``asyncflow run`` runs are
compiled from an abstract syntax tree in which every ``async def`` that is not an async generator
gets one more decorator, innermost: :func:`_own`, which is ``@asyncflow.future`` (so each call is
tracked exactly as a decorated one is) unless ``--include``/``--exclude`` leave the function out.
Only decorators are added, with the ``def``'s own position: line numbers, tracebacks, names,
signatures and the source ``inspect`` reads are the file's. The code compiled is never written
to ``__pycache__`` (and no cached bytecode is read for these modules): a later plain run gets the
file's own code.

A function already decorated by a decorator named ``future`` (``@asyncflow.future``,
``@future(name=...)``) is left to it: the program asked for its own label or options.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import importlib.machinery
import importlib.util
import inspect
import os
import site
import sys
import sysconfig
import threading
import types
from collections.abc import Iterable, Sequence
from typing import Any

from asyncflow.instrumentation import _session, futures
from asyncflow.schema import OWN_CODE

__all__ = [
    "OWN_CODE",
    "OwnCodeTracking",
    "OwnFunction",
    "compile_source",
    "program_roots",
    "track_loaded",
    "track_own_code",
    "transform",
]

#: the name the added decorator is looked up by (in builtins: no module's namespace changes)
DECORATOR = "__asyncflow_own_code__"
#: the name each of the program's own decorators of such a function is passed through
GUARD = "__asyncflow_own_code_guard__"
#: the class decorator that tracks a class's methods once the class exists
CLASS_DECORATOR = "__asyncflow_own_code_class__"

_lock = threading.Lock()
#: the handles on now; the finder and the decorator act while there is one
_handles: list[OwnCodeTracking] = []
#: finding a module's spec on this thread now (the finders asked in turn may ask again)
_finding = threading.local()


class OwnFunction(futures.FutureFunction):  # type: ignore[type-arg]
    """What a coroutine function of the program's own code becomes: a decorated function
    (``@asyncflow.future``'s) that passes for a function where a framework asks
    ``isinstance(f, types.FunctionType)``/``inspect.isfunction(f)`` (Starlette's ``Route``
    treats anything else as an ASGI app, pydantic refuses it), with the function's
    ``__globals__``, ``__closure__`` and ``__builtins__``."""

    __slots__ = ()

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # (what isinstance() reads when the type is not the one)
        return types.FunctionType


if futures.accelerated and issubclass(OwnFunction, futures._speedups.FunctionBase):
    futures._speedups.calls_without_method(OwnFunction)  # called in C, as its base is


def _own(fn: Any) -> Any:
    """The decorator added to each ``async def`` of the program's own code: tracks it as
    ``@asyncflow.future`` does, unless no tracking is on or the filters leave it out. Never
    fails: anything unexpected gives the function back as it is."""
    if not _handles or type(fn) is not types.FunctionType:
        return fn
    try:
        if not fn.__code__.co_flags & inspect.CO_COROUTINE:
            return fn
        target = futures.task_filter  # --include/--exclude, while a profiler with them runs
        admits = getattr(target, "admits", None)
        if admits is not None and not admits(str(fn.__module__), fn.__qualname__):
            return fn
        tracked = futures.future(fn)
        if type(tracked) is not futures.FutureFunction:
            return tracked  # (asyncflow is disabled: the function itself)
        record = tracked.future_record
        if record.tracked_by == "decorator":
            record.tracked_by = OWN_CODE  # one definition, one future: set once, same each time
        tracked.__class__ = OwnFunction  # (the same layout: made by future(), as it makes any)
        tracked.__dict__.update(
            __globals__=fn.__globals__,
            __closure__=fn.__closure__,
            __builtins__=getattr(fn, "__builtins__", builtins.__dict__),  # (3.10+ has it)
        )
        return tracked
    except Exception as err:  # observing never breaks the program: it runs untracked
        _session.internal_error("tracking a coroutine function of the program's own code", err)
        return fn


def _guard(decorator: Any) -> Any:
    """What a decorator of the program's becomes on a function that the own-code decorator
    tracks: the decorator itself, unless it refuses the tracked function. A decorator that
    demands a plain function (pydantic's ``validate_call``: "should be applied to functions")
    is given the function itself instead, as it would be without asyncflow (which leaves it
    untracked); an error it raises for that too is the program's own, raised as it would be."""

    def guarded(fn: Any) -> Any:
        if type(fn) is not OwnFunction:
            return decorator(fn)
        try:
            return decorator(fn)
        except Exception:
            pass  # (given the plain function below, outside this handler: no context of ours)
        return decorator(fn.__wrapped__)

    return guarded


def _own_class(cls: Any) -> Any:
    """The class decorator added to a class of the program's own code that has coroutine
    methods: tracks each (plain, static or class method) defined in its body, as the
    own-code decorator does, once the class exists. Never fails: a class that refuses the new
    attribute keeps its method, untracked."""
    if not _handles or not isinstance(cls, type):
        return cls
    try:
        prefix = cls.__qualname__ + "."
        for name, value in list(vars(cls).items()):
            kind = type(value)
            fn = value.__func__ if kind in (staticmethod, classmethod) else value
            if (
                type(fn) is not types.FunctionType
                or fn.__code__.co_qualname != prefix + fn.__code__.co_name
            ):
                continue  # not a function of this class's own body
            tracked = _own(fn)
            if tracked is not fn:
                try:
                    setattr(cls, name, kind(tracked) if fn is not value else tracked)
                except Exception:  # (its metaclass refuses: the method stays as it is)
                    continue
    except Exception as err:  # observing never breaks the program: the methods stay untracked
        _session.internal_error("tracking the coroutine methods of a class of the program's", err)
    return cls


def _asks_by_name(node: ast.AsyncFunctionDef) -> bool:
    """Whether a decorator named ``future`` is on it (``asyncflow.future``, ``future(name=x)``)."""
    for decorator in node.decorator_list:
        if isinstance(decorator, ast.Call):
            decorator = decorator.func
        if isinstance(decorator, ast.Name) and decorator.id == "future":
            return True
        if isinstance(decorator, ast.Attribute) and decorator.attr == "future":
            return True
    return False


def _yields(node: ast.AsyncFunctionDef) -> bool:
    """Whether the function's own body yields (an async generator), nested scopes aside."""
    todo: list[ast.AST] = list(node.body)
    while todo:
        child = todo.pop()
        if isinstance(child, (ast.Yield, ast.YieldFrom)):
            return True
        if isinstance(
            child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
        ):  # their own scopes: only what decorates them or gives defaults runs here
            todo.extend(getattr(child, "decorator_list", ()))
            arguments = getattr(child, "args", None)
            if arguments is not None:
                todo.extend(d for d in (*arguments.defaults, *arguments.kw_defaults) if d)
            continue
        todo.extend(ast.iter_child_nodes(child))
    return False


def _guarded(decorator: ast.expr) -> ast.expr:
    """``GUARD(decorator)``, where the decorator was."""
    call = ast.Call(func=ast.Name(id=GUARD, ctx=ast.Load()), args=[decorator], keywords=[])
    ast.copy_location(call, decorator)
    ast.copy_location(call.func, decorator)
    call.func.end_lineno, call.func.end_col_offset = decorator.lineno, decorator.col_offset
    return call


#: decorators of a method that only make a descriptor of it or mark it: a method with no other
#: is tracked once its class exists (see _own_class), never while the class is being made
_DESCRIPTORS = frozenset({"staticmethod", "classmethod", "abstractmethod", "override", "final"})


def _name(name: str, node: ast.AST) -> ast.Name:
    """The name, at ``node``'s position (an empty span: the code's lines are its own)."""
    return ast.Name(
        id=name,
        ctx=ast.Load(),
        lineno=getattr(node, "lineno", 1),
        col_offset=getattr(node, "col_offset", 0),
        end_lineno=getattr(node, "lineno", 1),
        end_col_offset=getattr(node, "col_offset", 0),
    )


def _plain_method(node: ast.AsyncFunctionDef) -> bool:
    """Whether a method's decorators are only those of _DESCRIPTORS."""
    for decorator in node.decorator_list:
        name = decorator.attr if isinstance(decorator, ast.Attribute) else None
        name = decorator.id if isinstance(decorator, ast.Name) else name
        if name not in _DESCRIPTORS:
            return False
    return True


class _AddDecorator(ast.NodeTransformer):
    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        # A method is tracked once its class exists, by a class decorator (outermost: the class
        # the program's own decorators made): a metaclass that checks what the class body holds
        # (pydantic's: every attribute must be a field or a function) sees the functions.
        later = [
            child
            for child in node.body
            if isinstance(child, ast.AsyncFunctionDef) and _plain_method(child)
        ]
        for child in later:
            child.af_later = True  # type: ignore[attr-defined]
        self.generic_visit(node)
        if any(not getattr(child, "af_tracked", True) for child in later):
            where = node.decorator_list[0] if node.decorator_list else node
            node.decorator_list.insert(0, _name(CLASS_DECORATOR, where))
        return node

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        self.generic_visit(node)  # nested functions and classes first
        if _yields(node) or _asks_by_name(node):
            return node
        if getattr(node, "af_later", False):
            node.af_tracked = False  # type: ignore[attr-defined]
            return node
        node.decorator_list = [_guarded(d) for d in node.decorator_list]
        # innermost (applied first, to the function itself), at the def's own position: the
        # code's first line stays the first decorator's or the def's, as it was
        node.decorator_list.append(_name(DECORATOR, node))
        return node


def transform(source: str | bytes, path: str) -> types.CodeType:
    """Compile a module's source as the import system does, every coroutine function in it
    decorated with the own-code decorator.

    Raises:
        SyntaxError: as compiling the source would (the same message and position).
    """
    tree = ast.parse(source, path)
    tree = _AddDecorator().visit(tree)
    # dont_inherit: this module's own __future__ imports are no part of the program's
    code: types.CodeType = compile(tree, path, "exec", dont_inherit=True)
    return code


def compile_source(source: str | bytes, path: str) -> types.CodeType:
    """The main script's code, as ``asyncflow run`` runs it: transformed while own-code tracking
    is on, else exactly ``compile()``'s."""
    if _handles:
        return transform(source, path)
    code: types.CodeType = compile(source, path, "exec", dont_inherit=True)
    return code


def _own_loader(name: str, path: str) -> importlib.machinery.SourceFileLoader:
    """The import system's own loader for the file, whose ``get_code`` compiles the source with
    the own-code decorators: bytecode is neither read nor written, so that no plain run ever
    gets this code from ``__pycache__``. Its type is the one the program would see."""
    loader = importlib.machinery.SourceFileLoader(name, path)

    def get_code(fullname: str) -> types.CodeType:
        return transform(loader.get_data(path), path)

    loader.get_code = get_code  # type: ignore[method-assign]
    return loader


def _real(path: str) -> str:
    return os.path.normcase(os.path.realpath(path))


def _excluded_dirs() -> tuple[str, ...]:
    """Where code is never the program's own: the standard library, site-packages, asyncflow."""
    dirs: set[str] = set()
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        if paths.get(key):
            dirs.add(paths[key])
    with contextlib.suppress(AttributeError):  # (an old virtualenv's site module has none)
        dirs.update(site.getsitepackages())
    if site.ENABLE_USER_SITE and site.USER_SITE:
        dirs.add(site.USER_SITE)
    dirs.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # asyncflow
    return tuple(sorted({_real(d) for d in dirs}))


_INSTALLED = ("site-packages", "dist-packages")


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def program_roots(script: str | None, module: str | None) -> tuple[str, ...]:
    """The program's own code: the script's directory, or the current one and the ``-m``
    module's package (its file, for a plain module), unless that is installed."""
    roots: list[str] = []
    cwd = os.getcwd()
    if script is not None and module is None:
        roots.append(os.path.dirname(os.path.abspath(script)))
    if os.path.dirname(cwd) != cwd:  # never the whole file system
        roots.append(cwd)
    if module is not None:
        try:
            spec = importlib.util.find_spec(module.partition(".")[0])
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            places = list(spec.submodule_search_locations or ())
            if not places and spec.origin and spec.has_location:
                places = [spec.origin]
            roots.extend(places)
    return tuple(dict.fromkeys(_real(r) for r in roots))


class _Finder:
    """First on ``sys.meta_path`` while tracking is on: asks the finders after it, and gives a
    source module of the program's own code a loader that adds the decorators."""

    def __init__(self) -> None:
        self.roots: tuple[str, ...] = ()
        self.excluded: tuple[str, ...] = ()

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if getattr(_finding, "name", None) == name:
            return None  # asked again by a finder we asked: let it go on without us
        _finding.name = name
        try:
            spec = self._find(name, path, target)
        finally:
            _finding.name = None
        if spec is None:
            return None
        try:
            self._adopt(spec)
        except Exception as err:  # observing never breaks the program: the import goes on
            _session.internal_error(f"tracking {name}'s coroutine functions", err)
        return spec  # found once: the finders after us are not asked twice

    def _find(self, name: str, path: Any, target: Any) -> Any:
        finders: Sequence[Any] = list(sys.meta_path)
        for finder in finders[finders.index(self) + 1 :] if self in finders else finders:
            find = getattr(finder, "find_spec", None)
            if find is None or finder is self:
                continue
            spec = find(name, path, target)
            if spec is not None:
                return spec
        return None

    def _adopt(self, spec: Any) -> None:
        loader = spec.loader
        origin = spec.origin
        if (
            type(loader) is not importlib.machinery.SourceFileLoader
            or "exec_module" in vars(loader)  # another hook wraps its run: leave it so
            or not isinstance(origin, str)
            or not origin.endswith(".py")
        ):
            return
        if any(part in _INSTALLED for part in origin.split(os.sep)):
            return  # (most imports: said before resolving the path, which costs system calls)
        real = _real(origin)
        if (
            not _under(real, self.roots)
            or _under(real, self.excluded)
            or any(part in _INSTALLED for part in real.split(os.sep))
        ):
            return
        spec.loader = _own_loader(spec.name, origin)


_finder = _Finder()


class OwnCodeTracking:
    """Handle returned by :func:`track_own_code`; ``undo()`` stops adding the decorators to what
    is imported or defined afterwards (functions tracked already stay tracked)."""

    __slots__ = ("_active", "roots")

    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = roots
        self._active = True

    @property
    def active(self) -> bool:
        """Whether this handle still keeps the tracking on."""
        return self._active

    def undo(self) -> None:
        """Stop (when no other handle keeps it on); idempotent."""
        with _lock:
            if not self._active:
                return
            self._active = False
            _handles.remove(self)
            _sync()


def _sync() -> None:
    """The finder is on ``sys.meta_path`` exactly while a handle is on (under _lock)."""
    _finder.roots = tuple(dict.fromkeys(r for h in _handles for r in h.roots))
    on = _finder in sys.meta_path
    if _handles and not on:
        _finder.excluded = _excluded_dirs()
        sys.meta_path.insert(0, _finder)
    elif not _handles and on:
        sys.meta_path.remove(_finder)


def track_own_code(script: str | None = None, module: str | None = None) -> OwnCodeTracking:
    """Track the program's own coroutine functions as futures, from now on.

    Modules of the program's own code imported afterwards, and the script ``asyncflow run``
    compiles through :func:`compile_source`, have each ``async def`` that is not an async
    generator decorated as ``@asyncflow.future`` would (unless the profiler's
    ``include``/``exclude`` leave it out). Modules imported before are left as they are.

    Args:
        script: the program's script, whose directory is its own code (unless ``module``).
        module: the module run with ``-m``, whose package is its own code (unless installed).

    Returns:
        A handle whose ``undo()`` stops it.
    """
    handle = OwnCodeTracking(program_roots(script, module))
    with _lock:
        # The decorator's name stays once set: a nested function defined after undo() still
        # finds it (and is then left untracked).
        for name, function in ((DECORATOR, _own), (GUARD, _guard), (CLASS_DECORATOR, _own_class)):
            if getattr(builtins, name, None) is not function:
                setattr(builtins, name, function)
        _handles.append(handle)
        _sync()
    main = sys.modules.get("__mp_main__")
    if main is not None and _under(_real(getattr(main, "__file__", None) or "/"), handle.roots):
        track_loaded(main)
    return handle


def track_loaded(module: types.ModuleType) -> int:
    """Track, in place, the coroutine functions a module loaded before the tracking began
    defines at its top level, and the coroutine methods of its classes: each name is bound
    to the tracked function. Returns how many functions were tracked.

    A child that multiprocessing spawns runs the parent's script again as ``__mp_main__``
    before anything of asyncflow's is imported there, compiling it itself (``runpy``): its
    ``async def``\\ s get no decorator. Calls through the module's names (a target calling
    ``serve``, which awaits ``fetch``) are tracked from here on; what the module handed
    elsewhere as it ran (a route table, a callback) keeps the function itself.
    """
    tracked = 0
    try:
        for name, value in list(vars(module).items()):
            if getattr(value, "__module__", None) != module.__name__:
                continue  # imported from elsewhere: that module's
            if isinstance(value, types.FunctionType):  # (a type none can derive from)
                own = _own(value)
                if own is not value:
                    setattr(module, name, own)
                    # (runpy ran it in a namespace of its own, and gave the module a copy:
                    # the functions look their names up there)
                    names: dict[str, Any] = value.__globals__
                    if names.get(name) is value:
                        names[name] = own
                    tracked += 1
            elif isinstance(value, type):
                before = dict(vars(value))
                _own_class(value)
                tracked += sum(vars(value).get(k) is not v for k, v in before.items())
    except Exception as err:  # observing never breaks the program: the rest stays untracked
        _session.internal_error("tracking the coroutine functions of a module already loaded", err)
    return tracked
