"""code/tests/run.py, the README's test command: a failing module fails the run, every test is
counted, modules run at once, and one that says RUNS_ALONE runs with nothing beside it."""
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

RUN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run.py")

# Each test notes when it ran, so the test below can see what ran beside what.
MODULE = textwrap.dedent("""
    import os, time, unittest
    {alone}
    class T(unittest.TestCase):
        def test_{name}(self):
            started = time.monotonic()
            time.sleep(0.6)
            with open(os.environ["RUN_LOG"], "a") as f:
                f.write(f"{name} {{started}} {{time.monotonic()}}\\n")
            self.assertTrue({passes})
""")


class Runner(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.tests = os.path.join(self.tmp.name, "tests")
        os.mkdir(self.tests)
        for name, passes, alone in (("a", True, False), ("b", True, False), ("c", True, False),
                                    ("fails", False, False), ("alone", True, True)):
            with open(os.path.join(self.tests, f"test_{name}.py"), "w") as f:
                f.write(MODULE.format(name=name, passes=passes, alone="RUNS_ALONE = True" if alone else ""))
        self.log = os.path.join(self.tmp.name, "log")
        self.env = {**os.environ, "RUN_LOG": self.log, "SERVESIM_CACHE": os.path.join(self.tmp.name, "cache")}

    def run_tests(self, *args):
        proc = subprocess.run([sys.executable, RUN, "-s", self.tests, *args], capture_output=True, text=True,
                              env=self.env, timeout=60)
        with open(self.log) as f:
            ran = {name: (float(a), float(b)) for name, a, b in (line.split() for line in f)}
        os.remove(self.log)
        return proc, ran

    def test_a_failing_module_fails_the_run_and_the_alone_module_ran_alone(self):
        proc, ran = self.run_tests("-j", "4")
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertIn("Ran 5 tests in", proc.stdout)
        self.assertIn("FAILED: test_fails.py", proc.stdout)
        self.assertIn("AssertionError", proc.stdout, "a failing module's output is shown")
        self.assertEqual(sorted(ran), ["a", "alone", "b", "c", "fails"])

        def overlap(x, y):
            return ran[x][0] < ran[y][1] and ran[y][0] < ran[x][1]
        others = ["a", "b", "c", "fails"]
        self.assertFalse([o for o in others if overlap("alone", o)], ran)
        self.assertTrue(any(overlap(x, y) for x in others for y in others if x < y), f"nothing ran at once: {ran}")
        self.assertTrue(os.path.exists(os.path.join(self.tmp.name, "cache", "test-seconds.json")))

    def test_one_at_a_time_and_by_name(self):
        proc, ran = self.run_tests("-j", "1", "-k", "test_b", "-k", "test_c")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("Ran 2 tests in", proc.stdout)
        self.assertEqual(sorted(ran), ["b", "c"])
        first, second = sorted(ran.values())
        self.assertLessEqual(first[1], second[0], "-j 1 ran two modules at once")

    def test_bad_usage_is_one_line_exit_2(self):
        for args in (["-j", "0"], ["-p", "nothing_*.py"], ["-s", os.path.join(self.tmp.name, "none")]):
            proc = subprocess.run([sys.executable, RUN, "-s", self.tests, *args], capture_output=True, text=True,
                                  env=self.env, timeout=60)
            self.assertEqual(proc.returncode, 2, args)
            self.assertIn("error:", proc.stderr.splitlines()[-1], args)


if __name__ == "__main__":
    unittest.main()
