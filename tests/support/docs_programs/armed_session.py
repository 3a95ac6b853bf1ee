"""``python armed_session.py COMMAND...``: bank.py run armed, and what the last of the
``asyncflow COMMAND PID`` commands prints (docs/attach.md): it starts ``asyncflow run --armed
bank.py``, waits until it serves, runs each command on it in turn (``attach --port 0``, say;
the output of all but the last is left out), then ends it. ``-`` as the command: what the
armed program itself printed so far; ``=ps``: ``asyncflow ps``, without the pid."""

import shlex
import subprocess
import sys

program = subprocess.Popen(
    [sys.executable, "-m", "asyncflow", "run", "--armed", "bank.py"],
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
)
try:
    assert program.stdout is not None
    said = [program.stdout.readline(), program.stdout.readline()]
    assert said[1] == "serving\n", said
    for i, command in enumerate(sys.argv[1:]):
        if command == "-":
            out = "".join(said)
        else:
            words = shlex.split(command.lstrip("="))
            pid = [] if command.startswith("=") else [str(program.pid)]
            out = subprocess.run(
                [sys.executable, "-m", "asyncflow", words[0], *pid, *words[1:]],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=60,
            ).stdout
        if i == len(sys.argv) - 2:
            sys.stdout.write(out)
finally:
    if program.stdin is not None:
        program.stdin.close()
    program.wait(60)
