"""validate: the published runs replayed and scored out of sample. The rule pinned here: a source's
runs are scored with a kernel scale fitted on the other sources alone, so nothing a source
measured can move the scale it is scored with. Engine profiles and their sources are checked
against the values the engines' own code sets."""
import json
import math
import os
import re
import shutil
import tempfile
import unittest

from helpers import FIXTURES, call_cli, main, run_cli


def closed_loop_run(name, engine="vllm", tpot=10.0, ttft=100.0, concurrency=2):
    return {"name": name, "engine": engine, "hardware": "h100-sxm-80gb", "model": "llama-3.1-8b",
            "load": {"concurrency": concurrency, "requests": 12, "warmup": 2, "prompt_tokens": 64, "output_tokens": 16},
            "measured": {"mean_tpot_ms": tpot, "mean_ttft_ms": ttft}}


def write_corpus(folder, sources):
    for source, runs in sources.items():
        os.makedirs(os.path.join(folder, source))
        with open(os.path.join(folder, source, "runs.json"), "w") as f:
            json.dump({"runs": runs}, f)


def result(source, tpot_measured, tpot_predicted):
    return {"source": source, "rows": {"mean_tpot_ms": {"measured": tpot_measured, "servesim": tpot_predicted,
                                                         "error": tpot_predicted / tpot_measured - 1}}}


class LeaveOneSourceOut(unittest.TestCase):
    def test_each_source_is_scored_with_the_fit_from_the_others(self):
        results = [result("a", 12, 10), result("a", 14, 10), result("b", 20, 10), result("c", 10, 10)]
        fits = main.left_out_fits(results)
        # b alone says 2.0, c alone 1.0: a's scale is their geometric mean; a's own 1.2-1.4 is not read.
        self.assertAlmostEqual(fits["a"], math.sqrt(2.0))
        self.assertAlmostEqual(fits["c"], math.exp((math.log(math.sqrt(1.2 * 1.4)) + math.log(2.0)) / 2))

    def test_nothing_a_source_measured_moves_its_own_scale(self):
        base = [result("a", 12, 10), result("b", 20, 10), result("c", 10, 10)]
        poisoned = [result("a", 1200, 10), *base[1:]]
        self.assertEqual(main.left_out_fits(base)["a"], main.left_out_fits(poisoned)["a"])
        self.assertNotEqual(main.left_out_fits(base)["b"], main.left_out_fits(poisoned)["b"])

    def test_a_source_with_many_runs_gets_one_vote(self):
        many = [result("a", 30, 10)] * 20 + [result("b", 10, 10)]
        self.assertAlmostEqual(main.fit_kernel_scale(many), math.sqrt(3.0))

    def test_a_closed_loop_agreeing_by_construction_is_not_counted_as_a_verdict_judged(self):
        # helper-49: "46 judged, 0 wrong" counted 43 closed loops, sustained on both sides by construction
        def run(name, measured, servesim, closed_loop):
            return {"name": name, "source": "a", "rows": {}, "near_capacity": False,
                    "sustained": {"measured": measured, "servesim": servesim, "closed_loop": closed_loop}}
        summary = main.validation_summary([run("c1", True, True, True), run("c2", True, True, True),
                                           run("o1", False, False, False), run("o2", True, False, False)])
        self.assertEqual(summary["verdicts_judged"], 2)
        self.assertEqual(summary["verdicts_wrong"], ["o2"])
        self.assertEqual(summary["verdicts_by_construction"], 2)
        self.assertEqual(summary["verdicts"], {"overloaded": 1, "sustained": 1})

    def test_throughput_counts_where_no_tpot_was_published(self):
        r = {"source": "a", "rows": {"output_throughput": {"measured": 100.0, "servesim": 150.0, "error": 0.5}}}
        self.assertAlmostEqual(main.step_ratio(r), 1.5)        # predicted 1.5x as fast: steps 1.5x too cheap

    def test_validate_replays_a_source_at_the_scale_the_others_fit(self):
        with tempfile.TemporaryDirectory() as tmp:
            runs = {"a": [closed_loop_run("a1", tpot=5.0)], "b": [closed_loop_run("b1", tpot=8.0)],
                    "c": [closed_loop_run("c1", engine="trtllm", tpot=3.0)]}
            write_corpus(os.path.join(tmp, "one"), runs)
            runs["a"][0]["measured"]["mean_tpot_ms"] = 500.0
            write_corpus(os.path.join(tmp, "two"), runs)
            one = main.validate(os.path.join(tmp, "one"), "kernels")
            two = main.validate(os.path.join(tmp, "two"), "kernels")
            self.assertEqual(main.validate(os.path.join(tmp, "one"), "kernels", jobs=2), one)    # processes change nothing
        scored = {r["name"]: r for r in one["runs"]}
        self.assertEqual(scored["a1"]["kernel_scale"], one["kernel_scale"]["left_out"]["a"])
        self.assertEqual(one["kernel_scale"]["left_out"]["a"], two["kernel_scale"]["left_out"]["a"])
        self.assertEqual(scored["a1"]["rows"]["mean_tpot_ms"]["servesim"],
                         {r["name"]: r for r in two["runs"]}["a1"]["rows"]["mean_tpot_ms"]["servesim"])
        self.assertNotEqual(one["kernel_scale"]["left_out"]["b"], two["kernel_scale"]["left_out"]["b"])


class Corpus(unittest.TestCase):
    def test_the_committed_corpus_meets_the_issues_coverage(self):
        runs, skipped = main.read_corpus(main.CORPUS)
        self.assertEqual(skipped, [])
        self.assertGreaterEqual(len(runs), 12)
        self.assertGreaterEqual(len({r.source for r in runs}), 3)
        devices = {r.settings["hardware"].name for r in runs if "hardware" in r.settings}
        self.assertTrue(devices & {"h100-sxm-80gb", "h200-141gb", "b200-180gb"}, devices)
        self.assertTrue(any(r.settings.get("tensor_parallel_size", 1) >= 2 and "h100" in r.settings["hardware"].name
                            for r in runs if "hardware" in r.settings))
        self.assertTrue(any(r.engine != "vllm" for r in runs))
        self.assertTrue(any(r.settings.get("model") and r.settings["model"].experts for r in runs))
        for source in {r.source for r in runs}:
            folder = os.path.join(main.CORPUS, source)
            self.assertTrue(os.path.isfile(os.path.join(folder, "SOURCE.md")), source)

    def test_a_run_without_what_validate_needs_is_skipped_with_its_reason(self):
        with tempfile.TemporaryDirectory() as tmp:
            bad = closed_loop_run("no-load")
            del bad["load"]
            write_corpus(tmp, {"a": [closed_loop_run("fine"), bad, {**closed_loop_run("odd"), "engine": "tgi"}]})
            code, out, err = call_cli("validate", tmp, "--jobs", "1")        # the default cost model
        self.assertEqual(code, 0, err)
        self.assertIn("skipped: runs", out)
        self.assertIn("(no-load): no load to replay", out)
        self.assertIn("engine 'tgi' has no profile; use one of vllm, sglang, trtllm, llamacpp", out)
        self.assertIn("  fine ", out)

    def test_hostile_rows_are_skipped_with_their_reason_never_a_traceback(self):
        rows = {"engine as a list": {**closed_loop_run("a"), "engine": ["vllm"]},
                "model as an object": {**closed_loop_run("b"), "model": {"name": "x"}},
                "the engine in settings": {**closed_loop_run("c"), "settings": {"engine": "trtllm"}},
                "the cost model in settings": {**closed_loop_run("d"), "settings": {"cost_model": "kernels"}},
                "a goodput in settings": {**closed_loop_run("e"), "settings": {"goodput": "ttft:100"}},
                "a typo in the load": {**closed_loop_run("f"), "load": {**closed_loop_run("f")["load"], "warmpu": 3}},
                "a run too big to replay": {**closed_loop_run("g"), "load": {**closed_loop_run("g")["load"],
                                                                              "requests": 2_000_000}},
                "a replay outside the source": {**closed_loop_run("h"), "load": {"replay": "/etc"}},
                "every request fails": {**closed_loop_run("i"), "settings": {"max_tokens_in_flight": 50}},
                "a name with escapes": {**closed_loop_run("j\x1b[31m\nred")},
                # A misspelt "inferred" once scored a run out of sample that read its own figures.
                "a misspelt field": {**closed_loop_run("k"), "infered": ["kv_cache_dtype"]},
                # helper-37: scored as +88,521%, and as inf% with a denormal throughput
                "a TPOT in seconds": {**closed_loop_run("l"), "measured": {"mean_tpot_ms": 0.0186}},
                "a throughput past zero": {**closed_loop_run("m"), "measured": {"output_throughput": 1e-320}},
                # helper-37: a copy-paste slip scored twice, weighing twice in every median
                "a name given twice": closed_loop_run("fine"),
                "a citation as a list": {**closed_loop_run("n"), "cite": ["a", "b"]},
                "no engine": {k: v for k, v in closed_loop_run("o").items() if k != "engine"}}
        with tempfile.TemporaryDirectory() as tmp:
            write_corpus(tmp, {"a": list(rows.values()), "b": [closed_loop_run("fine")]})
            os.makedirs(os.path.join(tmp, "no runs file"))        # a source that would drop out unseen
            os.makedirs(os.path.join(tmp, "broken"))
            with open(os.path.join(tmp, "broken", "runs.json"), "w") as f:
                f.write("{not json")
            code, out, err = call_cli("validate", tmp, "--jobs", "1")
        self.assertEqual(code, 0, err)
        self.assertNotIn("Traceback", out + err)
        self.assertNotIn("\x1b", out)
        self.assertIn("j\\x1b[31m red", out)             # escaped, and its run still scores
        for said in ("engine must be a name", "model must be a name", "settings.engine is not a deployment setting",
                     "settings.cost_model is not", "settings.goodput is not", "load.warmpu is not a load field",
                     "load.requests must be a whole number from 1 to 20,000", "load.replay must name a folder",
                     "simulated requests failed", "broken/runs.json", "unknown field 'infered'",
                     "measured.mean_tpot_ms 0.0186 is outside what a server can give", "in seconds?",
                     "measured.output_throughput 1e-320 is outside", "a second run named fine",
                     "no runs file: no runs.json in it", "cite must be text (or null), got list",
                     "(o): no engine; give the engine it ran on"):
            self.assertIn(said, out)
        self.assertEqual(out.count("  fine "), 1, out)

    def test_one_replay_under_two_names_or_a_blank_name_is_skipped(self):
        # helper-54: runs "a" and "a-copy" replaying one folder both scored, weighing twice in every median
        source = os.path.join(FIXTURES, "published-runs", "llmservingsim")
        with tempfile.TemporaryDirectory() as tmp:
            os.makedirs(os.path.join(tmp, "s"))
            shutil.copytree(os.path.join(source, "rtx4090-llama-3.1-8b"), os.path.join(tmp, "s", "run"))
            row = {"name": "a", "engine": "vllm", "settings": {}, "load": {"replay": "run"}}
            with open(os.path.join(tmp, "s", "runs.json"), "w") as f:
                json.dump({"runs": [row, {**row, "name": "a-copy"}, {**row, "name": "  "}]}, f)
            code, out, err = call_cli("validate", tmp, "--jobs", "1")
        self.assertEqual(code, 0, err)
        self.assertIn("(a-copy): replays run, which run a replays already; a run is scored once", out)
        self.assertIn("run 3: expected an object with a name", out)
        self.assertEqual(len(re.findall(r"(?m)^  a +vllm", out)), 1, out)

    def test_a_figure_wider_than_its_column_widens_the_column(self):
        # helper-54: "+31%27,516,291.1   -100%": a 7-hour TTFT ran into the error before it
        with tempfile.TemporaryDirectory() as tmp:
            write_corpus(tmp, {"a": [closed_loop_run("slow", ttft=27_516_291.1), closed_loop_run("fine")]})
            code, out, err = call_cli("validate", tmp, "--jobs", "1")
        self.assertEqual(code, 0, err)
        row = next(line for line in out.splitlines() if line.startswith("  slow"))
        self.assertRegex(row, r"%\s+27,516,291\.1\s+-100%")

    def test_runs_with_settings_read_from_their_own_figures_are_marked_and_scored_apart(self):
        with tempfile.TemporaryDirectory() as tmp:
            honest = closed_loop_run("honest", tpot=10.0)
            read = {**closed_loop_run("read", tpot=1000.0), "settings": {"kv_cache_dtype": "fp8"},
                    "inferred": ["kv_cache_dtype"]}
            bad = {**closed_loop_run("bad"), "inferred": ["kv_cache_dtype"]}       # names a setting it does not give
            write_corpus(tmp, {"a": [honest, read, bad]})
            code, out, err = call_cli("validate", tmp, "--jobs", "1")
            _, js, _ = call_cli("validate", tmp, "--jobs", "1", "--json")
        self.assertEqual(code, 0, err)
        self.assertIn("  read * ", out)
        self.assertNotIn("honest *", out)
        self.assertIn("inferred must list settings the run gives", out)
        self.assertIn("* 1 run replays with kv_cache_dtype read from its own figures; without them: tpot 26.0% (1 run)", out)
        summary = json.loads(js)["summary"]
        alone = next(r for r in json.loads(js)["runs"] if r["name"] == "honest")["rows"]["mean_tpot_ms"]["error"]
        self.assertAlmostEqual(summary["without_inferred"]["medians"]["tpot"]["median"], abs(alone))
        self.assertNotAlmostEqual(summary["medians"]["tpot"]["median"], abs(alone))

    def test_a_corpus_whose_every_run_is_skipped_is_one_line_and_exit_2(self):
        with tempfile.TemporaryDirectory() as tmp:
            write_corpus(tmp, {"a": [{**closed_loop_run("x"), "settings": {"max_tokens_in_flight": 50}},
                                     {**closed_loop_run("y"), "settings": {"max_num_seqs": 0}}]})
            code, out, err = call_cli("validate", tmp, "--jobs", "1")
            self.assertEqual(code, 2)
            self.assertEqual(out, "")
            self.assertEqual(err.count("\n"), 1, err)
            # every run's reason, not the first alone: its author would fix one and meet the next
            self.assertIn("no run could be replayed: 2 skipped (runs ", err)
            self.assertIn("(y): settings.max_num_seqs", err)
            self.assertIn("; x: 10 of 10 simulated requests failed", err)
            both_bad = os.path.join(tmp, "two")
            write_corpus(both_bad, {"b": [{**closed_loop_run("y"), "settings": {"max_num_seqs": 0}},
                                          {**closed_loop_run("z"), "settings": {"max_num_batched_tokens": -1}}]})
            code, out, err = call_cli("validate", both_bad, "--jobs", "1")
        self.assertEqual(code, 2)
        self.assertEqual(out, "")
        self.assertEqual(err.count("\n"), 1, err)
        self.assertIn("no runs to score: 2 skipped (runs ", err)
        self.assertIn("(z): settings.max_num_batched_tokens", err)

    def test_a_source_folder_passed_as_the_corpus_and_settings_as_a_list_say_what_they_are(self):
        # helper-37: the first said only "no runs to score"; the second blamed `inferred`
        with tempfile.TemporaryDirectory() as tmp:
            write_corpus(tmp, {"a": [closed_loop_run("x"), {**closed_loop_run("y"), "settings": []}]})
            code, out, err = call_cli("validate", os.path.join(tmp, "a"), "--jobs", "1")
            self.assertEqual(code, 2)
            self.assertIn("this folder is one source; pass the folder that holds the sources", err)
            code, out, err = call_cli("validate", tmp, "--jobs", "1")
        self.assertEqual(code, 0, err)
        self.assertIn("settings must be an object of servesim settings", out)

    def test_a_kernel_fit_with_nothing_to_fit_says_unfitted(self):
        with tempfile.TemporaryDirectory() as tmp:
            write_corpus(tmp, {"a": [{**closed_loop_run("x"), "measured": {"mean_ttft_ms": 20.0}}],
                               "b": [{**closed_loop_run("y"), "measured": {"mean_ttft_ms": 30.0}}]})
            code, out, err = call_cli("validate", tmp, "--cost-model", "kernels", "--jobs", "1")
        self.assertEqual(code, 0, err)
        self.assertIn("on all sources unfitted", out)

    def test_a_folder_with_no_runs_is_one_line_and_exit_2(self):
        with tempfile.TemporaryDirectory() as tmp:
            code, out, err = call_cli("validate", tmp)
        self.assertEqual(code, 2)
        self.assertEqual(err.count("\n"), 1, err)
        self.assertIn("no runs to score", err)


class TrtllmBenchLimits(unittest.TestCase):
    """trtllm-bench picks a run's max_batch_size and max_num_tokens itself when none are given
    (tensorrt_llm/bench/benchmark/utils/general.py get_settings; the heuristic in
    tensorrt_llm/bench/build/tuning.py calc_engine_setting and finetune_setting), and the page's runs
    give none. The corpus sets what that heuristic gives on the presets' memory and parameters: this
    redoes it, so a preset change that moves a run's limits fails here."""

    @staticmethod
    def heuristic(run):
        model, device = run.settings["model"], run.settings["hardware"]
        tp, isl, osl = run.settings["tensor_parallel_size"], run.load["prompt_tokens"], run.load["output_tokens"]
        kv_bytes = 1 if run.settings.get("kv_cache_dtype") == "fp8" else 2
        weight_bytes = 1 if run.settings.get("quantization") == "fp8" else 2
        # GiB a token over the whole group, each GPU holding at least one KV head.
        per_token = 2 * model.layers * max(tp, model.kv_heads) * model.head_dim * kv_bytes / 2**30
        cache = (device.memory_gib * tp - model.params * weight_bytes / 2**30) * 0.95   # --kv_cache_free_gpu_mem_fraction
        requests = cache / (per_token * (isl + osl))
        def round_up(value, steps, least):
            # To a multiple of the first step whose bound the value is under; past every bound, the
            # larger values are above `least` anyway.
            to = next(to for below, to in steps if value < below)
            return max(least, to * math.ceil(value / to))
        raw_bs = min(requests, 4096)
        raw_tokens = min(raw_bs * (1 + isl / osl), 32768)
        batch = round_up(raw_bs, ((256, 32), (1024, 128), (math.inf, 256)), 64)
        tokens = round_up(raw_tokens, ((4096, 256), (8192, 512), (math.inf, 1024)), 2048)
        # Without chunked prefill (trtllm-bench's default) the longest prompt must fit one step.
        return batch, max(tokens, isl + batch)

    def test_every_run_replays_the_limits_trtllm_bench_would_pick(self):
        runs = [r for r in main.read_corpus(main.CORPUS)[0] if r.source == "trtllm"]
        self.assertEqual(len(runs), 9)
        for run in runs:
            self.assertEqual((run.settings["max_num_seqs"], run.settings["max_num_batched_tokens"]),
                             self.heuristic(run), run.name)

    def test_a_prompt_that_fits_one_step_runs_under_tensorrt_llm_though_its_output_does_not(self):
        # 5,000 in + 500 out under a 5,064-token budget: TensorRT-LLM never preempts, so only the
        # prompt is prefilled at once; vLLM's rule keeps room to recompute prompt and output together.
        spec = main.RunSpec(model=main.MODELS["llama-3.3-70b"], tensor_parallel_size=2, quantization="fp8",
                            max_num_seqs=64, max_num_batched_tokens=5064, chunked_prefill=False, requests=20,
                            prompt_tokens=main.TokenRange(5000, 5000), output_tokens=main.TokenRange(500, 500),
                            concurrency=4)
        self.assertEqual(main.run(main.replace(spec, engine="trtllm"))["failed"], 0)
        refused = main.run(main.replace(spec, engine="vllm"))
        self.assertEqual(refused["failed"], 20)


class ReplayedRuns(unittest.TestCase):
    """helper-43: what a replayed run's files say reaches the report, and nothing given beside them is
    ignored unseen."""

    def corpus(self, tmp, edit_row=None, edit_run=None):
        source = os.path.join(main.CORPUS, "llmservingsim")
        with open(os.path.join(source, "runs.json")) as f:
            data = json.load(f)
        data["runs"] = [r for r in data["runs"] if r["name"] == "rtx4090-llama-3.1-8b"]
        if edit_run:
            edit_run(data["runs"][0])
        os.makedirs(os.path.join(tmp, "r"))
        shutil.copytree(os.path.join(source, "rtx4090-llama-3.1-8b"), os.path.join(tmp, "r", "rtx4090-llama-3.1-8b"))
        with open(os.path.join(tmp, "r", "runs.json"), "w") as f:
            json.dump(data, f)
        if edit_row:
            path = os.path.join(tmp, "r", "rtx4090-llama-3.1-8b", "requests.jsonl")
            with open(path) as f:
                lines = f.read().splitlines()
            row = json.loads(lines[3])
            edit_row(row)
            lines[3] = json.dumps(row)
            with open(path, "w") as f:
                f.write("\n".join(lines) + "\n")
        write_corpus(tmp, {"a": [closed_loop_run("fine")]})

    def test_a_measured_request_that_failed_is_said_and_kept_in_the_json(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.corpus(tmp, edit_row=lambda row: row.update(first_token_ts=None, last_token_ts=None))
            code, out, err = call_cli("validate", tmp, "--jobs", "1")
            _, js, _ = call_cli("validate", tmp, "--jobs", "1", "--json")
        self.assertEqual(code, 0, err)
        said = "rtx4090-llama-3.1-8b: 1 of 300 measured requests failed"
        self.assertIn(said, err)
        notes = {r["name"]: r["notes"] for r in json.loads(js)["runs"]}
        self.assertEqual(notes["fine"], [])
        self.assertIn(said.split(": ", 1)[1], notes["rtx4090-llama-3.1-8b"][0])

    def test_a_time_that_is_not_a_number_or_only_one_of_the_two_is_refused_not_a_failure(self):
        for edit in ({"first_token_ts": False}, {"first_token_ts": ""}, {"first_token_ts": None}):
            with self.subTest(edit=edit), tempfile.TemporaryDirectory() as tmp:
                self.corpus(tmp, edit_row=lambda row: row.update(edit))
                code, out, err = call_cli("validate", tmp, "--jobs", "1")
                self.assertEqual(code, 0, err)
                self.assertIn("skipped: rtx4090-llama-3.1-8b: run", out)
                self.assertIn("first_token_ts", out)
                self.assertNotIn("measured requests failed", err)

    def test_a_load_or_figures_given_beside_a_replay_are_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.corpus(tmp, edit_run=lambda run: run.update(measured={"mean_tpot_ms": 5.0},
                                                             load={**run["load"], "concurrency": 8}))
            code, out, err = call_cli("validate", tmp, "--jobs", "1")
        self.assertEqual(code, 0, err)
        self.assertIn("read from its requests.jsonl: drop load.concurrency, measured", out)

    def test_settings_that_contradict_the_runs_own_files_are_refused_and_agreeing_ones_pass(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.corpus(tmp, edit_run=lambda run: run["settings"].update(max_num_seqs=8))
            code, out, err = call_cli("validate", tmp, "--jobs", "1")
        self.assertEqual(code, 0, err)
        self.assertIn("settings.max_num_seqs 8 contradicts the run's own files (256)", out)
        with tempfile.TemporaryDirectory() as tmp:
            self.corpus(tmp, edit_run=lambda run: run["settings"].update(max_num_seqs=256, prefix_caching=True))
            code, out, err = call_cli("validate", tmp, "--jobs", "1")
        self.assertEqual(code, 0, err)
        self.assertNotIn("skipped", out)

    def test_a_device_model_cache_size_or_cache_type_unlike_the_files_is_refused(self):
        # helper-45: these passed the same-name check (an H100 row on the RTX 4090 run scored +373%)
        for edit, said in ((lambda run: run.update(hardware="h100-sxm-80gb"), "a device of 23.5 GiB"),
                           (lambda run: run.update(model="qwen3-8b"), "model qwen3-8b contradicts"),
                           (lambda run: run["settings"].update(kv_tokens=10000), "settings.kv_tokens contradicts"),
                           (lambda run: run["settings"].update(kv_cache_dtype="fp8"), "kv_cache_dtype fp8 contradicts")):
            with self.subTest(said=said), tempfile.TemporaryDirectory() as tmp:
                self.corpus(tmp, edit_run=edit)
                code, out, err = call_cli("validate", tmp, "--jobs", "1")
                self.assertEqual(code, 0, err)
                self.assertIn(said, out)

    def test_a_replay_that_does_not_record_its_model_says_where_validate_takes_it(self):
        # helper-45: it said "pass --model", a flag validate does not take
        with tempfile.TemporaryDirectory() as tmp:
            self.corpus(tmp)
            os.remove(os.path.join(tmp, "r", "rtx4090-llama-3.1-8b", "meta.json"))
            code, out, err = call_cli("validate", tmp, "--jobs", "1")
        self.assertEqual(code, 0, err)
        self.assertIn("does not record its model; give the run's model in runs.json", out)
        self.assertNotIn("pass --model", out)

    def test_a_source_that_lists_no_runs_is_listed_as_skipped(self):
        with tempfile.TemporaryDirectory() as tmp:
            write_corpus(tmp, {"a": [closed_loop_run("fine")], "b": []})
            code, out, err = call_cli("validate", tmp, "--jobs", "1")
        self.assertEqual(code, 0, err)
        self.assertIn("b: its runs.json lists no runs", out)


class KvCacheDtype(unittest.TestCase):
    """Where a run's KV dtype was not published, the corpus sets FP8 only where a BF16 cache cannot
    deliver the published figures on the device's peak bandwidth or memory (SOURCE.md shows the
    arithmetic); these tests redo that arithmetic from the presets, so a preset change that undoes
    it fails here."""

    def corpus_run(self, name):
        runs, _ = main.read_corpus(main.CORPUS)
        return next(r for r in runs if r.name == name)

    def test_a_bf16_cache_cannot_stream_the_8b_runs_published_throughput(self):
        run = self.corpus_run("h100-llama-3.1-8b-instruct-fp8-tp1-128x2048")
        model, device = run.settings["model"], run.settings["hardware"]
        isl, osl = run.load["prompt_tokens"], run.load["output_tokens"]
        bf16 = main.quantized(model, "fp8").kv_bytes_per_token
        self.assertEqual(bf16, 2 * 32 * 8 * 128 * 2)
        # Each output token's step reads its request's whole cache so far: isl + (osl - 1) / 2
        # tokens on average, whatever the batch; at peak bandwidth that bounds the output rate.
        ceiling = device.bandwidth_gbs * 1e9 / ((isl + (osl - 1) / 2) * bf16)
        self.assertLess(ceiling, run.measured["output_throughput"])
        fp8 = main.quantized(model, "fp8", "fp8").kv_bytes_per_token
        self.assertGreater(device.bandwidth_gbs * 1e9 / ((isl + (osl - 1) / 2) * fp8), run.measured["output_throughput"])
        checkpoint = [r for r in main.read_corpus(main.CORPUS)[0] if "llama-3.1-8b-instruct-fp8" in r.name]
        self.assertEqual({r.settings.get("kv_cache_dtype") for r in checkpoint}, {"fp8"})

    def test_a_bf16_cache_cannot_hold_the_nim_runs_decoding_requests(self):
        for clients in (100, 150, 200, 250):
            run = self.corpus_run(f"nim1.8-llama3.3-70b-fp8-2xh100-tp2-5000x500-c{clients}")
            model, device = run.settings["model"], run.settings["hardware"]
            tp = run.settings["tensor_parallel_size"]
            # Little's law on the decoding requests: tokens/s x seconds per token = requests
            # decoding, each holding at least its prompt's cache.
            decoding = run.measured["output_throughput"] * run.measured["mean_tpot_ms"] / 1000
            self.assertGreater(decoding, 80, clients)
            weights = main.quantized(model, "fp8").weight_bytes
            room = tp * device.memory_gib * main.GIB - weights
            held = decoding * run.load["prompt_tokens"]
            self.assertGreater(held * main.quantized(model, "fp8").kv_bytes_per_token, room, clients)
            self.assertLess(held * main.quantized(model, "fp8", "fp8").kv_bytes_per_token, room, clients)
        nim = [r for r in main.read_corpus(main.CORPUS)[0] if r.source == "nim"]
        self.assertEqual({r.settings.get("kv_cache_dtype") for r in nim}, {"fp8"})     # one deployment

    def test_runs_the_bound_does_not_decide_keep_the_models_bf16_cache(self):
        for name in ("h100-llama-3.3-70b-instruct-fp8-tp2-1000x1000", "h100-llama-3.3-70b-instruct-fp8-tp2-5000x500"):
            run = self.corpus_run(name)
            self.assertNotIn("kv_cache_dtype", run.settings)
            model, device = run.settings["model"], run.settings["hardware"]
            isl, osl = run.load["prompt_tokens"], run.load["output_tokens"]
            per_gpu = main.quantized(model, "fp8").kv_bytes_per_token / run.settings["tensor_parallel_size"]
            ceiling = device.bandwidth_gbs * 1e9 / ((isl + (osl - 1) / 2) * per_gpu)
            self.assertLess(run.measured["output_throughput"], 0.35 * ceiling, name)


class DeviceEdition(unittest.TestCase):
    def test_the_rtx_pro_runs_are_replayed_on_the_server_editions_memory_clock(self):
        server, workstation = main.HARDWARE["rtx-pro-6000-server-96gb"], main.HARDWARE["rtx-pro-6000-96gb"]
        # GDDR7's double data rate on a 512-bit bus: NVML's memory clock x 2 x 64 bytes.
        self.assertAlmostEqual(server.bandwidth_gbs, 12481e6 * 2 * 64 / 1e9, delta=1)
        self.assertAlmostEqual(workstation.bandwidth_gbs, 14001e6 * 2 * 64 / 1e9, delta=1)
        # A meta.json or log naming the card takes its edition's preset.
        self.assertEqual(main.KNOWN_DEVICES["nvidia rtx pro 6000 blackwell server edition"], server.name)
        self.assertEqual(main.KNOWN_DEVICES["nvidia rtx pro 6000 blackwell workstation edition"], workstation.name)
        runs = [r for r in main.read_corpus(main.CORPUS)[0] if r.name.startswith("rtxpro6000")]
        self.assertEqual(len(runs), 3)
        for run in runs:
            spec = main.recorded_spec(main.read_request_log(os.path.join(run.folder, run.load["replay"], "requests.jsonl")),
                                      dict(run.settings))
            self.assertEqual(spec.hardware.name, "rtx-pro-6000-server-96gb", run.name)


class EngineProfiles(unittest.TestCase):
    def test_vllm_captures_graphs_at_its_sizes_and_pads_up_to_them(self):
        self.assertEqual(main.vllm_graphs(256)[:6], [1, 2, 4, 8, 16, 24])
        self.assertEqual(main.vllm_graphs(256)[-1], 512)
        self.assertEqual(main.vllm_graphs(4), [1, 2, 4, 8])
        no_cpu = main.replace(main.ENGINES["vllm"], step_cpu_ms=0.0, seq_cpu_ms=0.0)
        h100, model = main.HARDWARE["h100-sxm-80gb"], main.MODELS["llama-3.1-8b"]
        padded = main.KernelCost(h100, model, engine=no_cpu)
        exact = main.KernelCost(h100, model, engine=main.replace(no_cpu, pad_to_graph=False))
        self.assertEqual(padded.step_seconds(9, 0, 9), padded.step_seconds(16, 0, 16))    # 9 runs in the 16 graph
        # Without padding a 9 that has no graph of its own runs eagerly: each kernel's launch is paid.
        launches = 9 * model.layers * h100.kernel_launch_us / 1e6 * main.KERNEL_SCALE
        self.assertAlmostEqual(exact.step_seconds(9, 0, 9) - padded.step_seconds(9, 0, 9), launches, places=12)

    def test_an_engine_that_overlaps_pays_the_slower_of_cpu_and_gpu_else_both(self):
        h, m = main.HARDWARE["h100-sxm-80gb"], main.MODELS["llama-3.1-8b"]
        slow_cpu = main.replace(main.ENGINES["vllm"], step_cpu_ms=50.0)
        overlapped = main.KernelCost(h, m, engine=slow_cpu).step_seconds(1, 100, 1)
        serial = main.KernelCost(h, m, engine=main.replace(slow_cpu, overlap=False)).step_seconds(1, 100, 1)
        self.assertAlmostEqual(overlapped, 0.050 + 1.1e-6)
        self.assertGreater(serial, overlapped + 0.001)

    def test_tensorrt_llm_admits_only_what_can_finish_so_it_never_preempts(self):
        spec = main.RunSpec(kv_tokens=2000, block_size=16, requests=40, concurrency=40,
                            prompt_tokens=main.TokenRange(100, 100), output_tokens=main.TokenRange(300, 300))
        vllm = main.run(spec)
        trt = main.run(main.replace(spec, engine="trtllm"))
        self.assertGreater(vllm["engine"]["preemptions"], 0)
        self.assertEqual(trt["engine"]["preemptions"], 0)
        self.assertLessEqual(trt["engine"]["peak_running"], 2000 // 400)

    def test_sglang_prefills_apart_and_its_decodes_keep_their_seats(self):
        spec = main.RunSpec(requests=50, concurrency=50, prompt_tokens=main.TokenRange(100, 100),
                            output_tokens=main.TokenRange(200, 200), engine="sglang", max_num_seqs=4)
        for simulator in ("step", "event"):
            with self.subTest(simulator=simulator):
                result = main.run(main.replace(spec, simulator=simulator), timeline=True)
                # Decodes set aside while a step prefills still count against --max-num-seqs...
                self.assertLessEqual(result["engine"]["peak_running"], 4)
                self.assertLessEqual(max(t["running"] for t in result["timeline"]), 4)
                # ... and against --max-tokens-in-flight (300 tokens each: 6 fit under 2,000).
                capped = main.run(main.replace(spec, simulator=simulator, max_num_seqs=256, max_tokens_in_flight=2000))
                self.assertLessEqual(capped["engine"]["peak_running"], 6)
        # Its steps prefill or decode, never both: a new prompt's step holds no decodes, so a
        # decode waits out every prefill step and its worst gap is longer than vLLM's.
        free = main.replace(spec, max_num_seqs=256, requests=20, concurrency=None, rate=20.0)
        sglang, vllm = main.run(free), main.run(main.replace(free, engine=None))
        self.assertGreater(sglang["p99_itl_ms"], vllm["p99_itl_ms"])

    def test_async_scheduling_under_the_roofline_says_it_changes_nothing(self):
        warning = "--async-scheduling changes nothing under the roofline"
        code, off, err = call_cli("simulate", "--async-scheduling", "off", "--requests", "5", "--json")
        self.assertEqual(code, 0, err)
        self.assertIn(warning, err)
        _, on, _ = call_cli("simulate", "--async-scheduling", "on", "--requests", "5", "--json")
        self.assertEqual(json.loads(off)["mean_tpot_ms"], json.loads(on)["mean_tpot_ms"])
        code, _, err = call_cli("simulate", "--async-scheduling", "off", "--cost-model", "kernels", "--requests", "5")
        self.assertEqual(code, 0, err)
        self.assertNotIn(warning, err)

    def test_a_profile_or_preset_path_that_never_ends_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            endless = os.path.join(tmp, "endless.json")
            os.symlink("/dev/zero", endless)
            for flag in ("--engine", "--hardware"):
                code, _, err = call_cli("simulate", flag, endless, "--requests", "5")
                self.assertEqual(code, 2, err)
                self.assertRegex(err, "more than servesim reads of such a file|is a binary file|is not a regular file")

    def test_vllm_sglang_and_tensorrt_llm_cache_prefixes_unless_told_not_to(self):
        # vLLM V1, SGLang's radix cache and TensorRT-LLM's block reuse are all on by default;
        # llama.cpp's slots keep no shared cache. Without --engine the lesson's knob (off) stands.
        shared = ("--prefix-tokens", "1000", "--num-prefixes", "1", "--requests", "20", "--rate", "5", "--json")
        for engine, cached in (("vllm", True), ("sglang", True), ("trtllm", True), ("llamacpp", False), (None, False)):
            for told in ((), ("--prefix-caching", "off")):
                with self.subTest(engine=engine, told=told):
                    code, out, err = call_cli("simulate", *(("--engine", engine) if engine else ()), *told, *shared)
                    self.assertEqual(code, 0, err)
                    result = json.loads(out)
                    self.assertEqual(result["config"]["prefix_caching"], cached and not told)
                    self.assertEqual(result["engine"]["prefix_hit_rate"] > 0.5, cached and not told)

    def test_an_unknown_engine_is_one_line_naming_the_known_ones(self):
        code, _, err = call_cli("simulate", "--engine", "tgi")
        self.assertEqual(code, 2)
        self.assertIn("vllm", err)
        self.assertIn("trtllm", err)


if __name__ == "__main__":
    unittest.main()


class MisspeltFigures(unittest.TestCase):
    def test_a_misspelt_measured_figure_is_named_as_such(self):
        # helper-61: an extra key (p99_tpot_ms) skipped its run as one with no positive figures
        with tempfile.TemporaryDirectory() as tmp:
            corpus = os.path.join(tmp, "corpus")
            shutil.copytree(os.path.join(main.CORPUS, "trtllm"), os.path.join(corpus, "trtllm"))
            path = os.path.join(corpus, "trtllm", "runs.json")
            with open(path) as f:
                runs = json.load(f)
            rows = runs["runs"] if isinstance(runs, dict) else runs
            rows[0]["measured"]["p99_tpot_ms"] = 5.0
            with open(path, "w") as f:
                json.dump(runs, f)
            code, out, err = run_cli("validate", corpus, "--jobs", 1)
        self.assertIn("measured.p99_tpot_ms is not a figure validate scores (did you mean mean_tpot_ms?)", out + err)

    def test_a_timeseries_with_none_of_the_figures_is_refused(self):
        # helper-61: a timeseries.csv of x,y was read as a timeline with nothing in it, without a word
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "timeseries.csv")
            with open(path, "w") as f:
                f.write("x,y\n1,2\n")
            with self.assertRaises(main.UserError) as e:
                main.read_timeline(path)
        self.assertIn("has none of running, waiting, kv_cache_pct", str(e.exception))
