"""``python -m asyncflow``: the same command as ``asyncflow``."""

from asyncflow import _startup

try:
    from asyncflow.cli import main
finally:
    _startup.put_path_back()  # (taken off while asyncflow loaded: see _startup)

raise SystemExit(main())
