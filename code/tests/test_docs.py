"""No document shows a command that fails, or a figure its command does not print.

Every `python3 code/main.py ...` command in README.md and outputs/*.md runs here, in document
order, in a scratch directory (so `> burst.json` feeds the next command). A command that needs a
server (loadgen, or a report only a server run makes) runs as `SUBCOMMAND --help` instead. Where a
document shows `$ command` followed by its output, every shown line must appear in what the
command prints now, in order (a document may trim lines, never change them)."""
import os
import re
import shlex
import subprocess
import tempfile
import unittest

from helpers import CODE, ROOT

DOCUMENTS = ["README.md"] + [os.path.join("outputs", f) for f in sorted(os.listdir(os.path.join(ROOT, "outputs")))
                              if f.endswith(".md")]
DETERMINISTIC = {"capacity", "simulate", "sweep", "presets", "explain", "compare", "search"}
# Files a shown command writes (pictures, timelines): committed ones must be exactly what it writes.
WRITTEN = re.compile(r"--(?:plot|timeline)\s+(\S+)")


def blocks(text):
    """[command, output shown after it or None] in document order, from fenced blocks and from
    inline `python3 code/main.py ...` in prose."""
    found = []
    pattern = re.compile(r"```[a-z]*\n(?P<block>.*?)```|`(?P<inline>python3 code/main\.py [^`]+)`", re.S)
    for match in pattern.finditer(text):
        if match.group("inline"):
            found.append([match.group("inline"), None])
            continue
        current = None
        for line in match.group("block").splitlines():
            command = line[2:] if line.startswith("$ ") else line
            if command.startswith("python3 code/main.py"):
                current = [command, [] if line.startswith("$ ") else None]
                found.append(current)
            elif line.startswith("$ "):
                current = None
            elif current is not None and current[1] is not None and line.strip():
                current[1].append(line.rstrip())
    return found


def progress_line(line):
    return re.match(r"^(sweep|simulate|loadgen|search|confirm): ", line) is not None


class Documents(unittest.TestCase):
    def run_document(self, name):
        with open(os.path.join(ROOT, name)) as f:
            commands = blocks(f.read())
        self.assertGreater(len(commands), 0, name)
        with tempfile.TemporaryDirectory() as scratch:
            os.symlink(CODE, os.path.join(scratch, "code"))
            for command, shown in commands:
                words = shlex.split(command.split(";")[0].split(">")[0].split("|")[0])
                sub = words[2]
                # Inputs only a real server run makes (c1.json, metrics.txt) are not here to read.
                outputs = set(re.findall(r"(?:--out|>)\s*(\S+)", command))
                missing = [w for w in words[3:] if re.search(r"\.(json|jsonl|txt)$", w) and w not in outputs
                           and not os.path.exists(os.path.join(scratch, w))]
                if sub == "loadgen" or missing:
                    run = f"python3 code/main.py {sub} --help"
                else:
                    run = command
                written = WRITTEN.findall(command) if run == command else []
                for path in written:
                    os.makedirs(os.path.join(scratch, os.path.dirname(path)) or scratch, exist_ok=True)
                # stderr merged into stdout, in the order a terminal shows them.
                proc = subprocess.run(["bash", "-c", run], cwd=scratch, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, timeout=300)
                self.assertNotIn("Traceback", proc.stdout, run)
                self.assertIn(proc.returncode, (0, 1), f"{name}: {run} exited {proc.returncode}: {proc.stdout[-300:]}")
                for path in written:
                    if os.path.exists(os.path.join(ROOT, path)):
                        with open(os.path.join(ROOT, path), "rb") as f, open(os.path.join(scratch, path), "rb") as g:
                            self.assertEqual(f.read(), g.read(), f"{name}: committed {path} is not what `{command}` "
                                                                 f"writes now; rerun it from the repository root")
                if run != command or not shown or sub not in DETERMINISTIC:
                    continue
                printed = [l.rstrip() for l in proc.stdout.splitlines() if not progress_line(l)]
                position = 0
                for line in shown:
                    try:
                        position = printed.index(line, position) + 1
                    except ValueError:
                        self.fail(f"{name}: `{command}` no longer prints:\n{line}\n(it printed:\n" + "\n".join(printed[:40]) + ")")

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


if __name__ == "__main__":
    unittest.main()
