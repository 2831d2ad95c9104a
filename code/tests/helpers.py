"""Shared by the tests: import code/main.py, and run it as a user does, in a subprocess."""
import contextlib
import io
import os
import subprocess
import sys

CODE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(CODE)
FIXTURES = os.path.join(CODE, "fixtures")
sys.path.insert(0, CODE)

import main  # noqa: E402


def run_cli(*args, env=None, timeout=120):
    """Run main.py with args in a subprocess, as a user does; returns (exit code, stdout, stderr)."""
    proc = subprocess.run([sys.executable, os.path.join(CODE, "main.py"), *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env={**os.environ, **(env or {})})
    return proc.returncode, proc.stdout, proc.stderr


def call_cli(*args, env=None):
    """The same main() in this process, for the many cases where a subprocess would only add
    startup time (this machine recompiles main.py on every start); returns (code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main.main([str(a) for a in args])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return code, out.getvalue(), err.getvalue()


def cells(line):
    """A table row as numbers: '2,568.2' -> 2568.2, '0.3%' -> 0.3."""
    return [float(c.replace(",", "").rstrip("%")) for c in line.split()]
