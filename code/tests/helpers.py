"""Shared by the tests: import code/main.py, and run it as a user does, in a subprocess."""
import atexit
import contextlib
import hashlib
import io
import marshal
import os
import shutil
import subprocess
import sys
import tempfile
import threading

CODE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(CODE)
FIXTURES = os.path.join(CODE, "fixtures")
sys.path.insert(0, CODE)

import main  # noqa: E402

MAIN = os.path.join(CODE, "main.py")
# `python3 code/main.py` compiles its 10,000 lines on every start (a script's bytecode is never
# cached): 0.3 s on this machine, most of what a short run costs, and the suite starts main.py
# hundreds of times. main_command() starts the same code without that: main.py compiled once per
# test run (again if it changes), then run as the interpreter runs a script, as __main__ with
# its argv and __file__, its own signal handlers first. Tests about the start itself (Ctrl-C while
# main.py loads, a wrapper around the interpreter) still start `python3 main.py`.
START_COMPILED = """
import marshal, sys
_compiled, sys.argv = sys.argv[1], sys.argv[2:]
__file__ = sys.argv[0]
with open(_compiled, "rb") as _f:
    _code = marshal.load(_f)
del _compiled, _f, marshal
exec(_code, globals())
"""
_COMPILED_DIR = tempfile.mkdtemp(prefix="servesim-tests-")
atexit.register(shutil.rmtree, _COMPILED_DIR, True)
_compiling = threading.Lock()      # test_docs asks from several threads at once


def compiled_main() -> str:
    """main.py's code object, marshalled in this test run's scratch directory, keyed by its source
    (and loaded by this interpreter, sys.executable: marshal's format is per Python version)."""
    with open(MAIN, "rb") as f:
        source = f.read()
    with _compiling:
        path = os.path.join(_COMPILED_DIR, hashlib.sha256(source).hexdigest()[:16] + ".code")
        if not os.path.exists(path):
            with open(path + ".tmp", "wb") as f:
                marshal.dump(compile(source, MAIN, "exec", dont_inherit=True), f)
            os.replace(path + ".tmp", path)
    return path


def main_command() -> list:
    """The argv that starts main.py as `python3 code/main.py` does; its arguments follow."""
    return [sys.executable, "-c", START_COMPILED, compiled_main(), MAIN]


def run_cli(*args, env=None, timeout=120):
    """Run main.py with args in a subprocess, as a user does; returns (exit code, stdout, stderr)."""
    proc = subprocess.run([*main_command(), *map(str, args)],
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


def stopping_run(when):
    """main.run as it is now, except that a run `when(spec)` holds for raises KeyboardInterrupt
    (Ctrl-C at that run), for mock.patch.object(main, "run", ...)."""
    real = main.run

    def run(spec, *args, **kwargs):
        if when(spec):
            raise KeyboardInterrupt
        return real(spec, *args, **kwargs)
    return run
