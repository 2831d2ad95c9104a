"""The whole suite, its test files run side by side: python3 code/tests/run.py [--jobs N] [PATTERN].

Most of the suite's time is spent waiting (hostile servers that stall on purpose, signals timed
against a child, a real server generating tokens) or in one long file (test_docs reruns every
README command), so files run in N processes at once, longest first. The real llama.cpp server's
tests measure throughput, so they run with only the files that wait beside them, never with one
that keeps a core busy. Each file's unittest output is printed whole when it ends; the exit
status is 1 if any file failed, 0 otherwise. It is `python3 -m unittest discover -s code/tests`,
only faster; either runs the same tests.
"""
import argparse
import fnmatch
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# Longest first (seconds measured alone on the project's 2-core machine, rounded), so the last
# to start is short. A new file not named here runs after these.
ORDER = ["test_docs", "test_hostile", "test_real_server", "test_hostile_limits", "test_hostile_servers",
         "test_loadgen", "test_search", "test_sustained", "test_traffic", "test_badinput_files",
         "test_badinput", "test_plan", "test_engine", "test_badinput_cli", "test_explain", "test_calibrate"]
# Files that keep a core busy the whole time; the real server's throughput tests must not run beside them.
BUSY = {"test_docs", "test_search", "test_sustained", "test_traffic", "test_engine", "test_plan",
        "test_badinput_files", "test_badinput"}
ALONE_WITH_WAITERS = "test_real_server"


def modules(pattern: str) -> list[str]:
    found = sorted(f[:-3] for f in os.listdir(HERE) if f.startswith("test_") and f.endswith(".py")
                   and fnmatch.fnmatch(f, pattern))
    return sorted(found, key=lambda m: ORDER.index(m) if m in ORDER else len(ORDER))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pattern", nargs="?", default="test_*.py", help="test files to run (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=3, help="files at once (default: %(default)s: two cores, "
                                                            "and much of the suite waits)")
    args = parser.parse_args()
    queue, running, results = modules(args.pattern), {}, []
    lock, changed = threading.Lock(), threading.Condition()
    start = time.monotonic()

    def run(name: str) -> None:
        began = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "unittest", "-v", name], cwd=HERE, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, errors="replace")
        with changed:
            results.append((name, proc.returncode, time.monotonic() - began, proc.stdout))
            sys.stdout.write(f"==== {name} ({time.monotonic() - began:.0f} s, "
                             f"{'ok' if proc.returncode == 0 else 'FAILED'})\n{proc.stdout}\n")
            sys.stdout.flush()
            del running[name]
            changed.notify_all()

    def may_start(name: str) -> bool:
        if name == ALONE_WITH_WAITERS:
            return not BUSY & set(running)
        return not (name in BUSY and ALONE_WITH_WAITERS in running)

    with changed:
        while queue or running:
            ready = [n for n in queue if may_start(n)] if len(running) < args.jobs else []
            if ready:
                name = ready[0]
                queue.remove(name)
                running[name] = threading.Thread(target=run, args=(name,), daemon=True)
                running[name].start()
            else:
                changed.wait()
    failed = [name for name, code, _, _ in results if code]
    total = time.monotonic() - start
    counts = [out.rsplit("\nRan ", 1)[-1].split(" ", 1)[0] for _, _, _, out in results]
    tests = sum(int(c) for c in counts if c.isdigit())
    print(f"ran {tests} tests in {len(results)} files in {total:.0f} s "
          f"({', '.join(f'{n} {t:.0f} s' for n, _, t, _ in sorted(results, key=lambda r: -r[2])[:5])}, ...)")
    if failed:
        print(f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
