"""A careless user's first hour, second pass (issue 20): wrong numbers or commands a run gives
without complaint (a warm-up that drops the wrong requests, a rerun command naming the wrong
file, a default that fails requests, a label that says requests for conversations), claims of
explain its own simulator contradicts, and the README's exit codes. Each test runs main.py as a
user does (bounded.py) and asserts what the user sees."""
import json
import os
import re
import shlex
import subprocess
import tempfile
import unittest
import unittest.mock

from bounded import jsonl, readme_section, run, write_json
from helpers import FIXTURES, call_cli, main, main_command
from hostile_server import FakeServer, paced

WORDS = re.compile(r"\S+")


def last_user_words(body):
    """What a server's tokenizer would count, in words: the last user message."""
    return len(WORDS.findall(body["messages"][-1]["content"]))


class WarmupOnUnsortedTrace(unittest.TestCase):
    """# issue 20 finding 18: --warmup on an unsorted trace drops the first N lines of the file,
    not the first N requests sent. Lines: A (sent at 5 s, 100 tokens), B (sent first, at 0 s, 7),
    C (6 s, 13), D (7 s, 17): --warmup 1 must drop B, so 130 prompt tokens are measured."""
    ROWS = [{"arrival": 5.0, "prompt_tokens": 100, "output_tokens": 2},
            {"arrival": 0.0, "prompt_tokens": 7, "output_tokens": 2},
            {"arrival": 6.0, "prompt_tokens": 13, "output_tokens": 2},
            {"arrival": 7.0, "prompt_tokens": 17, "output_tokens": 2}]

    def test_simulate_warmup_drops_the_first_request_sent(self):
        # issue 20 finding 18 (simulate)
        with tempfile.TemporaryDirectory() as tmp:
            trace = jsonl(os.path.join(tmp, "unsorted.jsonl"), self.ROWS)
            r = run("simulate", "--trace", trace, "--warmup", 1, "--json")
        self.assertEqual(r.code, 0, r.seen())
        self.assertEqual(r.json()["total_input_tokens"], 130, "the warm-up dropped a request other than the first sent")

    def test_loadgen_warmup_drops_the_first_request_sent(self):
        # issue 20 finding 18 (loadgen): the server counts one token a word of the prompt
        with tempfile.TemporaryDirectory() as tmp, FakeServer(paced(tokens=2, prompt_of=last_user_words)) as server:
            trace = jsonl(os.path.join(tmp, "unsorted.jsonl"), self.ROWS)
            r = run("loadgen", "--url", server.url, "--trace", trace, "--time-scale", 0.1, "--warmup", 1,
                    "--no-size-prompts", "--json")
        self.assertEqual(r.code, 0, r.seen())
        report = r.json()
        self.assertEqual(report["completed"], 3)
        self.assertEqual(report["total_input_tokens"], 130, "the warm-up dropped a request other than the first sent")


class SameNamedHardware(unittest.TestCase):
    """# issue 20 finding 19: two hardware JSONs with the same name: search's rerun line names the
    wrong file."""

    def test_the_rerun_command_names_the_file_that_met_the_slo(self):
        # issue 20 finding 19
        r = run("presets", "h100-sxm-80gb")
        fast = dict(json.loads(r.out), name="gpu")
        slow = dict(fast, bandwidth_gbs=200, tflops=20, price_per_hour=0.5)
        with tempfile.TemporaryDirectory() as tmp:
            fast_path = write_json(os.path.join(tmp, "fast.json"), fast)
            slow_path = write_json(os.path.join(tmp, "slow.json"), slow)
            args = ("search", "--hardware", f"{fast_path},{slow_path}", "--rate", 2, "--slo", "ttft_p95:500",
                    "--requests", 40, "--jobs", 1)
            r = run(*args)
            self.assertEqual(r.code, 0, r.seen())
            rerun = [line for line in r.out.splitlines() if line.startswith("rerun it:")]
            self.assertEqual(len(rerun), 1, r.out)
            self.assertIn(fast_path, rerun[0], "the rerun names the other file with the same name")
            r = run(*args, "--json")
            for item in r.json()["deployments"]:
                fast_one = item["best"] is not None
                for probe in item["probes"]:
                    self.assertIn(fast_path if fast_one else slow_path, probe["rerun"])


class PresetMistakes(unittest.TestCase):
    """# issue 20 finding 24: MiB typed as GiB is accepted; --model a,b says "unknown model"."""

    def test_memory_gib_24000_is_refused_with_a_hint(self):
        # issue 20 finding 24
        r = run("presets", "l4-24gb")
        hw = dict(json.loads(r.out), name="my-l4", memory_gib=24000)
        with tempfile.TemporaryDirectory() as tmp:
            path = write_json(os.path.join(tmp, "l4.json"), hw)
            r = run("capacity", "--hardware", path)
        self.assertEqual(r.code, 2, r.seen())
        self.assertEqual(len(r.lines()), 1, r.err)
        self.assertIn("memory_gib", r.lines()[0])
        self.assertRegex(r.lines()[0], r"(?i)MiB|GiB")

    def test_a_list_of_models_says_lists_are_for_search(self):
        # issue 20 finding 24: --model a,b
        for argv in (("simulate", "--requests", 5), ("sweep", "--requests", 5), ("capacity",)):
            with self.subTest(command=argv[0]):
                r = run(*argv, "--model", "llama-3.1-8b,qwen3-8b")
                self.assertEqual(r.code, 2, r.seen())
                self.assertEqual(len(r.lines()), 1, r.err)
                self.assertRegex(r.lines()[0], r"(?i)\b(lists?|search|sweep|one model)\b")

    def test_a_near_miss_names_the_fix(self):
        # From a careless-user pass (session 29): a short or mis-cased preset, a percent for a
        # fraction, an SLO bound of 0 got the generic message.
        for argv, said in ((("--hardware", "h100"), "did you mean h100-sxm-80gb?"),
                           (("--hardware", "H100-SXM-80GB"), "did you mean h100-sxm-80gb?"),
                           (("--model", "llama8b"), "did you mean llama-3.1-8b?"),
                           (("--gpu-memory-utilization", "90"), "a percent? write 0.9"),
                           (("--min-served", "95"), "a percent? write 0.95")):
            with self.subTest(argv=argv):
                r = run("simulate", "--requests", 5, *argv)
                self.assertEqual(r.code, 2, r.seen())
                self.assertEqual(len(r.lines()), 1, r.err)
                self.assertIn(said, r.lines()[0])
        # helper-46: each of these blamed something else (no room on the device; the bound; --slo '')
        for args, said in ((("capacity", "--kv-tokens", 10), "--kv-tokens 10 is less than one KV block of 16 tokens"),
                           (("simulate", "--goodput", "ttft:100,tpot:10"), "space-separated (ttft:200 tpot:15)"),
                           (("search", "--slo", "ttft_p95:500,"), "--slo 'ttft_p95:500,': an empty item")):
            with self.subTest(args=args):
                r = run(*args)
                self.assertEqual(r.code, 2, r.seen())
                self.assertIn(said, r.err)
        r = run("presets", "h100")          # helper-46: --hardware h100 suggested the name, presets h100 did not
        self.assertEqual(r.code, 2, r.seen())
        self.assertIn("unknown preset 'h100' (did you mean h100-sxm-80gb?)", r.err)
        r = run("search", "--slo", "ttft_p95:0")
        self.assertEqual(r.code, 2, r.seen())
        self.assertIn("the bound is milliseconds above 0", r.err)
        r = run("sweep", "--rate", "10,10", "--requests", 5)          # the same point ran, and printed, twice
        self.assertEqual(r.code, 2, r.seen())
        self.assertIn("10 is given twice in '10,10'", r.err)
        # helper-46: simulate reads 1,024 as 1024, and sweep ran two points, 1 and 24
        for flag, text in (("--max-num-seqs", "1,024"), ("--rate", "1,000"), ("--max-num-batched-tokens", "4,096")):
            with self.subTest(flag=flag):
                r = run("sweep", flag, text, "--requests", 5)
                self.assertEqual(r.code, 2, r.seen())
                self.assertIn(f"write {text.replace(',', '')} for one value", r.err)
        r = run("sweep", "--max-num-seqs", "2,04", "--requests", 5)       # no thousands comma to suggest (helper-47)
        self.assertEqual(r.code, 2, r.seen())
        self.assertIn("item 04 starts with a zero: write the items without leading zeros", r.err)
        # simulate reads a sweepable flag's 25,100 as one number, and says so (helper-57: a 25,100
        # GB/s link, in silence); --requests, which sweep does not vary, reads 1,000 quietly
        r = run("simulate", "--kv-link-gbs", "25,100", "--requests", "1,000", "--json")
        self.assertEqual(r.code, 0, r.seen())
        self.assertEqual(r.err.strip(), "servesim: --kv-link-gbs 25,100 is read as one value, 25100 (sweep would "
                                        "read 2 values)")
        # 8,192 has no leading zero: two points run, and stderr says which reading it took
        r = run("sweep", "--max-num-batched-tokens", "8,192", "--requests", 5, "--jobs", 1)
        self.assertEqual(r.code, 0, r.seen())
        self.assertIn("servesim: 8,192 is read as 2 values, 8, 192 (a list: write 8192 for one value)", r.err)
        with tempfile.TemporaryDirectory() as tmp:       # an SVG in a .png was written without a word
            r = run("simulate", "--requests", 5, "--plot", os.path.join(tmp, "run.png"))
            self.assertEqual(r.code, 2, r.seen())
            self.assertIn("servesim draws SVG", r.err)
            self.assertEqual(os.listdir(tmp), [])


class FirstHour(unittest.TestCase):
    """# issue 20 finding 26: defaults and labels a new user trips over."""

    def test_max_model_len_defaults_to_the_models_own_length(self):
        # issue 20 finding 26: a 5-turn run fails requests at the 4,096 default (llama-3.1-8b: 131,072)
        r = run("simulate", "--turns", 5, "--prompt-tokens", 1000, "--output-tokens", 200, "--requests", 50,
                "--rate", 1.5, "--json")
        self.assertNotIn("Traceback", r.err)
        report = r.json()
        self.assertEqual(report["failed"], 0, report.get("first_error_by_kind"))
        self.assertEqual(r.code, 0, r.seen())

    def test_turns_with_a_rate_labels_it_conversations_a_second(self):
        # issue 20 finding 26: "poisson 1.5 req/s" where 1.5 is conversations per second
        r = run("simulate", "--turns", 5, "--prompt-tokens", 100, "--output-tokens", 20, "--requests", 50,
                "--rate", 1.5)
        title = r.out.splitlines()[0]
        self.assertNotRegex(title, r"\b1\.5 req/s", "the conversation rate is labelled as a request rate")
        self.assertRegex(title, r"(?i)1\.5 conversations?")

    def test_evictions_beside_a_low_kv_peak_are_explained(self):
        # issue 20 finding 26: "evictions 12,748" beside a 42 % KV peak needs its one-line explanation
        r = run("simulate", "--prefix-caching", "on", "--requests", 1000, "--concurrency", 32)
        self.assertEqual(r.code, 0, r.seen())
        steps = next(l for l in r.out.splitlines() if l.startswith("steps"))
        evictions = int(re.search(r"evictions ([\d,]+)", steps).group(1).replace(",", ""))
        self.assertGreater(evictions, 0, "the case no longer evicts; pick another")
        explained = [l for l in r.out.splitlines() if re.search(r"(?i)evict", l) and not l.startswith("steps")]
        self.assertTrue(explained or re.search(r"evictions [\d,]+ \(", steps),
                        f"no explanation of {evictions:,} evictions beside the KV peak:\n{r.out}")

    def test_presets_show_where_each_price_comes_from(self):
        # issue 20 finding 26: preset prices mix providers with the provider only in source comments
        r = run("presets")
        self.assertEqual(r.code, 0, r.seen())
        for provider in ("Lambda", "Crusoe", "AWS", "RunPod", "Hyperstack"):
            self.assertIn(provider, r.out, f"presets does not say which prices are {provider}'s")


class ReadmeExitCodes(unittest.TestCase):
    """# issue 20 finding 27: the README's exit-code section and the code disagree."""

    def test_sweep_compare_exit_code_matches_the_readme(self):
        # issue 20 finding 27: `sweep --compare static,slots,paged` exits 1
        # 16 slots of 1,024 tokens: the slots mode fails the requests longer than a slot
        r = run("sweep", "--compare", "static,slots,paged", "--kv-tokens", 16384, "--max-num-seqs", 16,
                "--requests", 100, "--jobs", 1, "--json", timeout=120)
        self.assertNotIn("Traceback", r.err)
        section = readme_section()
        if r.code == 1:
            self.assertIn("--compare", section,
                          f"sweep --compare exits 1 ({r.lines()}) but the exit-code section says sweep exits 1 "
                          f"when no point fits, and does not mention --compare")
        else:
            self.assertEqual(r.code, 0, r.seen())

    def test_plot_into_a_missing_directory_exit_code_matches_the_readme(self):
        # issue 20 finding 27: a missing --plot directory exits 2 where pictures are listed under 1
        r = run("simulate", "--requests", 5, "--plot", "/nonexistent-dir-issue20/x.svg")
        self.assertNotIn("Traceback", r.err)
        section = readme_section()
        pictures = next(p for p in section.split("\n- ") if "--plot" in p)
        if r.code == 2:
            self.assertRegex(pictures, r"(?s)(director|missing).*\b2\b|\b2\b.*(director|missing)",
                             f"--plot into a missing directory exits 2, but the README says: {pictures!r}")
        else:
            self.assertEqual(r.code, 1, r.seen())
            self.assertIn("throughput", r.out, "exit 1 should keep the report (the picture is written after it)")


if __name__ == "__main__":
    unittest.main()


class ClosedStdout(unittest.TestCase):
    def test_a_closed_stdout_is_refused_before_the_run(self):
        # helper-53: `loadgen ... >&-` sent and measured the whole load, then died writing its report
        command = " ".join(map(shlex.quote, main_command())) + " simulate --requests 5 >&-"
        r = subprocess.run(["sh", "-c", command], stderr=subprocess.PIPE, text=True, timeout=120)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(r.stderr, "servesim: stdout is closed: give it somewhere to go (`>/dev/null`, or a file) "
                                   "before the run\n")


class UnwritableDirectory(unittest.TestCase):
    def test_a_picture_into_a_directory_that_takes_no_file_is_refused_before_the_run(self):
        # helper-53: as a user without the right, --plot into a read-only directory sent the whole
        # load, then failed to write. (The tests run as root, to whom every directory is open: a
        # file is tried there, so the trial is refused here. helper-60: /proc, which os.access
        # called writable to root, was found out after the run.)
        real = main.tempfile.mkstemp

        def refused(*args, dir=None, **kwargs):
            if dir == tmp:
                raise PermissionError(13, "Permission denied")
            return real(*args, dir=dir, **kwargs)
        with tempfile.TemporaryDirectory() as tmp, unittest.mock.patch.object(main.tempfile, "mkstemp", refused):
            code, out, err = call_cli("simulate", "--requests", "5", "--plot", os.path.join(tmp, "x.svg"))
            self.assertEqual((code, out), (2, ""), err)
            self.assertIn(f"cannot write in the directory {tmp} (Permission denied)", err)
            self.assertEqual(os.listdir(tmp), [])
        if os.path.isdir("/dev/shm"):         # helper-63: a tmpfs under /dev takes a new file
            path = f"/dev/shm/servesim-{os.getpid()}.csv"
            self.addCleanup(lambda: os.path.exists(path) and os.remove(path))
            code, out, err = call_cli("simulate", "--requests", "5", "--timeline", path)
            self.assertEqual(code, 0, err)
            self.assertTrue(os.path.isfile(path))
        # helper-63: a Hugging Face id is no file, so it still gets the preset it is most like
        code, out, err = call_cli("simulate", "--model", "meta-llama/Llama-3.1-8B-Instruct")
        self.assertIn("did you mean llama-3.1-8b?", err)
        if os.path.isdir("/proc"):
            code, out, err = call_cli("simulate", "--requests", "5", "--plot", "/proc/x.svg")
            self.assertEqual((code, out), (2, ""), err)
            self.assertIn("--plot /proc/x.svg: no such file, and /proc takes no new one", err)
            code, _, err = call_cli("simulate", "--requests", "5", "--timeline", "/dev/stdout")
            self.assertEqual(code, 0, err)


class WarmupOfARateProfile(unittest.TestCase):
    def test_a_warmup_a_profile_draws_no_more_requests_than_is_refused(self):
        # helper-62: 100 warm-up requests of a 36-request profile printed "0 completed", exit 0;
        # with --seeds, a seed that drew 21 requests was averaged in as zeros
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "rp.csv")
            with open(path, "w") as f:
                f.write("time_s,rate\n0,1\n10,2\n20,2\n")
            code, out, err = call_cli("simulate", "--rate-profile", path, "--warmup", "100")
            self.assertEqual((code, out), (2, ""), err)
            self.assertRegex(err, r"--warmup 100 leaves no request to measure: rate profile .*rp.csv sends \d+ with "
                                  r"--seed 7; lower --warmup")
            # helper-62: loadgen asked the server first, and a server that was down hid the bad input
            with open(path, "w") as f:
                f.write("time_s,rate\n0,0\n10,0\n")
            code, out, err = call_cli("loadgen", "--url", "http://127.0.0.1:9", "--rate-profile", path)
            self.assertEqual(code, 2, err)
            self.assertIn("sends no requests", err)


class NamesAsGiven(unittest.TestCase):
    def test_a_file_name_with_a_line_break_or_an_escape_is_one_printable_line(self):
        # helper-62: the error split over two lines and the ESC reached the terminal, as did the title
        name = "bad\nname\x1b[31m.jsonl"
        code, out, err = call_cli("simulate", "--trace", name)
        self.assertEqual(code, 2, err)
        self.assertEqual(len(err.strip().splitlines()), 1, err)
        self.assertNotIn("\x1b", err)
        self.assertIn("bad name\\x1b[31m.jsonl", err)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, name)
            with open(os.path.join(FIXTURES, "burst.jsonl")) as f, open(path, "w") as g:
                g.write(f.read())
            code, out, err = call_cli("simulate", "--trace", path, "--hardware", "l4-24gb", "--max-model-len", "4096")
        self.assertEqual(code, 0, err)
        self.assertNotIn("\x1b", out)
        self.assertIn("name\\x1b[31m.jsonl", out.splitlines()[0])


class HelperSixtyFiveAndSix(unittest.TestCase):
    """What helpers 65 and 66 typed, each read as the servers' own flags read it, or refused in one line."""

    def json_of(self, *args):
        code, out, err = call_cli("simulate", "--json", *args)
        self.assertEqual(code, 0, err)
        return json.loads(out), err

    def test_vllms_spellings_and_grouped_numbers(self):
        report, _ = self.json_of("--requests", "8", "--num-gpu-blocks-override", "20000", "--max-model-len", "8192")
        self.assertEqual(report["engine"]["num_blocks"], 20000)
        for method in ("awq", "gptq", "gptq_marlin"):
            self.assertEqual(self.json_of("--requests", "8", "--quantization", method)[0]["config"]["quantization"], "int4")
        code, _, err = call_cli("simulate", "--quantization", "squeezellm")
        self.assertEqual(code, 2)
        self.assertIn("is not one of none, fp8, int4 (or awq, gptq", err)
        self.assertEqual(self.json_of("--requests", "8", "--seed", "1,000")[0]["config"]["seed"], 1000)
        sweep = run("sweep", "--help").out
        self.assertIn("(default: 1,8,32,128,256 clients, without --rate)", " ".join(sweep.split()))
        code, _, err = call_cli("sweep", "--requests", "8", "--rate", "5,5.0000001")
        self.assertEqual(code, 2)
        self.assertIn("5.0000001 is given twice in '5,5.0000001' (as a table shows it)", err)
        # 20 requests of 400-turn conversations are one conversation of 20 turns: 19 days, not 399
        self.assertEqual(self.json_of("--requests", "20", "--turns", "400", "--think-time", "86400")[0]["completed"], 20)

    def test_settings_that_change_nothing_or_that_the_engine_lacks(self):
        code, _, err = call_cli("simulate", "--kv-offloading-size", "0", "--kv-offloading-backend", "lmcache")
        self.assertEqual(code, 2)
        self.assertIn("--kv-offloading-backend changes nothing with --kv-offloading-size 0, which is off", err)
        for flags, said in ((("--prefix-caching", "--kv-offloading-size", "4"), "no --kv-offloading-size"),
                            (("--model", "qwen3-30b-a3b", "-dp", "2", "--enable-expert-parallel"),
                             "no --enable-expert-parallel")):
            with self.subTest(flags=flags):
                code, _, err = call_cli("simulate", "--engine", "llamacpp", *flags)
                self.assertEqual(code, 2)
                self.assertIn(f"llama.cpp's server has {said} (a vLLM feature)", err)

    def test_what_a_report_says_of_its_own_run(self):
        code, out, err = call_cli("simulate", "--requests", "200", "--rate", "20", "--seed", "3")
        self.assertEqual(code, 0, err)
        self.assertNotIn("-0.000", out)
        run, _ = self.json_of("--disaggregate", "--requests", "100", "--rate", "5", "--prefix-tokens", "2000",
                              "--num-prefixes", "1", "--prompt-tokens", "100", "--output-tokens", "50", "--prefix-caching")
        self.assertGreater(run["prefill_engine"]["prefix_hit_rate"], 0.9)
        code, out, err = call_cli("simulate", "--disaggregate", "-tp", "2", "--requests", "100", "--rate", "5",
                                  "--prefix-tokens", "2000", "--num-prefixes", "1", "--prompt-tokens", "100",
                                  "--output-tokens", "50", "--prefix-caching")
        self.assertEqual(code, 0, err)
        self.assertIn("prefill on h100-sxm-80gb x 2 (tensor parallel), decode on h100-sxm-80gb x 2", out)
        self.assertRegex(out, r"prefill .*prefix hits 9\d\.\d%")
        self.assertIn("prefix hits: the prefill engine's (below)", out)
        run, _ = self.json_of("-pp", "2", "-tp", "8", "--model", "llama-3.1-70b", "--inter-node-gbs", "25",
                              "--requests", "10")
        self.assertEqual((run["config"]["gpus_per_node"], run["config"]["inter_node_gbs"]), (8, 25.0))
        # a preempted request's KV loaded back from the host tier is said as such, not as a prefix hit
        code, out, err = call_cli("simulate", "--hardware", "l4-24gb", "--turns", "4", "--think-time", "5", "--rate",
                                  "0.3", "--requests", "800", "--prefix-caching", "--prompt-tokens", "200-400",
                                  "--output-tokens", "100-300", "--kv-offloading-size", "1", "--max-model-len", "8192")
        self.assertEqual(code, 0, err)
        self.assertRegex(out, r"\d+ loads \(\d+ of them a preempted request's own KV, back\)")


class HelperSixtyEight(unittest.TestCase):
    def test_engines_defaults_and_flags_a_mode_ignores(self):
        # vLLM's own batch rules for knobs not given: no chunked prefill, a budget of at least --max-model-len
        code, out, err = call_cli("simulate", "--engine", "vllm", "--no-chunked-prefill", "--requests", "8",
                                  "--prompt-tokens", "9000", "--output-tokens", "10", "--json")
        self.assertEqual(code, 0, err)
        report = json.loads(out)
        self.assertEqual(report["completed"], 8)
        self.assertEqual(report["config"]["max_num_batched_tokens"], 131072)
        # ... and on a CPU 128 sequences and 2,048 tokens
        code, out, err = call_cli("simulate", "--engine", "vllm", "--hardware", "cpu-4vcpu", "--model",
                                  "smollm2-135m-q8_0", "--requests", "4", "--json")
        self.assertEqual((json.loads(out)["config"]["max_num_seqs"], json.loads(out)["config"]["max_num_batched_tokens"]),
                         (128, 2048))
        code, out, err = call_cli("simulate", "--engine", "trtllm", "--requests", "8")
        self.assertIn("on h100-sxm-80gb, engine trtllm  8 requests", out.splitlines()[0])
        code, _, err = call_cli("simulate", "--engine", "sglang", "--cost-model", "kernels", "--async-scheduling", "off",
                                "--requests", "4")
        self.assertIn("--async-scheduling changes nothing under --engine sglang, whose profile has no CPU work", err)
        for flag in (("--no-chunked-prefill",), ("--max-num-batched-tokens", "512"), ("--max-tokens-in-flight", "3000"),
                     ("--scheduler-reserve-full-isl",)):
            with self.subTest(flag=flag):
                code, _, err = call_cli("simulate", "--batching", "static", "--requests", "8", *flag)
                self.assertEqual(code, 2)
                self.assertIn(f"--batching static takes --max-num-seqs requests and runs them whole, with no token "
                              f"budget a step: {flag[0]} changes nothing there", err)


class RampsWhereTheLoadIsChosen(unittest.TestCase):
    RAMP = ("--ramp-up-strategy", "linear", "--ramp-up-start-rps", 1, "--ramp-up-end-rps", 10)

    def test_a_ramp_is_refused_naming_what_the_command_varies_not_a_flag_never_given(self):
        # helper-76: "a ramp sets the arrival rate itself: drop --rate", of a search given no --rate,
        # and "drop --concurrency" of a sweep whose default axis it was
        for args, said in ((("search", "--slo", "ttft_p95:1000"), "search sets each probe's load itself"),
                           (("sweep", "--requests", 50), "sweep cannot vary --concurrency (its axis when no other"),
                           (("sweep", "--requests", 50, "--rate", "1,2"), "sweep cannot vary --rate: sweep an engine")):
            with self.subTest(args[0]):
                code, out, err = call_cli(*args, *self.RAMP)
                self.assertEqual((code, out), (2, ""), err)
                self.assertIn(said, err)
                self.assertNotIn("drop --rate", err)
        code, out, err = call_cli("sweep", "--requests", 50, "--max-num-seqs", "8,16", *self.RAMP)
        self.assertEqual(code, 0, err)
        # helper-78: with --gpus the load is always an axis, so "sweep an engine setting" would fail too
        code, out, err = call_cli("sweep", "--gpus", 2, "-tp", "1,2", "--requests", 50, *self.RAMP)
        self.assertEqual(code, 2)
        self.assertIn("sweep --gpus varies the load with each layout; drop the ramp or --gpus", err)
        # and search's own --rate takes one value for its own reason, not "sweep does not vary it"
        code, out, err = call_cli("search", "--rate", "1,2", "--slo", "ttft_p95:1000")
        self.assertEqual(code, 2)
        self.assertIn("search ranks every deployment at one load", err)
        self.assertNotIn("sweep and search do not vary it", err)
