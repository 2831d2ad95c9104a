"""No document shows a command the parser refuses, an exit code the command does not return, or
a figure its command does not print.

Every `python3 code/main.py ...` command in README.md and outputs/*.md is checked here, in
document order, in a scratch directory (so `> burst.json` feeds the next command):
- It is parsed by the real parser, `main.build_parser()`, and every flag must be spelled in full
  (argparse would take `--max-num-seq` for `--max-num-seqs`), so a misspelled flag fails.
- It runs, except one that needs a server (loadgen, or a report only a server run makes), which
  runs as `SUBCOMMAND --help` once it has parsed. A command that reads only committed files and
  writes none runs once, from the repository root, in the background (two or more at a time).
- It exits with the code its document gives it: the N of the `exit N` line a `; echo "exit $?"`
  shows; else N if the paragraph before its block (for a command in prose, its own paragraph)
  says "exits N"; else 0.
- Where a document shows `$ command` followed by its output, the shown lines are what the command
  prints (stdout and stderr as a terminal shows them; blank lines and progress lines aside): in
  order and adjacent, from the first line to the last. A line `...` stands for one or more lines
  left out, so a shortened excerpt says where it is shortened."""
import argparse
import concurrent.futures
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import unittest

from helpers import CODE, ROOT, START_COMPILED, compiled_main, main

DOCUMENTS = ["README.md"] + [os.path.join("outputs", f) for f in sorted(os.listdir(os.path.join(ROOT, "outputs")))
                              if f.endswith(".md")]
DETERMINISTIC = {"capacity", "simulate", "sweep", "presets", "explain", "compare", "search", "validate", "plan"}
# Files a shown command writes (pictures, timelines): committed ones must be exactly what it writes.
WRITTEN = re.compile(r"--(?:plot|timeline)\s+(\S+)")
LEFT_OUT = "..."
FLAG = re.compile(r"^(--?[A-Za-z][\w-]*)(=.*)?$")
# A command that reads only committed files and writes none prints the same whenever it runs: it
# runs once, from the repository root, in the background while the others run in document order.
POOL = concurrent.futures.ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1))
RESULTS = {}


class Shown:
    """One documented command: its text, the output shown after it (None if none is shown), and
    the exit code the document gives it."""
    def __init__(self, command, context):
        self.command = command
        self.output = None
        self.context = context

    def exit_code(self):
        if 'echo "exit $?"' in self.command:
            codes = [int(m.group(1)) for line in self.output or [] for m in [re.match(r"^exit (\d+)$", line)] if m]
            assert codes, f'`{self.command}` echoes its exit code but shows no "exit N" line'
            return codes[-1]
        said = re.findall(r"\bexits (\d+)\b", self.context)
        return int(said[-1]) if said else 0


def paragraph_around(text, start, end):
    """The paragraph holding text[start:end]."""
    first = text.rfind("\n\n", 0, start)
    last = text.find("\n\n", end)
    return text[first + 2 if first >= 0 else 0:last if last >= 0 else len(text)]


def blocks(text):
    """Every documented command as a Shown, in document order, from fenced blocks and from inline
    `python3 code/main.py ...` in prose."""
    found = []
    pattern = re.compile(r"```[a-z]*\n(?P<block>.*?)```|`(?P<inline>python3 code/main\.py [^`]+)`", re.S)
    previous_end = 0
    for match in pattern.finditer(text):
        if match.group("inline"):
            found.append(Shown(match.group("inline"), paragraph_around(text, match.start(), match.end())))
            continue
        before = text[previous_end:match.start()].rstrip("\n")
        context = before[before.rfind("\n\n") + 2:] if "\n\n" in before else before
        previous_end = match.end()
        current = None
        for line in match.group("block").splitlines():
            command = line[2:] if line.startswith("$ ") else line
            if command.startswith("python3 code/main.py"):
                current = Shown(command, context)
                if line.startswith("$ "):
                    current.output = []
                found.append(current)
            elif line.startswith("$ "):
                current = None
            elif current is not None and current.output is not None and line.strip():
                current.output.append(line.rstrip())
    return found


def progress_line(line):
    return re.match(r"^(sweep|simulate|loadgen|search|confirm|plan): |^validate: \d+ of \d+ runs replayed", line) \
        is not None


def fits(shown, printed):
    """shown is printed line for line, where a LEFT_OUT line stands for one or more lines."""
    def rest(i, j):
        if i == len(shown):
            return j == len(printed)
        if shown[i] == LEFT_OUT:
            return any(rest(i + 1, k) for k in range(j + 1, len(printed) + 1))
        return j < len(printed) and shown[i] == printed[j] and rest(i + 1, j + 1)
    return rest(0, 0)


def command_words(command):
    """The words of the servesim command itself, without what a shell adds after it."""
    return shlex.split(command.split(";")[0].split(">")[0].split("|")[0])


def input_files(words):
    return [p for w in words[3:] for p in w.split(",") if re.search(r"\.(json|jsonl|txt)$", p)]


# `python3 code/main.py` in a shown command starts main.py as helpers.main_command() does: the
# same code as __main__, compiled once for the whole test run instead of once a command, by the
# interpreter that compiled it (marshal's format is per Python version).
COMPILED_ONCE = ('python3() { if [ "$1" = code/main.py ]; then "$SERVESIM_PYTHON" -c "$SERVESIM_START" '
                 '"$SERVESIM_COMPILED" "$@"; else command python3 "$@"; fi; }\n')


def run_in(run, scratch):
    """Run as a user does, in bash; stderr merged into stdout, in the order a terminal shows them.
    In its own process group, so a command past its time is killed with everything it started."""
    env = {**os.environ, "SERVESIM_START": START_COMPILED, "SERVESIM_COMPILED": compiled_main(),
           "SERVESIM_PYTHON": sys.executable}
    proc = subprocess.Popen(["bash", "-c", COMPILED_ONCE + run], cwd=scratch, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=900)      # (a hang guard: a search took 300 s beside 3 other modules on 2 cores)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, out


def shared_run(command):
    """What to run for a command that reads only committed files and writes none, or None. A
    command that needs a server (loadgen, or an input only a server run makes) runs as --help."""
    words = command_words(command)
    if words[2] == "loadgen":
        return "python3 code/main.py loadgen --help"
    if re.search(r"[;>|]", command) or WRITTEN.search(command) or "--out" in words:
        return None
    paths = [p for w in words[3:] for p in w.split(",") if "/" in p or re.search(r"\.(json|jsonl|txt|csv|svg)$", p)]
    if not all(p.startswith("code/") for p in paths):
        return None
    missing = [p for p in input_files(words) if not os.path.exists(os.path.join(ROOT, p))]
    return f"python3 code/main.py {words[2]} --help" if missing else command


def start(run):
    """A shared run, started in the background once; its (exit code, output) when asked."""
    if run not in RESULTS:
        RESULTS[run] = POOL.submit(run_in, run, ROOT)
    return RESULTS[run]


def subcommand_parser(sub):
    for action in main.build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(sub)
    return None


class Documents(unittest.TestCase):
    def check_parses(self, name, command, words):
        """The real parser takes the command, and every flag in it is a whole flag of its subcommand."""
        try:
            main.build_parser().parse_args(words[2:])
        except (SystemExit, main.UserError) as e:
            self.fail(f"{name}: `{command}` does not parse: {e}")
        known = subcommand_parser(words[2])._option_string_actions
        for word in words[3:]:
            flag = FLAG.match(word)
            if flag:
                self.assertIn(flag.group(1), known, f"{name}: `{command}`: {flag.group(1)} is not a flag of "
                                                    f"{words[2]} (argparse takes an abbreviation; spell it out)")

    def run_document(self, name):
        with open(os.path.join(ROOT, name)) as f:
            commands = blocks(f.read())
        self.assertGreater(len(commands), 0, name)
        for shown in commands:
            run = shared_run(shown.command)
            if run:
                start(run)
        with tempfile.TemporaryDirectory() as scratch:
            os.symlink(CODE, os.path.join(scratch, "code"))
            for shown in commands:  # the rest in document order: `> burst.json` feeds the next command
                self.check_command(name, shown, scratch)

    def check_command(self, name, shown, scratch):
        command = shown.command
        words = command_words(command)
        sub = words[2]
        self.check_parses(name, command, words)
        run = shared_run(command)
        if run:
            code, printed = start(run).result()
        else:
            # Inputs only a real server run makes (c1.json, metrics.txt) are not here to read.
            outputs = set(re.findall(r"(?:--out|>)\s*(\S+)", command))
            missing = [p for p in input_files(words) if p not in outputs
                       and not os.path.exists(os.path.join(scratch, p))]
            if missing:
                run = f"python3 code/main.py {sub} --help"
                code, printed = start(run).result()
            else:
                run = command
                for path in WRITTEN.findall(run):
                    os.makedirs(os.path.join(scratch, os.path.dirname(path)) or scratch, exist_ok=True)
                code, printed = run_in(run, scratch)
        self.assertNotIn("Traceback", printed, run)
        if 'echo "exit $?"' in run:
            code = int(re.findall(r"^exit (\d+)$", printed, re.M)[-1])
        expected = shown.exit_code() if run == command else 0
        self.assertEqual(code, expected, f"{name}: `{run}` exited {code}, but the document gives it "
                                         f"{expected}; it printed:\n{printed[-600:]}")
        for path in (WRITTEN.findall(command) if run == command else []):
            if os.path.exists(os.path.join(ROOT, path)):
                with open(os.path.join(ROOT, path), "rb") as f, open(os.path.join(scratch, path), "rb") as g:
                    self.assertEqual(f.read(), g.read(), f"{name}: committed {path} is not what `{command}` "
                                                         f"writes now; rerun it from the repository root")
        if run != command or not shown.output or sub not in DETERMINISTIC:
            return
        lines = [l.rstrip() for l in printed.splitlines() if l.strip() and not progress_line(l)]
        gone = [l for l in shown.output if l != LEFT_OUT and l not in lines]
        if gone:
            self.fail(f"{name}: `{command}` no longer prints:\n{gone[0]}\n(it printed:\n" + "\n".join(lines[:40]) + ")")
        if not fits(shown.output, lines):
            self.fail(f"{name}: `{command}` prints every shown line, but not as shown: lines are left out "
                      f"without a `{LEFT_OUT}` line where they are, or are out of order.\nshown:\n"
                      + "\n".join(shown.output) + "\nprinted:\n" + "\n".join(lines))

    def test_readme(self):
        self.run_document("README.md")

    def test_every_committed_picture_has_its_command(self):
        with open(os.path.join(ROOT, "README.md")) as f:
            made = set(WRITTEN.findall(f.read()))
        for name in os.listdir(os.path.join(ROOT, "outputs")):
            if not name.endswith(".md"):
                self.assertIn(f"outputs/{name}", made, f"outputs/{name} is not written by any command in README.md")

    def test_outputs(self):
        for name in DOCUMENTS[1:]:
            with self.subTest(name):
                self.run_document(name)

    def test_the_checks_catch_what_they_are_for(self):
        """A misspelled or abbreviated flag, an unmarked excerpt and a wrong exit code each fail."""
        with self.assertRaises(AssertionError):
            self.check_parses("-", "python3 code/main.py sweep --max-num-seq 4", ["python3", "code/main.py", "sweep",
                                                                                 "--max-num-seq", "4"])
        with self.assertRaises(AssertionError):
            self.check_parses("-", "python3 code/main.py loadgen --url u --concurency 4",
                              ["python3", "code/main.py", "loadgen", "--url", "u", "--concurency", "4"])
        self.assertTrue(fits(["a", LEFT_OUT, "d"], ["a", "b", "c", "d"]))
        self.assertTrue(fits([LEFT_OUT, "c", LEFT_OUT], ["a", "b", "c", "d"]))
        self.assertFalse(fits(["a", "d"], ["a", "b", "c", "d"]))
        self.assertFalse(fits(["a", "b", "c"], ["a", "b", "c", "d"]))
        self.assertFalse(fits(["a", LEFT_OUT, "b"], ["a", "b"]))
        text = ("A model that does not fit exits 1 with one line:\n\n```\n$ python3 code/main.py capacity\nx\n```\n\n"
                "Fine:\n\n```\n$ python3 code/main.py presets\n```\n")
        self.assertEqual([s.exit_code() for s in blocks(text)], [1, 0])


if __name__ == "__main__":
    unittest.main()
