"""The ``asyncflow`` command and the examples, run in child processes as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLES = ROOT / "examples"


ASYNCFLOW = [sys.executable, "-m", "asyncflow"]


def asyncflow_cmd(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m asyncflow ARGS`` (the ``asyncflow`` script calls the same main())."""
    return subprocess.run(
        [*ASYNCFLOW, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env=None if env is None else {**os.environ, **env},
    )


def python_cmd(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python ARGS``: the program run plainly, to compare with it run under asyncflow."""
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def console_script(directory: Path) -> list[str]:
    """What pip installs as the ``asyncflow`` command: a script in a directory of its own
    (so the interpreter puts that directory, not the current one, first on ``sys.path``)."""
    script = write(
        directory / "bin" / "asyncflow",
        "import sys\nfrom asyncflow.cli import main\n\n"
        "if __name__ == '__main__':\n    sys.exit(main())\n",
    )
    return [sys.executable, str(script)]


def run_example(name: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run an example as a user would, with only the given ASYNCFLOW_* variables set."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCFLOW_")}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, "ASYNCFLOW_PORT": "0", **env},  # any free port, never a fixed one
    )
    assert done.returncode == 0, done.stderr
    return done
