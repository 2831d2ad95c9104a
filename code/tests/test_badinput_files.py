"""Files a careless or hostile user hands servesim, second pass (issue 20): every reader validates
as strictly as the others -- one line on stderr naming the file and the field, exit 2, never a
traceback, a spin or a silently wrong number -- and every file servesim writes goes where it was
asked, never through a planted link and never over an input. Hand-built files in a temporary
directory, read through the CLI as a user runs it (bounded.py)."""
import copy
import json
import os
import shutil
import sys
import tempfile
import unittest

from bounded import FIXTURES, VLLM_RUN, jsonl, run, write, write_json

PRESETS = ("--model", "llama-3.1-8b", "--hardware", "h100-sxm-80gb")


def request_rows(n=6):
    """vLLM per-request stats, as published runs record them (seconds on the engine's clock)."""
    rows = []
    for i in range(n):
        queued = 100.0 + 0.5 * i
        rows.append({"request_id": f"r-{i}", "input_toks": 200 + 10 * i, "output_toks": 20, "queued_ts": queued,
                     "first_token_ts": queued + 0.05, "last_token_ts": queued + 0.5})
    return rows


def detailed_report(n=2, **extra):
    """A loadgen --detailed report, by hand: the per-request arrays (seconds) and the config merge reads."""
    report = {"completed": n, "failed": 0, "input_lens": [100 + i for i in range(n)], "output_lens": [5] * n,
              "ttfts": [0.05] * n, "itls": [[0.01] * 4 for _ in range(n)], "start_times": [10.0 + 0.5 * i for i in range(n)],
              "errors": [""] * n,
              "config": {"run_id": "abc123", "started_unix": 1.7e9, "started_perf": 10.0}}
    report.update(extra)
    return report


class Checks(unittest.TestCase):
    def assert_one_line(self, r, code=2, mentions=()):
        """exit `code`, one line on stderr naming each of `mentions`, no traceback, nothing half printed."""
        self.assertNotIn("Traceback", r.err, r.seen())
        self.assertEqual(r.code, code, r.seen())
        self.assertEqual(len(r.lines()), 1, r.seen())
        for word in mentions:
            self.assertIn(word.lower(), r.lines()[0].lower(), f"the line does not name {word!r}: {r.lines()[0]}")
        if code == 2:
            self.assertEqual(r.out, "", "bad input printed output")


class Finding21CompareTimelineFirst(Checks):
    """# issue 20 finding 21: compare --timeline /dev/full writes the timeline before the report."""

    @unittest.skipUnless(os.path.exists("/dev/full"), "no /dev/full")
    def test_compare_timeline_to_a_full_disk_still_prints_the_comparison(self):
        # issue 20 finding 21
        r = run("compare", VLLM_RUN, "--timeline", "/dev/full", timeout=60)
        self.assertNotIn("Traceback", r.err)
        self.assertIn("measured", r.out, f"the comparison was lost: {r.seen()}")
        self.assertIn("ttft p50 ms", r.out)
        self.assertEqual(r.code, 1, r.seen())
        self.assertEqual(len([l for l in r.lines() if not l.startswith("servesim: --num-gpu-blocks")]), 1, r.err)


class Finding03Writes(Checks):
    """# issue 20 finding 3: writes follow a planted symlink; an output path may be an input."""

    def test_a_planted_partial_symlink_does_not_redirect_the_plot(self):
        # issue 20 finding 3: write_file opens a fixed <path>.partial
        with tempfile.TemporaryDirectory() as tmp:
            victim = os.path.join(tmp, "victim.txt")
            with open(victim, "w") as f:
                f.write("precious\n")
            target = os.path.join(tmp, "out.svg")
            os.symlink(victim, target + ".partial")
            r = run("simulate", "--requests", 5, "--plot", target)
            self.assertNotIn("Traceback", r.err)
            with open(victim) as f:
                self.assertEqual(f.read(), "precious\n", "the write followed the planted symlink into another file")
            self.assertEqual(r.code, 0, r.err)
            self.assertTrue(os.path.isfile(target) and not os.path.islink(target))

    def test_a_planted_partial_symlink_does_not_redirect_calibrate_out(self):
        # issue 20 finding 3: the same for calibrate --out (the other write_file user)
        with tempfile.TemporaryDirectory() as tmp:
            shape = ["--model", "smollm2-135m-q8_0", "--hardware", "cpu-4vcpu", "--kv-tokens", "4096",
                     "--max-num-seqs", "4", "--output-tokens", "64", "--requests", "8", "--prompt-tokens", "40",
                     "--json"]
            reports = []
            for clients in (1, 4):
                r = run("simulate", *shape, "--concurrency", clients)
                self.assertEqual(r.code, 0, r.err)
                reports.append(os.path.join(tmp, f"c{clients}.json"))
                with open(reports[-1], "w") as f:
                    f.write(r.out)
            victim = os.path.join(tmp, "victim.txt")
            with open(victim, "w") as f:
                f.write("precious\n")
            target = os.path.join(tmp, "fitted.json")
            os.symlink(victim, target + ".partial")
            r = run("calibrate", *reports, "--out", target)
            with open(victim) as f:
                self.assertEqual(f.read(), "precious\n", "calibrate --out followed the planted symlink")

    def test_plot_equal_to_the_trace_is_refused_and_the_trace_kept(self):
        # issue 20 finding 3: --plot equal to --trace overwrites the input
        with tempfile.TemporaryDirectory() as tmp:
            trace = os.path.join(tmp, "t.jsonl")
            text = "".join(json.dumps({"arrival": i * 0.1, "prompt_tokens": 50, "output_tokens": 5}) + "\n"
                           for i in range(5))
            for flag in ("--plot", "--timeline"):
                with self.subTest(flag=flag):
                    with open(trace, "w") as f:
                        f.write(text)
                    r = run("simulate", "--trace", trace, flag, trace)
                    with open(trace) as f:
                        self.assertEqual(f.read(), text, f"{flag} overwrote the trace it read")
                    self.assertEqual(r.code, 2, r.err)
                    self.assertEqual(len(r.lines()), 1, r.err)
                    self.assertIn(flag, r.lines()[0])

    def test_compare_timeline_equal_to_its_run_is_refused(self):
        # issue 20 finding 3: the same rule for compare (its --timeline onto the requests.jsonl it reads)
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = os.path.join(tmp, "run")
            os.mkdir(run_dir)
            source = os.path.join(FIXTURES, "vllm-runs", "rtx4090-llama-3.1-8b")
            for name in ("meta.json", "requests.jsonl"):
                with open(os.path.join(source, name)) as f, open(os.path.join(run_dir, name), "w") as g:
                    g.write(f.read())
            requests = os.path.join(run_dir, "requests.jsonl")
            with open(requests) as f:
                before = f.read()
            r = run("compare", requests, "--timeline", requests, timeout=60)
            with open(requests) as f:
                self.assertEqual(f.read(), before, "compare --timeline overwrote the run it read")
            self.assertEqual(r.code, 2, r.err)



if __name__ == "__main__":
    unittest.main()
