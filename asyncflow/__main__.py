"""``python -m asyncflow``: the same command as ``asyncflow``."""

import sys

# python -m puts the current directory first on sys.path, where a module of the program's
# (an http.py beside app.py) would replace the standard library's for asyncflow's own imports
# too; asyncflow run then puts there what python would for the program (see _program_path).
_first = sys.path.pop(0) if sys.path and not sys.flags.safe_path else None
try:
    from asyncflow.cli import main
finally:
    if _first is not None:
        sys.path.insert(0, _first)

raise SystemExit(main())
