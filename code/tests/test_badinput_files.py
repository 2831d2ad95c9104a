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
from helpers import main

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


class CompareTimelineAfterTheReport(Checks):
    """# issue 20 finding 21: compare --timeline /dev/full writes the timeline before the report."""

    @unittest.skipUnless(os.path.exists("/dev/full"), "no /dev/full")
    def test_compare_timeline_to_a_full_disk_still_prints_the_comparison(self):
        # issue 20 finding 21
        r = run("compare", VLLM_RUN, "--timeline", "/dev/full", timeout=60)
        self.assertNotIn("Traceback", r.err)
        self.assertIn("measured", r.out, f"the comparison was lost: {r.seen()}")
        self.assertIn("ttft p50 ms", r.out)
        self.assertEqual(r.code, 1, r.seen())
        self.assertEqual(len([l for l in r.lines() if not l.startswith("servesim: the run's recorded")]), 1, r.err)


class Writes(Checks):
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

    def test_a_write_leaves_no_temporary_file_beside_it(self):
        # issue 20 finding 3: the random-named temporary file is renamed over the target, or removed
        with tempfile.TemporaryDirectory() as tmp:
            for name in ("a.svg", "b.svg"):
                r = run("simulate", "--requests", 5, "--plot", os.path.join(tmp, name), "--timeline",
                        os.path.join(tmp, name.replace("svg", "csv")))
                self.assertEqual(r.code, 0, r.seen())
            self.assertEqual(sorted(os.listdir(tmp)), ["a.csv", "a.svg", "b.csv", "b.svg"])

    def test_compare_timeline_equal_to_its_run_is_refused(self):
        # issue 20 finding 3: the same rule for compare (its --timeline onto the requests.jsonl it reads)
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = os.path.join(tmp, "run")
            os.mkdir(run_dir)
            source = os.path.join(FIXTURES, "published-runs", "llmservingsim", "rtx4090-llama-3.1-8b")
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



class RequestLog(Checks):
    """# issue 20 finding 6: read_request_log (compare on a requests.jsonl) is not validated."""

    def compare(self, rows, tmp):
        path = jsonl(os.path.join(tmp, "requests.jsonl"), rows)
        return run("compare", path, *PRESETS, timeout=30)

    def edited(self, index, **changes):
        rows = request_rows()
        rows[index] = {**rows[index], **changes}
        return rows

    def test_queued_ts_nan_is_one_line_exit_2_not_a_spin(self):
        # issue 20 finding 6: "queued_ts": NaN spins forever
        with tempfile.TemporaryDirectory() as tmp:
            rows = [json.dumps(r) for r in request_rows()]
            rows[2] = rows[2].replace('"queued_ts": 101.0', '"queued_ts": NaN')
            self.assertIn("NaN", rows[2])
            self.assert_one_line(self.compare(rows, tmp), mentions=["line 3", "queued_ts"])

    def test_queued_ts_infinity_is_one_line_exit_2(self):
        # issue 20 finding 6: Infinity prints -inf
        with tempfile.TemporaryDirectory() as tmp:
            rows = [json.dumps(r) for r in request_rows()]
            rows[2] = rows[2].replace('"queued_ts": 101.0', '"queued_ts": Infinity')
            self.assert_one_line(self.compare(rows, tmp), mentions=["line 3", "queued_ts"])

    def test_a_row_at_1e12_seconds_is_one_line_exit_2_not_a_memory_error(self):
        # issue 20 finding 6: a row at 1e12 -> MemoryError
        with tempfile.TemporaryDirectory() as tmp:
            rows = self.edited(2, queued_ts=1e12, first_token_ts=1e12 + 0.05, last_token_ts=1e12 + 0.5)
            r = self.compare(rows, tmp)
            self.assert_one_line(r)
            self.assertLess(r.peak_mb, 300)

    def test_first_token_before_queued_is_refused_not_a_negative_ttft(self):
        # issue 20 finding 6: first_token_ts before queued_ts -> negative TTFT with exit 0
        with tempfile.TemporaryDirectory() as tmp:
            rows = self.edited(2, first_token_ts=100.0 - 5, last_token_ts=101.5)
            self.assert_one_line(self.compare(rows, tmp), mentions=["line 3"])

    def test_input_toks_1e400_is_one_line_exit_2(self):
        # issue 20 finding 6: input_toks 1e400 -> traceback
        with tempfile.TemporaryDirectory() as tmp:
            rows = [json.dumps(r) for r in request_rows()]
            rows[2] = rows[2].replace('"input_toks": 220', '"input_toks": 1e400')
            self.assertIn("1e400", rows[2])
            self.assert_one_line(self.compare(rows, tmp), mentions=["line 3", "input_toks"])


class OtherReaders(Checks):
    """# issue 20 finding 14: other readers that traceback."""

    def test_config_a_string_in_a_detailed_report(self):
        # issue 20 finding 14: "config": "x" in a bench/loadgen report (compare, merge, --trace)
        with tempfile.TemporaryDirectory() as tmp:
            bad = write_json(os.path.join(tmp, "bad.json"), detailed_report(config="x"))
            other = write_json(os.path.join(tmp, "other.json"), detailed_report())
            for argv in (["compare", bad, *PRESETS], ["merge", other, bad], ["simulate", "--trace", bad]):
                with self.subTest(command=argv[0]):
                    self.assert_one_line(run(*argv), mentions=["config"])

    def test_a_report_without_the_arrays_a_comparison_needs(self):
        # From a careless-user pass: without ttfts every request read as failed, and without itls
        # every request ended at its first token (E2E = TTFT, throughput doubled), both in silence.
        with tempfile.TemporaryDirectory() as tmp:
            for key in ("ttfts", "itls", "output_lens"):
                report = detailed_report(4)
                del report[key]
                path = write_json(os.path.join(tmp, f"no_{key}.json"), report)
                with self.subTest(missing=key):
                    self.assert_one_line(run("compare", path, *PRESETS), mentions=[f"no {key} array"])
            path = write_json(os.path.join(tmp, "gap.json"), detailed_report(4, itls=[[0.01] * 4, 5, [], []]))
            self.assert_one_line(run("compare", path, *PRESETS), mentions=["itls[1] must be a list"])

    def test_a_report_names_its_model_and_device_and_its_times_are_held_to_a_year(self):
        with tempfile.TemporaryDirectory() as tmp:
            # simulate's and loadgen's config name a preset; vllm bench serve names its model_id.
            named = write_json(os.path.join(tmp, "named.json"),
                               detailed_report(4, config={"model": "llama-3.1-8b", "hardware": "l4-24gb"}))
            r = run("compare", named)
            self.assertEqual(r.code, 0, r.seen())
            self.assertIn("servesim l4-24gb / llama-3.1-8b", r.out)
            bench = write_json(os.path.join(tmp, "bench.json"),
                               {**detailed_report(4, config=None), "model_id": "meta-llama/Llama-3.1-8B-Instruct"})
            r = run("compare", bench, "--hardware", "l4-24gb")
            self.assertEqual(r.code, 0, r.seen())
            self.assertIn("/ llama-3.1-8b", r.out)
            self.assert_one_line(run("compare", write_json(os.path.join(tmp, "anon.json"), detailed_report(4)),
                                     "--hardware", "l4-24gb"), mentions=["does not record its model", "--model"])
            late = write_json(os.path.join(tmp, "late.json"), detailed_report(4, ttfts=[0.05, 1e9, 0.05, 0.05]))
            self.assert_one_line(run("compare", late, *PRESETS), mentions=["ttfts[1]", "a year"])

    def test_a_measured_run_whose_requests_all_failed_is_exit_1_and_some_failed_is_said(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = write_json(os.path.join(tmp, "down.json"), detailed_report(4, errors=["connection refused"] * 4))
            self.assert_one_line(run("compare", path, *PRESETS), code=1,
                                 mentions=["every one of its 4 measured requests failed", "connection refused"])
            path = write_json(os.path.join(tmp, "some.json"), detailed_report(4, errors=["", "HTTP 500", "", ""]))
            r = run("compare", path, *PRESETS)
            self.assertEqual(r.code, 0, r.seen())
            self.assertIn("1 of 4 measured requests failed (the first: HTTP 500)", r.err)
            log = os.path.join(tmp, "renamed")
            os.mkdir(log)
            with open(os.path.join(log, "requests.jsonl"), "w") as f:
                for row in request_rows(4):
                    row["first_token_time"] = row.pop("first_token_ts")
                    f.write(json.dumps(row) + "\n")
            self.assert_one_line(run("compare", log, *PRESETS), mentions=["no first_token_ts beside the other time",
                                                                           "vLLM's per-request stats give"])

    def test_a_bench_result_with_empty_arrays(self):
        # issue 20 finding 14: a bench result with empty arrays
        empty = {"input_lens": [], "output_lens": [], "ttfts": [], "itls": [], "start_times": [], "errors": []}
        with tempfile.TemporaryDirectory() as tmp:
            path = write_json(os.path.join(tmp, "empty.json"), empty)
            for argv in (["compare", path, *PRESETS], ["merge", path], ["simulate", "--trace", path]):
                with self.subTest(command=argv[0]):
                    self.assert_one_line(run(*argv), mentions=["empty.json"])

    def test_a_csv_field_over_128_kib(self):
        # issue 20 finding 14: a CSV field over 128 KiB (Azure, BurstGPT, timeseries.csv)
        big = '"' + "x" * (200 * 1024) + '"'
        with tempfile.TemporaryDirectory() as tmp:
            azure = write(os.path.join(tmp, "azure.csv"),
                          "TIMESTAMP,ContextTokens,GeneratedTokens,Note\n"
                          "2023-11-16 18:17:03.9799600,100,10,ok\n"
                          f"2023-11-16 18:17:04.9799600,100,10,{big}\n")
            burst = write(os.path.join(tmp, "burst.csv"),
                          "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                          "0,ChatGPT,100,10,110,Conversation log\n"
                          f"1,{big},100,10,110,Conversation log\n")
            for name, path in (("azure", azure), ("burstgpt", burst)):
                with self.subTest(trace=name):
                    self.assert_one_line(run("simulate", "--trace", path), mentions=[os.path.basename(path)])
            run_dir = os.path.join(tmp, "run")
            os.mkdir(run_dir)
            jsonl(os.path.join(run_dir, "requests.jsonl"), request_rows())
            write(os.path.join(run_dir, "timeseries.csv"),
                  "t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct,note\n"
                  f"1.0,100.0,10.0,1,0,1.0,{big}\n")
            with self.subTest(file="timeseries.csv"):
                self.assert_one_line(run("compare", run_dir, *PRESETS), mentions=["timeseries"])

    def test_an_azure_header_with_timestamp_not_first_and_a_short_row(self):
        # issue 20 finding 14: TIMESTAMP not first and a short row
        with tempfile.TemporaryDirectory() as tmp:
            path = write(os.path.join(tmp, "azure.csv"),
                         "ContextTokens,GeneratedTokens,TIMESTAMP\n"
                         "100,10,2023-11-16 18:17:03.9799600\n"
                         "100,10\n")
            self.assert_one_line(run("simulate", "--trace", path), mentions=["azure.csv", "line 3"])

    def explain(self, tmp, name, text):
        path = write(os.path.join(tmp, name), text)
        return run("explain", path)

    def assert_explained_or_refused(self, r, name):
        """No traceback; either an explanation (exit 0) or one line naming the file (exit 2)."""
        self.assertNotIn("Traceback", r.err, r.seen())
        self.assertIn(r.code, (0, 2), r.seen())
        if r.code == 2:
            self.assert_one_line(r, mentions=[name])

    def test_explain_a_vllm_scrape_with_prefix_cache_queries_but_no_hits(self):
        # issue 20 finding 14
        with tempfile.TemporaryDirectory() as tmp:
            r = self.explain(tmp, "scrape.txt", "vllm:num_requests_running 4\nvllm:num_requests_waiting 2\n"
                                                "vllm:prefix_cache_queries_total 1000\n")
            self.assert_explained_or_refused(r, "scrape.txt")

    def test_explain_a_vllm_scrape_with_a_histogram_count_but_no_sum(self):
        # issue 20 finding 14: `_count` without `_sum`
        with tempfile.TemporaryDirectory() as tmp:
            r = self.explain(tmp, "scrape.txt", "vllm:num_requests_running 4\nvllm:num_requests_waiting 2\n"
                                                "vllm:time_to_first_token_seconds_count 10\n")
            self.assert_explained_or_refused(r, "scrape.txt")

    def test_explain_a_report_missing_total_input_tokens(self):
        # issue 20 finding 14
        r = run("simulate", "--requests", 10, "--json")
        self.assertEqual(r.code, 0, r.err)
        report = r.json()
        del report["total_input_tokens"]
        with tempfile.TemporaryDirectory() as tmp:
            path = write_json(os.path.join(tmp, "report.json"), report)
            self.assert_explained_or_refused(run("explain", path), "report.json")


class MetaJson(Checks):
    """# issue 20 finding 15: compare's meta.json values are not validated ("same ranges as the flags")."""

    @classmethod
    def setUpClass(cls):
        with open(os.path.join(VLLM_RUN, "meta.json")) as f:
            meta = json.load(f)
        cls.meta = {k: meta[k] for k in ("model", "engine_kwargs", "kv_cache", "hardware")}
        with open(os.path.join(VLLM_RUN, "requests.jsonl")) as f:
            cls.requests = f.readlines()[:40]

    def compare(self, edit):
        meta = copy.deepcopy(self.meta)
        edit(meta)
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "requests.jsonl"), "w") as f:
                f.writelines(self.requests)
            write_json(os.path.join(tmp, "meta.json"), meta)
            return run("compare", tmp, timeout=30)

    def test_the_unedited_meta_json_compares(self):
        # the baseline the cases below edit one field of
        r = self.compare(lambda meta: None)
        self.assertEqual(r.code, 0, r.seen())

    def test_each_bad_meta_value_is_one_line_exit_2_naming_the_field(self):
        # issue 20 finding 15
        def engine(key, value):
            return lambda meta: meta["engine_kwargs"].__setitem__(key, value)

        def kv(key, value):
            return lambda meta: meta["kv_cache"].__setitem__(key, value)
        cases = [   # (what, the field the line must name, the edit)
            ("max_num_seqs \"abc\"", "max_num_seqs", engine("max_num_seqs", "abc")),
            ("num_gpu_blocks \"2588\"", "num_gpu_blocks", kv("num_gpu_blocks", "2588")),
            ("block_size 0", "block_size", kv("block_size", 0)),
            ("tensor_parallel_size 0", "tensor_parallel_size", engine("tensor_parallel_size", 0)),
            ("engine_kwargs a list", "engine_kwargs", lambda meta: meta.__setitem__("engine_kwargs", [1, 2])),
            ("data_parallel_size 20000 (the flag caps 1024)", "data_parallel_size",
             engine("data_parallel_size", 20000)),
            ("max_num_seqs 0", "max_num_seqs", engine("max_num_seqs", 0)),
            ("gpu_memory_utilization 5", "gpu_memory_utilization", kv("gpu_memory_utilization", 5)),
        ]
        for what, field, edit in cases:
            with self.subTest(what):
                self.assert_one_line(self.compare(edit), mentions=[field])

    def test_a_recorded_host_tier_is_replayed_and_named(self):
        # helper-75: vLLM's kv_offloading_size in engine_kwargs was dropped without a word
        r = self.compare(lambda meta: meta["engine_kwargs"].update(kv_offloading_size=16))
        self.assertEqual(r.code, 0, r.seen())
        self.assertIn(", host tier 16 GiB", r.out)
        r = self.compare(lambda meta: meta["engine_kwargs"].update(kv_offloading_size="16"))
        self.assert_one_line(r, mentions=["engine_kwargs.kv_offloading_size"])
        # helper-78: with prefix caching off the refusal told the user to add --prefix-caching, a
        # flag compare does not take; it names the file's two fields
        r = self.compare(lambda meta: (meta["engine_kwargs"].update(kv_offloading_size=64),
                                       meta["kv_cache"].update(enable_prefix_caching=False)))
        self.assert_one_line(r, mentions=["engine_kwargs.kv_offloading_size 64 with kv_cache.enable_prefix_caching false"])
        self.assertNotIn("add --prefix-caching", r.err)

    def test_a_recorded_block_count_is_the_runs_not_a_flags(self):
        # From a careless-user pass (session 29): a block count meta.json recorded, too big for the
        # device, was blamed on --num-gpu-blocks (never given), exit 1; and its note named the flag.
        r = self.compare(lambda meta: meta["kv_cache"].__setitem__("num_gpu_blocks", 10**9))
        self.assert_one_line(r, mentions=["its recorded 1,000,000,000 KV blocks cannot have run on rtx-4090-24gb"])
        r = self.compare(lambda meta: None)
        self.assertIn("the run's recorded 2,588 KV blocks leave", r.err)
        self.assertNotIn("--num-gpu-blocks 2,588", r.err)

    def test_enable_prefix_caching_the_string_false_does_not_turn_caching_on(self):
        # issue 20 finding 15: enable_prefix_caching "false" turns caching on
        r = self.compare(lambda meta: meta["kv_cache"].__setitem__("enable_prefix_caching", "false"))
        self.assertNotIn("Traceback", r.err, r.seen())
        if r.code == 2:
            self.assert_one_line(r, mentions=["enable_prefix_caching"])
        else:
            self.assertEqual(r.code, 0, r.seen())
            title = r.out.splitlines()[0]
            self.assertNotIn("prefix caching", title, "the string \"false\" turned prefix caching on")


class ModelShape(Checks):
    """# issue 20 finding 16: a model whose embeddings exceed its parameters passes every check."""
    MODEL = {"name": "weird", "params": 1e9, "layers": 32, "kv_heads": 8, "head_dim": 128, "hidden_size": 4096,
             "heads": 32, "vocab_size": 10_000_000}

    def test_embeddings_larger_than_params_are_refused(self):
        # issue 20 finding 16: vocab_size 10,000,000 x hidden_size 4096 > params 1e9
        with tempfile.TemporaryDirectory() as tmp:
            path = write_json(os.path.join(tmp, "model.json"), self.MODEL)
            for argv in (["capacity", "--model", path], ["capacity", "--model", path, "--cost-model", "kernels"],
                         ["simulate", "--model", path, "--requests", 5, "--cost-model", "kernels"]):
                with self.subTest(argv=argv[0:1] + argv[3:]):
                    r = run(*argv)
                    self.assertNotRegex(r.out, r"decode step\s+-|ttft ms\s+-\d", "a negative time was printed")
                    self.assert_one_line(r, mentions=["model.json"])
                    self.assertRegex(r.lines()[0], r"vocab_size|params|hidden_size")


class ModelHeadsAndWindows(Checks):
    """helper-43: a model file with sliding layers and no window held no cache in them (twice the
    requests fit), and one with more KV heads than query heads, or heads no multiple of them, ran."""

    def test_a_window_without_its_layers_and_heads_that_do_not_group_are_refused(self):
        base = json.loads(run("presets", "llama-3.1-8b").out)
        for edit, said in (({"sliding_layers": 16}, "sliding_layers and sliding_window go together"),
                           ({"sliding_window": 128}, "sliding_layers and sliding_window go together"),
                           ({"kv_heads": 64}, "heads 32 must be a multiple of kv_heads 64"),
                           # helper-45: a long window's layers were counted as holding no cache too
                           ({"sliding_layers": 16, "sliding_window": 4096}, "sliding_window 4,096 is more than"),
                           ({"heads": 33}, "heads 33 must be a multiple of kv_heads 8"),
                           # and MoE fields on a dense model, which it would ignore
                           ({"experts_per_token": 4}, "describe a mixture of experts: give experts too"),
                           ({"active_params": 1e9}, "describe a mixture of experts: give experts too")):
            with self.subTest(edit=edit), tempfile.TemporaryDirectory() as tmp:
                path = write_json(os.path.join(tmp, "model.json"), {**base, **edit})
                self.assert_one_line(run("capacity", "--model", path), mentions=["model.json", said])


class PresetNamesInFiles(Checks):
    """helper-43: a hardware file that kept a preset's name with other figures was recorded by that
    name, so compare on its report simulated the real preset (TTFT +224% on servesim's own run)."""

    def test_a_file_that_edits_a_preset_is_named_as_a_file_and_an_exact_copy_keeps_the_name(self):
        h100 = json.loads(run("presets", "h100-sxm-80gb").out)
        with tempfile.TemporaryDirectory() as tmp:
            copy = write_json(os.path.join(tmp, "copy.json"), h100)
            fake = write_json(os.path.join(tmp, "fake.json"), {**h100, "name": "a100-sxm-80gb"})
            kept = json.loads(run("simulate", "--hardware", copy, "--requests", 5, "--json").out)
            self.assertEqual(kept["config"]["hardware"], "h100-sxm-80gb")
            report = run("simulate", "--hardware", fake, "--rate", 5, "--requests", 20, "--detailed", "--json")
            self.assertEqual(json.loads(report.out)["config"]["hardware"], f"a100-sxm-80gb (from {fake})")
            saved = os.path.join(tmp, "report.json")
            with open(saved, "w") as f:
                f.write(report.out)
            self.assert_one_line(run("compare", saved), mentions=["has no preset; pass --hardware"])
            # helper-45: a name padded with a space was read back stripped, as the preset; two files
            # of one base name were named alike; a path's escapes reached every table
            padded = write_json(os.path.join(tmp, "padded.json"), {**h100, "name": "h100-sxm-80gb ", "tflops": 500})
            self.assert_one_line(run("simulate", "--hardware", padded, "--requests", 5), mentions=["spaces around it"])
            os.mkdir(os.path.join(tmp, "d2"))
            other = write_json(os.path.join(tmp, "d2", "fake.json"), {**h100, "name": "a100-sxm-80gb", "tflops": 500})
            names = {json.loads(run("simulate", "--hardware", path, "--requests", 5, "--json").out)["config"]["hardware"]
                     for path in (fake, other)}
            self.assertEqual(len(names), 2, names)
            odd = write_json(os.path.join(tmp, "odd\x1b[31m.json"), {**h100, "name": "a100-sxm-80gb"})
            shown = run("simulate", "--hardware", odd, "--requests", 5)
            self.assertEqual(shown.code, 0, shown.seen())
            self.assertNotIn("\x1b", shown.out)


class Fp8BelowBf16(Checks):
    def test_an_fp8_peak_below_the_bf16_one_is_refused(self):
        # helper-43: accepted, and FP8 weights would then have computed slower than BF16
        base = json.loads(run("presets", "h100-sxm-80gb").out)
        with tempfile.TemporaryDirectory() as tmp:
            path = write_json(os.path.join(tmp, "hw.json"), {**base, "fp8_tflops": 500})
            self.assert_one_line(run("capacity", "--hardware", path), mentions=["fp8_tflops 500 is below tflops 989"])
            path = write_json(os.path.join(tmp, "none.json"), {**base, "fp8_tflops": 0})
            self.assertEqual(run("capacity", "--hardware", path).code, 0)


class NumbersWrittenAsText(Checks):
    """helper-43: '12.7' printed bare read as if 12.7 itself were refused."""

    def test_a_number_in_quotes_is_said_to_be_text(self):
        report = json.loads(run("simulate", "--requests", 4, "--json").out)
        for key, value, said in (("median_tpot_ms", "12.7", "got '12.7' (text: write the number without quotes)"),
                                 ("completed", "16", "got '16' (text: write the number without quotes)"),
                                 ("completed", "many", "got 'many'")):
            with self.subTest(key=key, value=value), tempfile.TemporaryDirectory() as tmp:
                path = write_json(os.path.join(tmp, "r.json"), {**report, key: value})
                self.assert_one_line(run("explain", path), mentions=[said])


class TracesReadALineAtATime(Checks):
    """issue 20 finding 9: a trace is read a line at a time; one given as a pipe (read once) still
    reads whole, in every format."""

    def test_a_trace_through_a_pipe_reads_every_row(self):
        for name in ("burst.jsonl", "traces/azure_conv_2023_300.csv", "traces/mooncake_synthetic_300.jsonl"):
            with self.subTest(name):
                path = os.path.join(FIXTURES, name)
                direct = run("simulate", "--trace", path, "--requests", 40, "--max-model-len", 200000, "--json")
                piped = run("simulate", "--trace", "/dev/stdin", "--requests", 40, "--max-model-len", 200000,
                            "--json", prefix=["bash", "-c", f'cat {path} | "$0" "$@"', sys.executable])
                self.assertEqual(direct.code, 0, direct.seen())
                self.assertEqual(piped.code, 0, piped.seen())
                self.assertEqual(piped.json()["total_input_tokens"], direct.json()["total_input_tokens"])

    def test_a_bad_line_past_the_requests_read_is_not_read(self):
        with tempfile.TemporaryDirectory() as tmp:
            rows = ['{"arrival": %d, "prompt_tokens": 10, "output_tokens": 5}' % i for i in range(5)] + ["not json"]
            path = jsonl(os.path.join(tmp, "t.jsonl"), rows)
            self.assertEqual(run("simulate", "--trace", path, "--requests", 5).code, 0)
            self.assert_one_line(run("simulate", "--trace", path, "--requests", 6), mentions=["line 6"])


class PresetShapes(unittest.TestCase):
    def test_every_preset_model_holds_its_shape(self):
        # issue 20 finding 16: the check refuses no preset (each config.json's shape is in its params)
        from helpers import main
        for model in main.MODELS.values():
            with self.subTest(model.name):
                self.assertLess(main.shape_params(model), model.compute_params)


class Merge(Checks):
    """# issue 20 finding 17: merge accepts absurd start clocks and the same run twice."""

    def test_started_unix_out_of_range_is_refused(self):
        # issue 20 finding 17: started_unix 1e15 or +-1e300 (precision turns TTFT p50 into 0.0)
        for value in (1e15, 1e300, -1e300):
            with self.subTest(started_unix=value), tempfile.TemporaryDirectory() as tmp:
                a = write_json(os.path.join(tmp, "a.json"), detailed_report())
                report = detailed_report()
                report["config"] = {"run_id": "def456", "started_unix": value, "started_perf": 10.0}
                b = write_json(os.path.join(tmp, "b.json"), report)
                self.assert_one_line(run("merge", a, b), mentions=["b.json", "started_unix"])

    def test_reports_of_two_devices_are_refused_and_one_device_is_kept(self):
        # helper-43: two devices merged without a word, and the merged report named none
        with tempfile.TemporaryDirectory() as tmp:
            a = write_json(os.path.join(tmp, "a.json"), detailed_report(config={"run_id": "a1", "started_unix": 1.7e9,
                                                                                "started_perf": 10.0, "hardware": "l4-24gb"}))
            b = write_json(os.path.join(tmp, "b.json"), detailed_report(config={"run_id": "b1", "started_unix": 1.7e9 + 5,
                                                                                "started_perf": 10.0, "hardware": "l4-24gb"},
                                                                        input_lens=[300, 301]))
            merged = run("merge", a, b, "--json")
            self.assertEqual(merged.code, 0, merged.seen())
            self.assertEqual(json.loads(merged.out)["config"]["hardware"], "l4-24gb")
            report = detailed_report(config={"run_id": "c1", "started_unix": 1.7e9, "started_perf": 10.0,
                                             "hardware": "h100-sxm-80gb"}, input_lens=[400, 401])
            c = write_json(os.path.join(tmp, "c.json"), report)
            self.assert_one_line(run("merge", a, c), mentions=["c.json is of device h100-sxm-80gb", "a.json of l4-24gb"])

    def test_two_copies_of_one_vllm_bench_file_are_refused(self):
        # issue 20 finding 17: two copies of one vllm-bench file merge silently (4 requests from 2)
        bench = detailed_report()
        del bench["config"]                       # vllm bench results carry no wall-clock start
        with tempfile.TemporaryDirectory() as tmp:
            a = write_json(os.path.join(tmp, "bench.json"), bench)
            b = os.path.join(tmp, "bench-copy.json")
            shutil.copy(a, b)
            r = run("merge", a, b)
            self.assert_one_line(r, mentions=["bench-copy.json"])


class MoreReaders(Checks):
    """Found while writing the tests above; not in issue 20's list (same family as findings 6, 14)."""

    @staticmethod
    def compare_with_series(series):
        """compare on a run of request_rows() with this timeseries.csv beside it."""
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = os.path.join(tmp, "run")
            os.mkdir(run_dir)
            jsonl(os.path.join(run_dir, "requests.jsonl"), request_rows())
            write(os.path.join(run_dir, "timeseries.csv"), series)
            return run("compare", run_dir, *PRESETS)

    def test_timeseries_csv_with_nan_or_inf_is_refused_not_printed_as_nan(self):
        # new (issue 20 follow-up N1): timeseries.csv accepts nan/inf (float() reads them), and
        # compare prints "mean running nan +nan%" and "peak kv use % inf -100.0%" with exit 0
        r = self.compare_with_series("t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct\n"
                                     "1.0,nan,inf,nan,-inf,1e999\n2.0,1,1,1,1,1\n")
        self.assertNotRegex(r.out, r"(?i)\b(nan|inf)\b", f"nan or inf printed: {r.seen()}")
        self.assert_one_line(r, mentions=["timeseries"])

    def test_timeseries_csv_out_of_order_missing_a_column_or_in_fractions(self):
        # From a careless-user pass (session 29): rows out of order were accepted, a column the file
        # lacks was compared as a measured 0, and a 0-1 kv_cache_pct read as 1% in silence.
        compare = self.compare_with_series
        header = "t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct\n"
        self.assert_one_line(compare(header + "2.0,1,1,1,1,50\n1.0,1,1,1,1,50\n"),
                             mentions=["line 3: t is 1, not after the line before's 2"])
        r = compare("t,prompt_throughput,gen_throughput,running\n1.0,1,1,3\n2.0,1,1,4\n")
        self.assertEqual(r.code, 0, r.seen())
        self.assertRegex(r.out, r"peak waiting\s+-\s")
        r = compare(header + "1.0,1,1,1,1,0.4\n2.0,1,1,1,1,0.62\n")
        self.assertEqual(r.code, 0, r.seen())
        self.assertIn("kv_cache_pct never passes 0.62: it reads as a percent", r.err)

    def test_explain_a_loadgen_report_with_edited_timings_or_server_figures(self):
        # new (issue 20 follow-up N2): explain tracebacks (KeyError, TypeError, ValueError) on a
        # hand-edited loadgen report: timings percentiles missing or not numbers, server peaks not numbers
        with open(os.path.join(FIXTURES, "llamacpp-c8.json")) as f:
            report = json.load(f)
        cases = {"timings.prompt_ms without p50": dict(report, timings={"prompt_ms": {}, "ttft_minus_prompt_ms": {}}),
                 "timings.prompt_ms.p50 a string": dict(report, timings={"prompt_ms": {"p50": "x"},
                                                                         "ttft_minus_prompt_ms": {"p50": 5}}),
                 "timings without ttft_minus_prompt_ms": dict(report, timings={"prompt_ms": {"p50": 5}}),
                 "server peak a string": dict(report, server=dict(report["server"], peak_requests_processing="x")),
                 "server peak a list": dict(report, server=dict(report["server"], server="vllm", peak_running=[1]))}
        with tempfile.TemporaryDirectory() as tmp:
            for name, edited in cases.items():
                with self.subTest(name):
                    path = write_json(os.path.join(tmp, "report.json"), edited)
                    r = run("explain", path)
                    self.assertNotIn("Traceback", r.err, r.seen())
                    self.assertIn(r.code, (0, 2), r.seen())
                    if r.code == 2:
                        self.assert_one_line(r, mentions=["report.json"])

    def test_explain_a_simulate_report_with_a_partial_engine_section(self):
        # new (issue 20 follow-up N3): explain on a simulate report whose engine lacks peak_waiting
        r = run("simulate", "--requests", 10, "--json")
        report = r.json()
        report["engine"] = {"peak_running": 1}
        with tempfile.TemporaryDirectory() as tmp:
            path = write_json(os.path.join(tmp, "report.json"), report)
            r = run("explain", path)
        self.assertNotIn("Traceback", r.err, r.seen())
        self.assertIn(r.code, (0, 2), r.seen())
        if r.code == 2:
            self.assert_one_line(r, mentions=["report.json"])

    def test_calibrate_a_report_whose_config_model_is_not_a_string(self):
        # new (issue 20 follow-up N4): calibrate tracebacks (TypeError: unhashable type) when a
        # report's config.model is a list or an object
        shape = ["--model", "smollm2-135m-q8_0", "--hardware", "cpu-4vcpu", "--kv-tokens", "4096", "--max-num-seqs",
                 "4", "--output-tokens", "64", "--requests", "8", "--prompt-tokens", "40", "--json"]
        reports = {c: run("simulate", *shape, "--concurrency", c).json() for c in (1, 4)}
        with tempfile.TemporaryDirectory() as tmp:
            c4 = write_json(os.path.join(tmp, "c4.json"), reports[4])
            for value in (["x"], {"a": 1}):
                with self.subTest(model=value):
                    c1 = write_json(os.path.join(tmp, "c1.json"),
                                    dict(reports[1], config=dict(reports[1]["config"], model=value)))
                    self.assert_one_line(run("calibrate", c1, c4), mentions=["c1.json"])


class ThirdPass(Checks):
    """A careless-user pass of stop 33 (helper-34): a trace's format given with the trace, a pipe
    that never ends, a file that is not text, repeats past the request cap, a preset's name."""

    def test_trace_format_goes_with_trace(self):
        mooncake = os.path.join(FIXTURES, "traces", "mooncake_synthetic_300.jsonl")
        r = run("simulate", "--trace", mooncake, "--trace-format", "mooncake", "--requests", 20)
        self.assertEqual(r.code, 0, r.seen())
        r = run("simulate", "--trace", mooncake, "--trace-format", "azure", "--requests", 20)
        self.assert_one_line(r, mentions=["TIMESTAMP"])
        self.assertLess(len(r.lines()[0]), 400, "a JSON line shown whole as a CSV header")

    def test_an_endless_pipe_is_read_a_line_at_a_time_and_a_non_text_file_is_refused_at_once(self):
        row = '{"arrival": 1, "prompt_tokens": 100, "output_tokens": 10}'
        r = run("simulate", "--trace", "/dev/stdin", "--requests", 5, "--json",
                prefix=["bash", "-c", f"yes '{row}' | \"$0\" \"$@\"", sys.executable], as_bytes=2**30)
        self.assertEqual(r.code, 0, r.seen())
        self.assertEqual(r.json()["completed"], 5)
        for args in (("simulate", "--trace", "/dev/zero"), ("merge", "/dev/zero", "/dev/zero"),
                     ("explain", "/dev/zero"), ("simulate", "--rate-profile", "/dev/zero")):
            with self.subTest(args=args):
                self.assert_one_line(run(*args, as_bytes=2**30), mentions=["/dev/zero", "binary"])

    def test_an_empty_explain_input_and_an_engine_profile_through_a_pipe_say_what_they_are(self):
        # stop 33's notes: `explain /dev/null` called its input "null"; `--engine <(cat profile.json)`
        # was "not a profile file"
        self.assert_one_line(run("explain", "/dev/null"), mentions=["/dev/null", "empty"])
        # helper-37: a scrape whose every sample is out of range printed a warning, then "no metrics"
        with tempfile.TemporaryDirectory() as tmp:
            bad = write(os.path.join(tmp, "bad.prom"), "vllm:num_requests_running -5\nvllm:num_requests_waiting NaN\n")
            self.assert_one_line(run("explain", bad), mentions=["none of its 2 server sample(s) is a number in range"])
        r = run("simulate", "--engine", "/dev/stdin", "--requests", 5,
                prefix=["bash", "-c", 'echo "{}" | "$0" "$@"', sys.executable])
        self.assert_one_line(r, mentions=["--engine", "not a regular file", "save the profile to a file"])

    def test_outputs_through_a_link_to_stdout_read_only_and_one_failing_beside_another(self):
        # helper-38: a link was replaced by a file (`--timeline /dev/stdout` as root turned the
        # container's /dev/stdout into a file), a read-only file was replaced, and a --timeline that
        # could not be written cost the --plot beside it.
        with tempfile.TemporaryDirectory() as tmp:
            target, link = os.path.join(tmp, "run-7.csv"), os.path.join(tmp, "latest.csv")
            write(target, "t,running\n1,2\n")        # an earlier run's
            os.symlink("run-7.csv", link)
            self.assertEqual(run("simulate", "--requests", 5, "--timeline", link).code, 0)
            self.assertTrue(os.path.islink(link), "the link was replaced by a file")
            with open(target) as f:
                self.assertTrue(f.read().startswith("t,"), "the link's target was not written")
            r = run("simulate", "--requests", 5, "--timeline", "/proc/self/fd/1")     # stdout is a file here
            self.assertEqual(r.code, 0, r.seen())
            self.assertIn("servesim llama-3.1-8b", r.out, "the report before the timeline was lost")
            self.assertIn("\nt,prompt_throughput", r.out)
            os.chmod(target, 0o444)
            if not os.access(target, os.W_OK):         # root may write it anyway
                self.assert_one_line(run("simulate", "--requests", 5, "--timeline", target), mentions=["read-only"])
            # helper-65: --plot code/main.py replaced the program with a picture: only a file of what the
            # flag writes is replaced
            program = write(os.path.join(tmp, "main.py"), "import sys\n")
            for flag in ("--plot", "--timeline"):
                self.assert_one_line(run("simulate", "--requests", 5, flag, program),
                                     mentions=[flag, "exists and is not", "give another name"])
            picture = os.path.join(tmp, "s.svg")
            r = run("simulate", "--requests", 5, "--timeline", "/dev/full", "--plot", picture)
            self.assertEqual(r.code, 1, r.seen())
            self.assertTrue(os.path.exists(picture), "the --plot beside a failed --timeline was not written")

    def test_trace_repeats_past_the_request_cap(self):
        burst = os.path.join(FIXTURES, "burst.jsonl")
        self.assert_one_line(run("simulate", "--trace", burst, "--trace-repeats", 1_000_000),
                             mentions=["--trace-repeats", "2,000,000"])
        r = run("simulate", "--trace", burst, "--trace-repeats", 1_000_000, "--requests", 100, "--json",
                as_bytes=2**30)      # the copies the first 100 come from, not 48 million rows
        self.assertEqual(r.code, 0, r.seen())
        self.assertEqual(r.json()["completed"], 100)

    def test_an_empty_path_is_refused_not_taken_for_no_file(self):
        # an unset "$TRACE" ran the synthetic closed loop and answered another question
        for flag, args in (("--trace", ("simulate", "--trace", "")), ("--rate-profile", ("simulate", "--rate-profile", " ")),
                           ("--timeline", ("simulate", "--timeline", "")),
                           ("--plot", ("sweep", "--concurrency", "1,2", "--plot", "")),
                           ("--out", ("calibrate", "--out", "", "a.json")),
                           ("--collect", ("search", "--slo", "ttft_p95:100", "--collect", "")),
                           # positionals too: "corpus : not a directory", "run : cannot read it" named no input
                           ("RUN", ("compare", "")), ("FOLDER", ("validate", " ")), ("REPORT", ("calibrate", "")),
                           ("REPORT", ("merge", "", "b.json")), ("FILE", ("explain", ""))):
            with self.subTest(args=args):
                self.assert_one_line(run(*args), mentions=[f"argument {flag}:", "empty path"])
        # `presets ""` listed every preset, as `presets` alone does
        self.assert_one_line(run("presets", ""), mentions=["argument NAME:", "empty name"])

    def test_a_setting_that_changes_nothing_alone_is_refused(self):
        cases = {("--acceptance-rate", "0.5"): "--speculative-tokens", ("--draft-model", "smollm2-135m-q8_0"): "--speculative-tokens",
                 ("--kv-offloading-backend", "lmcache"):
                 "--kv-offloading-size", ("--inter-node-gbs", "25"): "a replica inside one node",
                 ("--gpus-per-node", "4"): "one GPU a replica"}
        for given, needs in cases.items():
            with self.subTest(given=given):
                self.assert_one_line(run("simulate", *given, "--requests", 5), mentions=[given[0], needs])
        # an unknown preset is blamed on the flag that named it, not on --model
        self.assert_one_line(run("simulate", "--speculative-tokens", 4, "--draft-model", "llama-3.2-1b"),
                             mentions=["--draft-model", "unknown model"])
        # helper-46: given as its own "off" it is as absent; so is --router with one replica, and
        # --compare's rows' own settings, and search --rate's narrowing
        for args, mentions in (
                (("simulate", "--speculative-tokens", 0, "--acceptance-rate", "0.5"), ["--acceptance-rate", "--speculative-tokens"]),
                (("simulate", "--router", "prefix-aware"), ["--router", "--data-parallel-size"]),
                (("sweep", "--compare", "static,paged", "--batching", "static"), ["--compare", "--batching"]),
                (("sweep", "--compare", "static,paged", "--kv-layout", "slots"), ["--compare", "--kv-layout"]),
                (("search", "--slo", "ttft_p95:500", "--rate", 5, "--tolerance", "0.2"), ["--tolerance", "--rate"]),
                (("search", "--slo", "ttft_p95:500", "--concurrency", 8, "--load", "rate"), ["--load rate", "--concurrency"])):
            with self.subTest(args=args):
                self.assert_one_line(run(*args, "--requests", 5), mentions=mentions)
        # beside its own setting, swept or not, it stands (the point without speculation included)
        # (--router too where there are replicas: swept, or chosen by plan or by sweep --gpus)
        for args in (("sweep", "--speculative-tokens", "0,3", "--acceptance-rate", "0.5"),
                     ("sweep", "--gpus", "2", "-tp", "1,2", "--router", "round-robin"),
                     ("sweep", "-dp", "1,2", "--router", "round-robin"),
                     ("simulate", "-dp", "2", "--router", "round-robin")):
            with self.subTest(args=args):
                r = run(*args, "--concurrency", 4, "--requests", 8)
                self.assertEqual(r.code, 0, r.seen())

    def test_json_that_answers_with_exit_1_prints_the_answer(self):
        for args in (("capacity", "--hardware", "l4-24gb", "--model", "llama-3.1-405b"),
                     ("simulate", "--hardware", "l4-24gb", "--model", "llama-3.1-405b")):
            with self.subTest(args=args):
                r = run(*args, "--json")
                self.assertEqual(r.code, 1, r.seen())
                self.assertEqual(len(r.lines()), 1, r.seen())
                self.assertIn("does not fit", r.json()["error"])

    def test_a_report_whose_latency_is_shorter_than_its_ttft(self):
        report = run("simulate", "--requests", 4, "--detailed").json()
        with tempfile.TemporaryDirectory() as tmp:
            good = write_json(os.path.join(tmp, "good.json"), dict(report, config=dict(report["config"], run_id="a")))
            for name, ttfts, latencies in (("late.json", [100.0] + report["ttfts"][1:], report["latencies"]),
                                           ("text.json", report["ttfts"], ["x"] + report["latencies"][1:])):
                with self.subTest(name):
                    bad = write_json(os.path.join(tmp, name), dict(report, ttfts=ttfts, latencies=latencies))
                    self.assert_one_line(run("merge", good, bad), mentions=[name, "latencies[0]"])

    def test_one_bound_twice_and_two_outputs_on_one_file(self):
        for bounds in (("--goodput", "ttft:100000", "ttft:1"), ("--goodput", "ttft:100000", "--goodput", "ttft:1")):
            with self.subTest(bounds=bounds):
                self.assert_one_line(run("simulate", *bounds, "--requests", 5), mentions=["--goodput", "ttft twice"])
        r = run("simulate", "--goodput", "ttft:100000", "--goodput", "tpot:100000", "--requests", 5, "--json")
        self.assertEqual(r.json()["goodput_slos_ms"], {"ttft": 100000, "tpot": 100000})     # both kept
        with tempfile.TemporaryDirectory() as tmp:
            same = os.path.join(tmp, "same.out")
            self.assert_one_line(run("simulate", "--requests", 5, "--timeline", same, "--plot", same),
                                 mentions=["--timeline", "--plot"])
            self.assertFalse(os.path.exists(same))

    def test_second_look_helper_36(self):
        """What a second careless pass found in the fixes above."""
        # An output onto a rate profile, a replica schedule or an engine profile being read
        with tempfile.TemporaryDirectory() as tmp:
            profile = write(os.path.join(tmp, "rp.csv"), "time_s,rate\n0,1\n60,2\n")
            self.assert_one_line(run("simulate", "--requests", 5, "--rate-profile", profile, "--timeline", profile),
                                 mentions=["--rate-profile"])
            with open(profile) as f:
                self.assertEqual(f.read(), "time_s,rate\n0,1\n60,2\n")
        # --trace-format with no trace to read
        self.assert_one_line(run("simulate", "--trace-format", "mooncake", "--requests", 5),
                             mentions=["--trace-format", "--trace"])
        # A URL with an @ after its ? shows nothing of either
        r = run("loadgen", "--url", "http://127.0.0.1:9/v1?api_key=abc@KEYTAIL", "--requests", 1)
        self.assert_one_line(r, mentions=["--url"])
        self.assertNotIn("KEYTAIL", r.err)

    def test_a_preset_name_that_would_drive_the_terminal(self):
        with tempfile.TemporaryDirectory() as tmp:
            hardware = json.loads(run("presets", "l4-24gb").out)
            for name in ("evil\x1b[31mred", "two\nlines"):
                with self.subTest(name=name):
                    path = write_json(os.path.join(tmp, "hw.json"), dict(hardware, name=name))
                    self.assert_one_line(run("capacity", "--hardware", path), mentions=["'name'", "printable"])


if __name__ == "__main__":
    unittest.main()


class HelperFiftyFour(Checks):
    """helper-54 and helper-53: a key given twice in one JSON object kept its last value in silence
    (a profile's kernel_scale 1.2 then 9.9 made TPOT 8x); a JSON error said where in no file; a
    start time below 0 stretched a run 50 s; a report's error that is not text was a failure kind."""

    def test_a_key_given_twice_is_refused_naming_it(self):
        with tempfile.TemporaryDirectory() as tmp:
            profile = os.path.join(tmp, "p.json")
            write(profile, '{"name": "mine", "base": "vllm",\n "kernel_scale": 1.2,\n "kernel_scale": 9.9}\n')
            self.assert_one_line(run("simulate", "--engine", profile, "--requests", 5),
                                 mentions=["p.json", "'kernel_scale' is given twice in one object (line 3)"])
            trace = os.path.join(tmp, "t.jsonl")
            write(trace, '{"arrival": 0, "prompt_tokens": 100, "output_tokens": 5, "prompt_tokens": 7}\n')
            self.assert_one_line(run("simulate", "--trace", trace), mentions=["line 1", "'prompt_tokens' is given twice"])

    def test_a_json_error_says_where_in_the_file(self):
        with tempfile.TemporaryDirectory() as tmp:
            report = os.path.join(tmp, "r.json")
            write(report, '{\n  "completed": 2,\n  "failed": 0,\n}\n')
            self.assert_one_line(run("compare", report, *PRESETS), mentions=["r.json", "at line 4 column 1"])

    def test_a_start_time_below_0_or_an_error_that_is_not_text_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            report = detailed_report(3)
            del report["config"]["started_perf"]
            report["start_times"][1] = -50.0
            path = write_json(os.path.join(tmp, "neg.json"), report)
            self.assert_one_line(run("compare", path, *PRESETS), mentions=["start_times[1]", "from 0"])
            path = write_json(os.path.join(tmp, "err.json"), detailed_report(2, errors=["", 12345]))
            self.assert_one_line(run("compare", path, *PRESETS), mentions=["errors[1] must be text"])

    def test_a_reports_error_reaches_the_terminal_without_its_escapes(self):
        with tempfile.TemporaryDirectory() as tmp:
            report = detailed_report(2, errors=["", "http 500: \x1b[2Jboom"], completed=1, failed=1)
            report["ttfts"][1], report["itls"][1], report["output_lens"][1] = None, [], 0
            first = write_json(os.path.join(tmp, "a.json"), report)
            second = detailed_report(2, config={"run_id": "abc123", "started_unix": 1.7e9 + 5, "started_perf": 15.0})
            second["start_times"] = [15.0, 15.5]
            second = write_json(os.path.join(tmp, "b.json"), second)
            r = run("merge", first, second)
            self.assertNotIn("\x1b", r.out + r.err, r.seen())
            self.assertIn("\\x1b[2Jboom", r.out, r.seen())


class ReportsThatContradictThemselves(Checks):
    """helper-54: a request of 0 output tokens with 101 gaps between them was scored, and a server
    shape of fewer KV tokens than one block was blamed on the memory (exit 1); helper-55: --json kept
    no pipeline parallel size."""

    def test_zero_tokens_with_gaps_and_a_cache_of_part_blocks_are_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            report = detailed_report(2)
            report["output_lens"][1] = 0
            path = write_json(os.path.join(tmp, "zero.json"), report)
            self.assert_one_line(run("compare", path, *PRESETS), mentions=["itls[1] has 4 gaps", "output_lens[1] is 0"])
            for tokens in (1000, 100001):
                shaped = detailed_report(2, server={"shape": {"kv_tokens": tokens, "block_size": 2048 if tokens == 1000
                                                              else 16}})
                path = write_json(os.path.join(tmp, f"shape{tokens}.json"), shaped)
                self.assert_one_line(run("compare", path, *PRESETS),
                                     mentions=[f"server.shape.kv_tokens {tokens:,} is not a whole number"])
            # helper-60: a meta.json of tensor_parallel_size 3 was blamed on --tensor-parallel-size alone
            run_dir = os.path.join(tmp, "run")
            shutil.copytree(VLLM_RUN, run_dir)
            with open(os.path.join(run_dir, "meta.json")) as f:
                meta = json.load(f)

            def three(d):
                for k, v in d.items():
                    if k == "tensor_parallel_size":
                        d[k] = 3
                    elif isinstance(v, dict):
                        three(v)
            three(meta)
            write_json(os.path.join(run_dir, "meta.json"), meta)
            self.assert_one_line(run("compare", run_dir),
                                 mentions=["--tensor-parallel-size 3", "as the run recorded it; the flag replaces it"])
            # helper-60: llama.cpp's 3-token context was blamed on --kv-tokens, a flag the user never gave
            shaped = detailed_report(2, server={"shape": {"kv_tokens": 3, "max_num_seqs": 4}})
            path = write_json(os.path.join(tmp, "tiny.json"), shaped)
            self.assert_one_line(run("compare", path, *PRESETS),
                                 mentions=["server.shape.kv_tokens 3 is less than a 16-token KV block"])

    def test_json_says_the_pipeline(self):
        for command in ("capacity", "simulate"):
            r = run(command, "-pp", 2, "--requests", 5, "--json") if command == "simulate" else \
                run(command, "-pp", 2, "--json")
            self.assertEqual(r.code, 0, r.seen())
            found = r.json() if command == "capacity" else r.json()["config"]
            self.assertEqual(found["pipeline_parallel_size"], 2)


class EpochTimes(Checks):
    def test_a_trace_whose_times_are_wall_clock_seconds_counts_from_its_first_request(self):
        # helper-54: a BurstGPT trace of two rows one second apart at epoch seconds "spans more than a year"
        with tempfile.TemporaryDirectory() as tmp:
            path = write(os.path.join(tmp, "epoch.csv"), "Timestamp,Model,Request tokens,Response tokens,Total tokens,"
                         "Log Type\n1700000000,ChatGPT,100,20,120,Conversation log\n"
                         "1700000001,ChatGPT,200,30,230,Conversation log\n")
            r = run("simulate", "--trace", path, "--trace-format", "burstgpt", "--json")
        self.assertEqual(r.code, 0, r.seen())
        self.assertIn("first request is sent at 1,700,000,000 s, more than a year in", r.err)
        self.assertEqual(r.json()["completed"], 2)
        self.assertLess(r.json()["duration"], 10)


class RowsOutOfOrder(Checks):
    def test_rows_timed_before_the_row_above_are_said_and_sent_in_time_order(self):
        # helper-54: reordered in every format without a word
        with tempfile.TemporaryDirectory() as tmp:
            path = write(os.path.join(tmp, "back.jsonl"), "".join(
                f'{{"arrival": {t}, "prompt_tokens": 10, "output_tokens": 2}}\n' for t in (5, 1, 3)))
            r = run("simulate", "--trace", path, "--detailed")
        self.assertEqual(r.code, 0, r.seen())
        self.assertIn("1 row is timed before the row above it; every request is sent at its own time", r.err)
        self.assertEqual(sorted(r.json()["start_times"]), [1.0, 3.0, 5.0])


class CsvDigits(Checks):
    def test_a_cell_of_other_than_ascii_digits_is_refused_not_misread(self):
        # helper-54: 1_000 and 4_4 read as 1000 and 44, and Arabic-Indic digits as 100, in silence
        with tempfile.TemporaryDirectory() as tmp:
            for cell in ("4_4", "\u0661\u0660\u0660"):
                path = write(os.path.join(tmp, "t.csv"), "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                             f"2023-11-16 18:15:46.6805900,374,{cell}\n2023-11-16 18:15:50.9951690,374,44\n")
                with self.subTest(cell=cell):
                    self.assert_one_line(run("simulate", "--trace", path, "--trace-format", "azure"),
                                         mentions=["line 2", "'GeneratedTokens' must be a whole number"])
            # helper-56: the time columns too (BurstGPT's seconds, Azure's date)
            for name, text in (("bg.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                                          "0,ChatGPT,10,2,12,Conversation log\n1_0,ChatGPT,10,2,12,Conversation log\n"),
                               ("az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                                          "\u0662023-11-16 18:15:50.9951690,374,44\n")):
                path = write(os.path.join(tmp, name), text)
                with self.subTest(file=name):
                    self.assert_one_line(run("simulate", "--trace", path), mentions=["line 3"])

    def test_a_cell_of_thousands_of_digits_is_one_line_not_a_traceback(self):
        # helper-57: int() refuses past 4,300 digits, and the readers let its ValueError out
        digits = "9" * 5000
        with tempfile.TemporaryDirectory() as tmp:
            for name, text, flag in (
                    ("az.csv", f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,{digits},44\n",
                     "--trace"),
                    ("bg.csv", f"Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                               f"0,ChatGPT,{digits},2,12,Conversation log\n", "--trace"),
                    ("replicas.csv", f"time_s,replicas\n0,{digits}\n", "--replica-schedule")):
                path = write(os.path.join(tmp, name), text)
                with self.subTest(file=name):
                    self.assert_one_line(run("simulate", flag, path, *(("--rate", "1") if "replica" in flag else ())),
                                         mentions=["line 2", "a number of 5,000 characters"])


class NothingToReplay(Checks):
    def test_a_trace_whose_every_request_failed_says_so(self):
        # helper-54: "no requests in it" for a bench result of 5 requests that all failed
        with tempfile.TemporaryDirectory() as tmp:
            path = write_json(os.path.join(tmp, "failed.json"), {
                "input_lens": [10] * 5, "output_lens": [0] * 5, "ttfts": [None] * 5, "itls": [[]] * 5,
                "start_times": [1.0, 2.0, 3.0, 4.0, 5.0], "errors": ["boom"] * 5})
            self.assert_one_line(run("simulate", "--trace", path, "--trace-format", "vllm-bench"),
                                 mentions=["no request to replay: 5 requests failed in the measured run"])


class RequestRate(Checks):
    def test_a_request_rate_standing_in_for_start_times_is_held_to_rates_range(self):
        # helper-54: 1e300 req/s was accepted, and -3 called "not finite"
        with tempfile.TemporaryDirectory() as tmp:
            for rate in (1e300, -3):
                report = detailed_report(2, request_rate=rate)
                del report["start_times"]
                path = write_json(os.path.join(tmp, "rate.json"), report)
                with self.subTest(rate=rate):
                    self.assert_one_line(run("compare", path, *PRESETS),
                                         mentions=["request_rate must be from 1e-06 to 1,000,000"])


class MergeKeepsWhatFailedRequestsStreamed(Checks):
    def test_the_reports_failed_streamed_tokens_add_up(self):
        # helper-56: merge printed and kept none of them
        with tempfile.TemporaryDirectory() as tmp:
            first = write_json(os.path.join(tmp, "a.json"), detailed_report(2, failed_streamed_tokens=12))
            second = detailed_report(2, failed_streamed_tokens=3, config={"run_id": "abc123", "started_unix": 1.7e9 + 5,
                                                                          "started_perf": 15.0})
            second["start_times"] = [15.0, 15.5]
            second = write_json(os.path.join(tmp, "b.json"), second)
            r = run("merge", first, second, "--json")
            self.assertEqual(r.code, 0, r.seen())
            self.assertEqual(r.json()["failed_streamed_tokens"], 15)
            bad = write_json(os.path.join(tmp, "c.json"), detailed_report(2, failed_streamed_tokens=-1))
            self.assert_one_line(run("merge", bad, second), mentions=["failed_streamed_tokens must be a whole number"])

    def test_each_failed_requests_stream_is_kept_in_the_merged_detail(self):
        failed = dict(ttfts=[0.05, None], itls=[[0.01] * 4, []], output_lens=[5, 0], errors=["", "connection: reset"],
                      failed_streamed=[None, {"tokens": 7, "ttft": 0.2}], failed_streamed_tokens=7)
        with tempfile.TemporaryDirectory() as tmp:
            first = write_json(os.path.join(tmp, "a.json"), detailed_report(2, **failed))
            second = detailed_report(2, config={"run_id": "abc123", "started_unix": 1.7e9 + 5, "started_perf": 15.0})
            second["start_times"] = [15.0, 15.5]
            second = write_json(os.path.join(tmp, "b.json"), second)
            r = run("merge", first, second, "--detailed")
            self.assertEqual(r.code, 1, r.seen())       # (a request failed)
            self.assertEqual(r.json()["failed_streamed"], [None, {"tokens": 7, "ttft": 0.2}, None, None])
            for entry in ({"tokens": 0, "ttft": 0.2}, {"tokens": 7}, "7", {"tokens": 7, "ttft": -1}):
                with self.subTest(entry=entry):
                    bad = write_json(os.path.join(tmp, "c.json"),
                                     detailed_report(2, **{**failed, "failed_streamed": [None, entry]}))
                    self.assert_one_line(run("merge", bad, second), mentions=["failed_streamed[1] must be"])
            bad = write_json(os.path.join(tmp, "d.json"), detailed_report(2, **{**failed, "failed_streamed": [None]}))
            self.assert_one_line(run("merge", bad, second), mentions=["failed_streamed must be a list as long"])


class CsvHeadersAsWritten(unittest.TestCase):
    def test_spaces_a_blank_first_line_and_lower_case_are_read_and_an_unknown_header_is_named(self):
        # helper-62: "TIMESTAMP, ContextTokens" had "no column 'ContextTokens'"; a blank first line
        # gave "the header is " and nothing; a lower-case header or a comment fell through to JSONL
        # ("line 1: not valid JSON"); an extra cell was dropped without a word
        rows = "2023-11-16 18:15:46.68,{p},44\n2023-11-16 18:15:47.68,{p},40\n"
        with tempfile.TemporaryDirectory() as tmp:
            def trace(text):
                path = os.path.join(tmp, "t.csv")
                with open(path, "w") as f:
                    f.write(text)
                return main.read_trace(path)
            plain = trace("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows.format(p=374))
            for text in ("TIMESTAMP, ContextTokens, GeneratedTokens\n" + rows.format(p=" 374"),
                         "\n\nTIMESTAMP,ContextTokens,GeneratedTokens\n" + rows.format(p=374),
                         "timestamp,contexttokens,generatedtokens\n" + rows.format(p=374)):
                with self.subTest(text=text[:30]):
                    self.assertEqual(trace(text).rows, plain.rows)
            extra = trace("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows.format(p=374).replace("\n", ",9\n"))
            self.assertEqual(extra.rows, plain.rows)
            self.assertIn("2 rows with more cells than the header are read by the header's columns", extra.notes[0])
            for text, said in (("# Azure\nTIMESTAMP,ContextTokens,GeneratedTokens\n", "its first line is a comment"),
                               ("a,b,c\n1,2,3\n", "reads as a CSV header (a,b,c), of neither Azure's trace")):
                with self.subTest(text=text[:10]), self.assertRaises(main.UserError) as e:
                    trace(text)
                self.assertIn(said, str(e.exception))


class SessionsWithinAYear(unittest.TestCase):
    def test_delays_that_add_up_past_a_year_are_refused_where_the_trace_is_read(self):
        # helper-62: 400 turns a day apart ran "over 34,473,918 s" (399 days)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "s.jsonl")
            with open(path, "w") as f:
                f.write(json.dumps({"arrival": 0, "prompt_tokens": 100, "output_tokens": 10, "id": "r0"}) + "\n")
                for i in range(1, 400):
                    f.write(json.dumps({"arrival": 0, "prompt_tokens": 100 + 110 * i, "output_tokens": 10,
                                        "id": f"r{i}", "parent": f"r{i - 1}", "delay": 86400}) + "\n")
            with self.assertRaises(main.UserError) as e:
                main.read_trace(path)
        self.assertIn("row 367: its session's delays put it 366 days in", str(e.exception))


class BailianIds(unittest.TestCase):
    def test_text_ids_link_a_chat_and_other_ids_are_counted(self):
        # helper-62: a parent_chat_id "b" silently lost its link; a script saw no trace notes in --json
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "b.jsonl")
            rows = [{"chat_id": "b", "parent_chat_id": -1, "timestamp": 0, "input_length": 32, "output_length": 5, "hash_ids": [1, 2]},
                    {"chat_id": "a", "parent_chat_id": "b", "timestamp": 1, "input_length": 64, "output_length": 5, "hash_ids": [1, 2, 3, 4]},
                    {"chat_id": 1.5, "parent_chat_id": -1, "timestamp": 2, "input_length": 32, "output_length": 5, "hash_ids": [7, 8]}]
            with open(path, "w") as f:
                f.write("".join(json.dumps(row) + "\n" for row in rows))
            trace = main.read_trace(path)
            self.assertEqual(trace.parents, (-1, 0, -1))
            self.assertIn("1 row with a chat_id or parent_chat_id that is neither a whole number nor text starts "
                          "afresh", trace.notes[0])
            result = main.run(main.RunSpec(trace=trace))
            self.assertEqual(result["config"]["trace_notes"], list(trace.notes))


class WallClockTimes(unittest.TestCase):
    def test_a_time_since_1970_gets_the_hint_to_count_from_the_start(self):
        # helper-62: epoch seconds in servesim JSONL, epoch ms in Mooncake: the range error alone
        with tempfile.TemporaryDirectory() as tmp:
            for name, row in (("s.jsonl", {"arrival": 1700000000, "prompt_tokens": 100, "output_tokens": 10}),
                              ("m.jsonl", {"timestamp": 1700000000000, "input_length": 600, "output_length": 5,
                                           "hash_ids": [1, 2]})):
                path = os.path.join(tmp, name)
                with open(path, "w") as f:
                    f.write(json.dumps(row) + "\n")
                with self.subTest(name=name), self.assertRaises(main.UserError) as e:
                    main.read_trace(path)
                self.assertIn("reads as a wall-clock time (since 1970): give each time from the file's start",
                              str(e.exception))
                self.assertNotIn(".0,", str(e.exception))


class Helper70(Checks):
    """helper-70's hostile files: what a reader cannot read as meant is one line naming it."""

    def test_a_csv_header_naming_a_column_twice_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = write(os.path.join(tmp, "t.csv"), "TIMESTAMP,ContextTokens,GeneratedTokens,contexttokens\n"
                                       "2023-11-16 18:15:46.6805900,374,44,9999999\n")
            self.assert_one_line(run("simulate", "--trace", path), mentions=["column 'contexttokens' twice"])
            path = write(os.path.join(tmp, "p.csv"), "")
            self.assert_one_line(run("simulate", "--rate-profile", path), mentions=["p.csv: empty"])

    def test_a_run_folders_engine_arguments_are_held_to_vllms(self):
        with tempfile.TemporaryDirectory() as tmp:
            folder = os.path.join(tmp, "run")
            shutil.copytree(VLLM_RUN, folder)
            meta = os.path.join(folder, "meta.json")
            with open(meta) as f:
                original = json.load(f)
            for key, value, said in (("kv_cache_dtype", "5", "kv_cache_dtype '5' is none of vLLM's"),
                                     ("dtype", "float32", "dtype 'float32': servesim prices weights in 16 bits")):
                with self.subTest(key=key):
                    changed = copy.deepcopy(original)
                    changed["engine_kwargs"][key] = value
                    write_json(meta, changed)
                    self.assert_one_line(run("compare", folder, timeout=60), mentions=[said])
            # a checkpoint's own format is said, and priced as the preset gives it
            changed = copy.deepcopy(original)
            changed["engine_kwargs"]["quantization"] = "compressed-tensors"
            write_json(meta, changed)
            r = run("compare", folder, timeout=60)
            self.assertEqual(r.code, 0, r.seen())
            self.assertIn("'compressed-tensors' is a checkpoint's own format", r.err)
            # a timeseries.csv in capitals is read; one with a header alone is said
            write_json(meta, original)
            series = os.path.join(folder, "timeseries.csv")
            with open(series) as f:
                text = f.read()
            write(os.path.join(folder, "timeseries.csv"), text.split("\n", 1)[0].upper() + "\n" + text.split("\n", 1)[1])
            r = run("compare", folder, timeout=60)
            self.assertEqual(r.code, 0, r.seen())
            self.assertIn("mean running", r.out)
            write(os.path.join(folder, "timeseries.csv"), text.split("\n", 1)[0] + "\n")
            r = run("compare", folder, timeout=60)
            self.assertEqual(r.code, 0, r.seen())
            self.assertIn("timeseries.csv has a header and no rows", r.err)

    def test_reports_whose_engine_model_or_deployment_cannot_be_read_as_meant(self):
        with tempfile.TemporaryDirectory() as tmp:
            r = run("simulate", "--requests", "20", "--concurrency", "4", "--detailed", "--json")
            report = json.loads(r.out)
            report["config"]["engine"] = {}
            path = write_json(os.path.join(tmp, "e.json"), report)
            for command in ("compare", "explain"):
                with self.subTest(command=command):
                    self.assert_one_line(run(command, path), mentions=["config.engine must be an engine's name"])
            # a profile file named after a built-in engine is not replayed as the built-in
            report["config"].update(engine="vllm", engine_base="vllm")
            path = write_json(os.path.join(tmp, "p.json"), report)
            r = run("compare", path)
            self.assertEqual(r.code, 0, r.seen())
            self.assertIn("engine profile 'vllm' is a file the report does not hold", r.err)
            # calibrate prices one GPU in its own dtype: a report of a group is refused
            r = run("simulate", "--requests", "20", "--concurrency", "4", "-tp", "2", "--json")
            path = write(os.path.join(tmp, "tp.json"), r.out)
            self.assert_one_line(run("calibrate", path), mentions=["it ran -tp 2", "give it runs of one GPU"])

    def test_merge_and_explain_hold_a_reports_names_and_counts(self):
        with tempfile.TemporaryDirectory() as tmp:
            a = write_json(os.path.join(tmp, "a.json"), detailed_report())
            bad = detailed_report(3, config={"run_id": "def456", "started_unix": 1.7e9 + 100, "started_perf": 10.0,
                                             "model": -1})
            b = write_json(os.path.join(tmp, "b.json"), bad)
            self.assert_one_line(run("merge", a, b), mentions=["config.model must be a name"])
            report = json.loads(run("simulate", "--requests", "10", "--json").out)
            del report["engine"]
            report["server"] = {"server": "llama.cpp", "peak_requests_processing": 1e14}
            path = write_json(os.path.join(tmp, "l.json"), report)
            self.assert_one_line(run("explain", path), mentions=["server.peak_requests_processing is 1e+14"])
            scrape = write(os.path.join(tmp, "m.txt"), "vllm:num_requests_waiting 1_000\nvllm:num_requests_running 3\n")
            r = run("explain", scrape)
            self.assertEqual(r.code, 0, r.seen())
            self.assertIn("left out 1 sample(s)", r.err)

    def test_a_device_of_absurd_memory_gets_no_mib_hint(self):
        with tempfile.TemporaryDirectory() as tmp:
            device = json.loads(run("presets", "h100-sxm-80gb").out)
            device["memory_gib"] = 1e300
            path = write_json(os.path.join(tmp, "d.json"), device)
            r = run("capacity", "--hardware", path)
            self.assert_one_line(r, mentions=["memory_gib"])
            self.assertNotIn("nvidia-smi", r.err)

    def test_a_streamed_request_of_no_tokens_and_a_failed_commands_output(self):
        with tempfile.TemporaryDirectory() as tmp:
            rows = request_rows()
            rows[2]["input_toks"] = 0
            path = jsonl(os.path.join(tmp, "requests.jsonl"), rows)
            self.assert_one_line(run("compare", path, *PRESETS), mentions=["input_toks 0 and output_toks 20"])
            path = write_json(os.path.join(tmp, "e.json"), {"error": "llama-3.1-70b does not fit"})
            self.assert_one_line(run("explain", path), mentions=["the output of a command that failed"])
