"""Run main.py as a user does, bounded: in its own process (and its own process group, so a hang
is killed with every worker it started), with a wall-clock bound (a hang fails its test, not the
suite) and an address-space cap (a run that eats memory fails its test, not the machine). A Run
is what the user saw: exit code, stdout, stderr, wall seconds and the run's peak resident memory."""
import json
import os
import re
import resource
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass

from helpers import FIXTURES, MAIN, ROOT, main_command

README = os.path.join(ROOT, "README.md")
VLLM_RUN = os.path.join(FIXTURES, "published-runs", "llmservingsim", "rtx4090-llama-3.1-8b")

# stderr lines that are progress, not errors
PROGRESS = re.compile(r"^(simulate|sweep|search|loadgen|confirm): ")
# every run gets at most this much address space, so a finding that eats memory fails its test
# instead of taking the machine down (the memory targets themselves are checked on peak RSS)
DEFAULT_AS_LIMIT = 3 * 2**30
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")      # C0 controls but tab and newline (ESC is \x1b)


@dataclass
class Run:
    code: object          # exit code (negative: killed by that signal)
    out: str
    err: str
    took: float           # wall seconds
    peak_mb: float        # peak resident set of the process (and workers it waited for), MB

    def lines(self):
        """stderr without progress lines: what the user is told went wrong."""
        return [line for line in self.err.splitlines() if line.strip() and not PROGRESS.match(line)]

    def json(self):
        try:
            return json.loads(self.out)
        except ValueError:
            raise AssertionError(f"stdout is not a JSON report: {self.seen()}") from None

    def seen(self):
        """What the user saw, in one line for a failure message."""
        return (f"exit {self.code} after {self.took:.1f} s, peak RSS {self.peak_mb:.0f} MB, stdout {len(self.out):,} "
                f"chars {self.out[:160]!r}, stderr {self.err[-400:]!r}")


def limits(as_bytes=DEFAULT_AS_LIMIT, sigint_default=True):
    def apply():
        if as_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (as_bytes, as_bytes))
        if sigint_default:            # a runner started in the background ignores SIGINT; a user's shell does not
            signal.signal(signal.SIGINT, signal.SIG_DFL)
    return apply


def start(args, env=None, as_bytes=DEFAULT_AS_LIMIT, stdout=None, cwd=ROOT, prefix=None):
    """Popen main.py ARGS in a new process group, stdout and stderr to temporary files (no pipe can
    fill and stall it). Returns (proc, out_file, err_file)."""
    out_f = stdout if stdout is not None else tempfile.TemporaryFile("w+", encoding="utf-8", errors="surrogateescape")
    err_f = tempfile.TemporaryFile("w+", encoding="utf-8", errors="surrogateescape")
    # A prefix (a wrapper around the interpreter) starts main.py itself; else main_command().
    cmd = [*prefix, MAIN, *map(str, args)] if prefix else [*main_command(), *map(str, args)]
    full_env = {**os.environ, "OPENAI_API_KEY": "", "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    proc = subprocess.Popen(cmd, stdout=out_f, stderr=err_f, cwd=cwd, env=full_env, start_new_session=True,
                            preexec_fn=limits(as_bytes))
    return proc, out_f, err_f


def alive(proc):
    """Whether the process is still running, without reaping it (finish() needs it unreaped)."""
    return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None


def kill_group(proc):
    """SIGKILL the process group this test started (the CLI and any workers it forked)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def finish(proc, out_f, err_f, started, timeout, what=""):
    """Wait for the process (wait4, for its peak RSS) up to `timeout` s; on a hang kill its group
    and fail with what it had printed."""
    deadline = started + timeout
    while True:
        # exited? (WNOWAIT: not reaped yet, so its process group id is still ours to signal)
        if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            break
        if time.monotonic() > deadline:
            kill_group(proc)
            os.wait4(proc.pid, 0)
            proc.returncode = -9
            out, err = read(out_f), read(err_f)
            raise AssertionError(f"still running after {timeout:g} s (killed): {what}\n"
                                 f"stdout: {out[-600:]!r}\nstderr: {err[-600:]!r}")
        time.sleep(0.02)
    took = time.monotonic() - started
    kill_group(proc)        # workers it left behind, if any, while the group is still ours
    _, status, rusage = os.wait4(proc.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code
    return Run(code, read(out_f), read(err_f), took, rusage.ru_maxrss / 1024)


def read(f):
    if f is None or not hasattr(f, "seek"):
        return ""
    f.flush()
    f.seek(0)
    text = f.read()
    f.close()
    return text


def run(*args, env=None, timeout=30, as_bytes=DEFAULT_AS_LIMIT, stdout=None, prefix=None):
    """main.py ARGS as a user runs it; a Run. A run still going after `timeout` s fails the test."""
    started = time.monotonic()
    proc, out_f, err_f = start(args, env=env, as_bytes=as_bytes, stdout=stdout, prefix=prefix)
    return finish(proc, out_f, err_f, started, timeout, " ".join(map(str, args)))


def children(pid):
    """Process ids whose parent is pid (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return found


def cpu_ticks(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return -1


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def strings(value):
    """Every string in a JSON value (keys too)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


def numbers(value):
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from numbers(v)
    elif isinstance(value, list):
        for v in value:
            yield from numbers(v)


def write(path, text):
    with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
        f.write(text)
    return path


def write_json(path, value):
    return write(path, json.dumps(value))


def jsonl(path, rows):
    return write(path, "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def readme_section(title="## Exit codes and errors"):
    with open(README, encoding="utf-8") as f:
        text = f.read()
    start_ = text.index(title)
    end = text.find("\n## ", start_ + len(title))
    return text[start_:end if end >= 0 else len(text)]
