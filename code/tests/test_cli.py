"""What a user sees at the terminal: one-line errors with exit 2, help, presets."""
import json
import os
import re
import tempfile
import unittest

from helpers import call_cli, run_cli


class BadInput(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def write(self, name, text):
        path = os.path.join(self.tmp.name, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def assert_bad(self, *args, mentions=()):
        code, out, err = call_cli(*args)
        self.assertEqual(code, 2, (args, err))
        self.assertEqual(out, "")
        self.assertEqual(len(err.strip().splitlines()), 1, err)
        self.assertNotIn("Traceback", err)
        for word in mentions:
            self.assertIn(word, err)
        return err

    def test_a_bad_input_exits_2_with_one_line_from_the_real_command(self):
        code, out, err = run_cli("simulate", "--rate", "-3")
        self.assertEqual((code, out), (2, ""))
        self.assertEqual(len(err.strip().splitlines()), 1)
        self.assertNotIn("Traceback", err)

    def test_unknown_presets(self):
        self.assert_bad("capacity", "--hardware", "tpu-v9", mentions=("tpu-v9", "h100-sxm-80gb"))
        self.assert_bad("simulate", "--model", "gpt-9", mentions=("gpt-9", "presets"))

    def test_bad_numbers(self):
        self.assert_bad("simulate", "--rate", "-3", mentions=("--rate", "at least"))
        self.assert_bad("simulate", "--rate", "abc", mentions=("--rate",))
        self.assert_bad("sweep", "--concurrency", "1,0,8", mentions=("--concurrency",))
        self.assert_bad("simulate", "--requests", "0", mentions=("--requests",))
        self.assert_bad("simulate", "--prompt-tokens", "900-100", mentions=("backwards",))
        self.assert_bad("simulate", "--prompt-tokens", "ten", mentions=("--prompt-tokens",))
        self.assert_bad("capacity", "--gpu-memory-utilization", "1.5", mentions=("fraction",))
        # helper-37: 1.5 was read as a percent, "write 0.015"
        self.assertNotIn("percent", self.assert_bad("search", "--slo", "ttft_p95:1000", "--confidence", "1.5"))

    def test_conflicting_and_unknown_flags(self):
        self.assert_bad("simulate", "--rate", "2", "--concurrency", "4", mentions=("not allowed",))
        self.assert_bad("capacity", "--kv-tokens", "4096", "--num-gpu-blocks", "10")
        self.assert_bad("simulate", "--frobnicate")
        self.assert_bad("explode")
        self.assert_bad()

    def test_a_flag_is_spelled_in_full_and_a_near_miss_names_the_flag(self):
        # helper-37: `plan --rate 5` was read as --rate-profile 5 ("rate profile 5: cannot read it")
        self.assert_bad("plan", "--slo", "ttft_p95:1000", "--rate", "5",
                        mentions=("main.py plan: unrecognized arguments: --rate 5", "did you mean --rate-profile?"))
        self.assert_bad("sweep", "--max-num-seq", "4", mentions=("main.py sweep:", "did you mean --max-num-seqs?"))
        self.assert_bad("simulate", "--concurency", "4", mentions=("did you mean --concurrency?",))
        self.assertNotIn("did you mean", self.assert_bad("simulate", "--frobnicate"))

    def test_malformed_trace_lines_name_the_file_line_and_field(self):
        path = self.write("t.jsonl", '{"arrival": 0, "prompt_tokens": 10, "output_tokens": 5}\n'
                                     '{"arrival": 1, "prompt_tokens": -4, "output_tokens": 5}\n')
        self.assert_bad("simulate", "--trace", path, mentions=(path, "line 2", "prompt_tokens"))
        path = self.write("u.jsonl", '{"arrival": 0, "prompt_tokens": 10}\n')
        self.assert_bad("simulate", "--trace", path, mentions=("line 1", "output_tokens"))
        path = self.write("v.jsonl", 'arrival,prompt\n')
        self.assert_bad("simulate", "--trace", path, mentions=("line 1", "JSON"))
        path = self.write("w.jsonl", '{"arrival": 0, "prompt_tokens": 10, "output_tokens": 5, "colour": 1}\n')
        self.assert_bad("simulate", "--trace", path, mentions=("colour",))
        path = self.write("x.jsonl", '{"arrival": 0, "prompt_tokens": 10, "output_tokens": 5, "prefix": "s", "prefix_tokens": 20}\n')
        self.assert_bad("simulate", "--trace", path, mentions=("prefix_tokens",))
        self.assert_bad("simulate", "--trace", os.path.join(self.tmp.name, "missing.jsonl"), mentions=("cannot read",))
        self.assert_bad("simulate", "--trace", self.write("empty.jsonl", "\n"), mentions=("no requests",))

    def test_bad_preset_files(self):
        self.assert_bad("capacity", "--hardware", self.write("h.json", "{not json"), mentions=("JSON",))
        self.assert_bad("capacity", "--hardware", self.write("h2.json", '{"name": "x", "memory_gib": 10}'),
                        mentions=("missing", "bandwidth_gbs"))
        self.assert_bad("capacity", "--model", self.write("m.json", json.dumps(
            {"name": "m", "params": 1e9, "layers": 10.5, "kv_heads": 2, "head_dim": 64})), mentions=("layers",))
        self.assert_bad("capacity", "--model", self.write("m2.json", json.dumps(
            {"name": "m", "params": -1, "layers": 10, "kv_heads": 2, "head_dim": 64})), mentions=("params",))


class PresetFiles(unittest.TestCase):
    def test_a_users_own_gpu_and_model_from_json(self):
        with tempfile.TemporaryDirectory() as tmp:
            presets = json.loads(run_cli("presets", "--json")[1])
            gpu = dict(presets["hardware"][0], name="my-gpu", memory_gib=40.0)
            path = os.path.join(tmp, "gpu.json")
            with open(path, "w") as f:
                json.dump(gpu, f)
            code, out, err = run_cli("capacity", "--hardware", path, "--json")
        self.assertEqual(code, 0, err)
        plan = json.loads(out)
        self.assertEqual(plan["hardware"]["name"], "my-gpu")
        self.assertLess(plan["num_blocks"], 27997)

    def test_presets_lists_every_name(self):
        code, out, _ = run_cli("presets")
        self.assertEqual(code, 0)
        for name in ("h100-sxm-80gb", "a100-sxm-80gb", "h200-141gb", "l4-24gb", "rtx-4090-24gb", "cpu-4vcpu",
                     "llama-3.1-8b", "llama-3.1-70b", "smollm2-135m-q8_0", "qwen2.5-7b"):
            self.assertIn(name, out)


class Help(unittest.TestCase):
    def test_every_flag_of_every_command_says_its_default_or_that_it_is_required(self):
        # helper-46: the output switches (--json, --csv, --detailed, --table) and plan's --slo said neither
        for command in ("capacity", "simulate", "sweep", "search", "plan", "loadgen", "merge", "compare", "calibrate",
                        "validate", "explain", "presets"):
            code, out, _ = run_cli(command, "--help")
            self.assertEqual(code, 0)
            options = out[out.index("options:"):]
            # Each option's block: from its line to the next option line or group heading.
            blocks = re.split(r"\n(?=  -|\S)", options)
            described = [b for b in blocks if b.lstrip().startswith("--")]
            self.assertGreater(len(described), 0, command)
            for block in described:
                text = " ".join(block.split())
                self.assertRegex(text, r"\((default|required)\b", (command, block.split()[0]))

    def test_a_settings_help_says_what_it_does_in_that_command(self):
        # helper-46: search --requests promised simulate's default, plan's --rate-profile named --requests
        # (plan has none), capacity's --kv-offloading-size asked for --prefix-caching (it has none)
        _, search, _ = run_cli("search", "--help")
        self.assertIn("not used by a sustained probe", " ".join(search.split()))
        _, plan, _ = run_cli("plan", "--help")
        self.assertNotIn("unless --requests caps them", " ".join(plan.split()))
        # ... nor its --steady-requests and --turns, which spoke of the --requests plan does not take
        self.assertNotRegex(plan.replace("--steady-requests", ""), r"--requests\b")
        self.assertNotRegex(plan, r"(?m)^  --requests\b")
        _, capacity, _ = run_cli("capacity", "--help")
        self.assertNotIn("; needs --prefix-caching", " ".join(capacity.split()))
        # helper-49: --min-served's help said 95% where a run passes at 93.2%: the whole rule is said
        _, simulate, _ = run_cli("simulate", "--help")
        served = " ".join(simulate.split("\n  --min-served F", 1)[1].split("\n  --max-queue-growth", 1)[0].split())
        self.assertIn("less the uncertainty of counting ends", served)
        self.assertIn("never below 2F - 1", served)
        self.assertIn("repeats the whole of a --trace", " ".join(search.split()))
        # helper-48: search's and plan's --seeds promised sweep's spread, which neither prints
        for text in (search, plan):
            seeds = " ".join(text.split("\n  --seeds N", 1)[1].split("\n  --confidence F", 1)[0].split())
            self.assertNotIn("10th-90th", seeds)
            self.assertIn("--confidence", seeds)


if __name__ == "__main__":
    unittest.main()


class VllmSpellings(unittest.TestCase):
    def test_vllms_own_flag_names_and_kv_dtypes_are_read_as_servesims(self):
        # helper-61: --enable-prefix-caching (which explain tells users to pass),
        # --no-enable-chunked-prefill and --kv-cache-dtype fp8_e4m3 were refused
        def config(*flags):
            code, out, err = call_cli("simulate", "--requests", "5", *flags, "--json")
            self.assertEqual(code, 0, err)
            return json.loads(out)["config"]
        self.assertTrue(config("--enable-prefix-caching")["prefix_caching"])
        self.assertFalse(config("--enable-prefix-caching", "--no-enable-prefix-caching")["prefix_caching"])
        self.assertFalse(config("--no-enable-chunked-prefill", "--max-model-len", "8192")["chunked_prefill"])
        self.assertTrue(config("--enable-chunked-prefill")["chunked_prefill"])
        self.assertEqual(config("--kv-cache-dtype", "fp8_e5m2")["kv_cache_dtype"], "fp8")
        code, out, err = call_cli("sweep", "--requests", "5", "--concurrency", "1,2", "--enable-prefix-caching", "--json")
        self.assertEqual(code, 0, err)
        self.assertTrue(all(p["config"]["prefix_caching"] for p in json.loads(out)))


class LongTitles(unittest.TestCase):
    def test_a_title_wider_than_the_picture_is_wrapped_at_its_parts(self):
        # helper-62: outputs/plan-day.svg's title ran past both edges of its 760 px
        from helpers import main
        title = ("plan llama-3.1-8b on l4-24gb  rate profile code/fixtures/profiles/servegen-day.csv in 24 windows "
                 "of 60 min  slo ttft_p95 <= 2000 ms")
        self.assertEqual(main.wrapped(title, 89), ["plan llama-3.1-8b on l4-24gb",
                                                   "rate profile code/fixtures/profiles/servegen-day.csv in 24 windows "
                                                   "of 60 min", "slo ttft_p95 <= 2000 ms"])
        self.assertEqual(main.wrapped("a short one", 89), ["a short one"])
        self.assertTrue(all(len(line) <= 30 for line in main.wrapped("word " * 40, 30)))
        svg = main.svg_figure(title, [main.Panel("p", "x", "y", [])], columns=1, width=760)
        self.assertEqual(svg.count('font-size="15"'), 3)
        self.assertIn('height="410"', svg)        # 340 of panel, 34 of title, and two more lines of 18 px
