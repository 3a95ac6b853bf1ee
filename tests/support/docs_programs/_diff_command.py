"""``asyncflow diff ARGS`` as :func:`asyncflow.render.diff.add_diff_command` declares it: what
docs/diff.md runs until the CLI's own parser adds the command (then its blocks run
``asyncflow diff`` itself and this file goes)."""

from __future__ import annotations

import argparse
import sys

from asyncflow.render.diff import add_diff_command

parser = argparse.ArgumentParser(prog="asyncflow")
add_diff_command(parser.add_subparsers(dest="command"))
args = parser.parse_args(["diff", *sys.argv[1:]])
raise SystemExit(args.handler(args))
