"""Build the optional C speed-ups; everything else about the package is in pyproject.toml.

The extension is optional, as aiohttp's, yarl's and frozenlist's are: without a compiler (or
Python's headers), or with ``ASYNCFLOW_NO_EXTENSIONS=1`` set at install time, ``pip install .``
still succeeds and asyncflow runs on its pure-Python hot path, which says so in
``/profiler_status`` and the report (``accelerated: false``).
"""

from __future__ import annotations

import os
import platform

from setuptools import Extension, setup

_NO_EXTENSIONS = os.environ.get("ASYNCFLOW_NO_EXTENSIONS", "").strip().lower() not in (
    "",
    "0",
    "false",
    "no",
    "off",
)

ext_modules = []
if not _NO_EXTENSIONS and platform.python_implementation() == "CPython":
    ext_modules.append(
        Extension(
            "asyncflow.instrumentation._speedups",
            ["asyncflow/instrumentation/_speedups.c"],
            optional=True,  # a failed build is a warning, and the pure-Python path is used
        )
    )

setup(ext_modules=ext_modules)
