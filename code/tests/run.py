"""The README's test command: every test module under `python3 -m unittest`, several at once.

    python3 code/tests/run.py [-v] [-j N] [-p PATTERN] [-k NAME] [-s DIR]

Most of the suite's time is not this process's CPU: test modules wait on servers (the real
llama.cpp server, the hostile ones that drip bytes on purpose), on signals and on subprocesses.
Run one after another, the suite took about eight minutes on two cores; run several modules at
once, the waits overlap. Each module runs alone in its own process, exactly as

    python3 -m unittest discover -s code/tests -p test_NAME.py

runs it (that command, without -p, is the same suite one module after another), so no module
shares state with another. Each module's output is printed whole when it ends, in the order they
end; then the total, and the modules that failed. The longest modules start first, as long as they
took last time (kept in $SERVESIM_CACHE/test-seconds.json, else ~/.cache/servesim; by file size
when unknown), so the last to end is not the longest. A module that times something real, whose
figures other modules' CPU would change, says `RUNS_ALONE = True` and runs first, by itself. Exits 0 when every module passes, 1 when
one fails, 2 on bad usage, 130 on Ctrl-C or SIGTERM (the modules running are stopped with
everything they started, and their output so far is shown)."""
import argparse
import fnmatch
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

TESTS = os.path.dirname(os.path.abspath(__file__))
CACHE = os.environ.get("SERVESIM_CACHE") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "servesim")
SECONDS = os.path.join(CACHE, "test-seconds.json")
RAN = re.compile(r"^Ran (\d+) tests? in ", re.M)
ALONE = re.compile(r"^RUNS_ALONE = True\b", re.M)


def modules(folder: str, pattern: str) -> list[str]:
    return sorted(f for f in os.listdir(folder) if fnmatch.fnmatch(f, pattern) and f.endswith(".py"))


def runs_alone(path: str) -> bool:
    with open(path, encoding="utf-8") as f:
        return ALONE.search(f.read()) is not None


def last_seconds() -> dict:
    try:
        with open(SECONDS) as f:
            seen = json.load(f)
        return {k: float(v) for k, v in seen.items() if isinstance(k, str) and isinstance(v, (int, float))}
    except (OSError, ValueError, AttributeError):
        return {}


def keep_seconds(took: dict):
    """Best effort: a read-only cache only costs the order next time."""
    try:
        os.makedirs(CACHE, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=CACHE, delete=False, suffix=".tmp") as f:
            json.dump({**last_seconds(), **took}, f, indent=1, sort_keys=True)
        os.replace(f.name, SECONDS)
    except OSError:
        pass


class Module:
    def __init__(self, folder: str, name: str, extra: list[str]):
        self.name = name
        self.filtered = "-k" in extra
        self.out = tempfile.TemporaryFile("w+")
        self.started = time.monotonic()
        # Its own process group, so stopping it stops the servers and commands it started.
        self.proc = subprocess.Popen([sys.executable, "-m", "unittest", "discover", "-s", folder, "-p", name, *extra],
                                     stdout=self.out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        self.seconds = None

    def done(self) -> bool:
        if self.seconds is None and self.proc.poll() is not None:
            self.seconds = time.monotonic() - self.started
        return self.seconds is not None

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()
        self.done()

    def output(self) -> str:
        self.out.seek(0)
        return self.out.read()

    def tests(self, text: str) -> int:
        found = RAN.findall(text)
        return int(found[-1]) if found else 0

    def passed(self) -> bool:
        # unittest exits 5 when it ran no test: a module none of whose tests -k names.
        return self.proc.returncode == 0 or (self.proc.returncode == 5 and self.filtered)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="code/tests/run.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="print every test's name and result")
    parser.add_argument("-j", "--jobs", type=int, default=(os.cpu_count() or 1) + 2,
                        help="modules run at once (default: CPUs + 2, %(default)s here: most modules wait more than they compute)")
    parser.add_argument("-p", "--pattern", default="test_*.py", help="which modules (default: %(default)s)")
    parser.add_argument("-k", dest="names", action="append", default=[],
                        help="only tests whose name holds this (as unittest's -k; repeatable)")
    parser.add_argument("-s", "--start-dir", default=TESTS, help="the folder of test modules (default: this one)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("-j must be at least 1")
    folder = os.path.abspath(args.start_dir)
    try:
        names = modules(folder, args.pattern)
    except OSError as e:
        parser.error(f"cannot list {folder}: {e.strerror}")
    if not names:
        parser.error(f"no test module in {folder} matches {args.pattern!r}")
    seen = last_seconds()
    names.sort(key=lambda n: (-seen.get(n, os.path.getsize(os.path.join(folder, n)) / 1000), n))
    extra = (["-v"] if args.verbose else []) + [a for k in args.names for a in ("-k", k)]

    signal.signal(signal.SIGTERM, stop_by_signal)     # as Ctrl-C: the modules in their own sessions are stopped too
    alone = [n for n in names if runs_alone(os.path.join(folder, n))]
    start = time.monotonic()
    waiting, running, finished = alone + [n for n in names if n not in alone], [], []
    try:
        while waiting or running:
            # One that runs alone starts on an empty machine and keeps it to itself.
            while waiting and (not running or (len(running) < args.jobs and waiting[0] not in alone
                                               and running[0].name not in alone)):
                running.append(Module(folder, waiting.pop(0), extra))
            time.sleep(0.05)
            for module in [m for m in running if m.done()]:
                running.remove(module)
                finished.append(module)
                show(module, args.verbose)
    except KeyboardInterrupt:
        for module in running:
            module.stop()
            finished.append(module)
            show(module, True, stopped=True)
        print(f"stopped: {len(waiting)} modules not started", file=sys.stderr)
        return 130
    keep_seconds({m.name: round(m.seconds, 1) for m in finished})
    failed = [m.name for m in finished if not m.passed()]
    total = sum(m.tests(m.output()) for m in finished)
    print("-" * 70)
    modules_ran = f"{len(finished)} module{'s' if len(finished) != 1 else ''}"
    print(f"Ran {total} tests in {time.monotonic() - start:.1f} s ({modules_ran}, up to {args.jobs} at once)")
    print(f"FAILED: {', '.join(failed)}" if failed else "OK")
    return 1 if failed else 0


def stop_by_signal(signum, frame):
    raise KeyboardInterrupt


def show(module: Module, whole: bool, stopped: bool = False):
    text = module.output()
    verdict = "stopped" if stopped else "OK" if module.passed() else f"FAILED (exit {module.proc.returncode})"
    print(f"== {module.name}: {verdict}, {module.tests(text)} tests, {module.seconds:.1f} s", flush=True)
    if whole or not module.passed():
        print(text.rstrip("\n"), flush=True)


if __name__ == "__main__":
    sys.exit(main())
