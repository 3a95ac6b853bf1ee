"""What was there before asyncflow: imported first by ``asyncflow/__init__.py``."""

import sys

#: the modules loaded before asyncflow's own: ``asyncflow run`` tells which of the others a
#: module of the program would have replaced, run plainly
MODULES_BEFORE = frozenset(sys.modules)


def _run_as_python_m() -> bool:
    """Whether this is ``python -m asyncflow``, the package being imported to run it."""
    argv = getattr(sys, "orig_argv", [])
    return (
        sys.argv[:1] == ["-m"]  # (what runpy sets while it imports the package to run)
        and "-m" in argv
        and argv[argv.index("-m") + 1 : argv.index("-m") + 2] == ["asyncflow"]
    )


#: ``python -m asyncflow`` puts the current directory first on ``sys.path``, where a module of
#: the program's (a ``selectors.py`` beside ``app.py``) would replace the standard library's
#: for asyncflow's own imports: it is taken off while asyncflow loads, and ``__main__`` puts it
#: back (``asyncflow run`` then puts there what python would for the program)
_taken: list[str] = (
    [sys.path.pop(0)] if _run_as_python_m() and sys.path and not sys.flags.safe_path else []
)


def put_path_back() -> None:
    """Put back the entry ``python -m asyncflow`` put first on ``sys.path`` (see _taken)."""
    while _taken:
        sys.path.insert(0, _taken.pop())
