"""Sphinx configuration of asyncflow's manual: MyST markdown, built with warnings as errors."""

from __future__ import annotations

import sys
from pathlib import Path

# docs/_ext holds the manual's own extensions: the routes and documents reference, rendered from
# the endpoint's OpenAPI document, and the options' and metrics' tables, rendered from
# config.OPTIONS and render/metrics.METRICS (so the package must be importable: the docs extra
# installs it)
sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "asyncflow"
author = "asyncflow's authors"
copyright = "asyncflow's authors"

extensions = ["myst_parser", "asyncflow_openapi", "asyncflow_tables"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Headings get GitHub's anchors, so that a link such as `queues.md#what-is-exact` works on
# GitHub and in the built site alike (tests/test_readme_links.py checks them the same way).
myst_heading_anchors = 4

html_theme = "alabaster"
html_title = "asyncflow"
html_static_path: list[str] = []
