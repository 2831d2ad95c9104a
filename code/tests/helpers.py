"""Shared by the tests: import code/main.py, and run it as a user does, in a subprocess."""
import os
import subprocess
import sys

CODE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(CODE)
FIXTURES = os.path.join(CODE, "fixtures")
sys.path.insert(0, CODE)

import main  # noqa: E402


def run_cli(*args, env=None, timeout=120):
    """Run main.py with args; returns (exit code, stdout, stderr)."""
    proc = subprocess.run([sys.executable, os.path.join(CODE, "main.py"), *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env={**os.environ, **(env or {})})
    return proc.returncode, proc.stdout, proc.stderr


def cells(line):
    """A table row as numbers: '2,568.2' -> 2568.2, '0.3%' -> 0.3."""
    return [float(c.replace(",", "").rstrip("%")) for c in line.split()]
