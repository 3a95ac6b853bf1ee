"""``python -m asyncflow``: the same command as ``asyncflow``."""

from asyncflow.cli import main

raise SystemExit(main())
