"""explain applies the runbook's decision table: one case per row, scrapes of each server,
and the runbook and the command sharing one table."""
import json
import os
import re
import tempfile
import unittest

from helpers import FIXTURES, ROOT, call_cli, main, run_cli

RUNBOOK = os.path.join(ROOT, "outputs", "skill-llm-serving-tuning.md")


class Rows(unittest.TestCase):
    """Each symptom row of the table, on a simulated case built to show it."""

    def explain(self, *simulate):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "report.json")
            code, out, err = run_cli(*simulate, "--json")
            self.assertIn(code, (0, 1), err)
            with open(path, "w") as f:
                f.write(out)
            code, out, err = run_cli("explain", path, "--json")
        self.assertEqual(code, 0, err)
        return json.loads(out)[0]

    def test_kv_bound_with_preemptions(self):
        e = self.explain("simulate", "--hardware", "l4-24gb", "--trace", f"{FIXTURES}/burst.jsonl")
        self.assertEqual(e["symptom"], "kv-bound")
        self.assertIn("--enable-prefix-caching", e["change_first"])
        self.assertIn("--max-num-seqs", e["will_not_help"])
        self.assertIn("memory binds first", " ".join(e["capacity"]))

    def test_sequence_bound_with_idle_kv(self):
        e = self.explain("simulate", "--max-num-seqs", "8", "--concurrency", "32", "--requests", "64")
        self.assertEqual(e["symptom"], "sequence-bound")
        self.assertEqual(e["phase"], "queue")
        self.assertIn("--max-num-seqs", e["change_first"])
        self.assertIn("--gpu-memory-utilization", e["will_not_help"])

    def test_token_budget_bound_with_long_prompts(self):
        e = self.explain("sweep", "--max-num-batched-tokens", "256", "--max-num-seqs", "32", "--prompt-tokens",
                         "3000-4000", "--output-tokens", "64-128", "--concurrency", "32", "--requests", "64",
                         "--max-model-len", "8192")
        self.assertEqual(e["symptom"], "token-budget-bound")
        self.assertIn("--max-num-batched-tokens", e["change_first"])
        self.assertNotIn("compute-bound", " ".join(e["evidence"]))     # 256 tokens is near the knee (~197)

    def test_queue_dominated_ttft(self):
        e = self.explain("simulate", "--concurrency", "256", "--requests", "256")
        self.assertEqual(e["symptom"], "queue-bound")
        self.assertGreater(e["phases_ms"]["queue"], 0.5 * e["ttft_ms"])

    def test_compute_bound_decode_past_the_knee(self):
        e = self.explain("simulate", "--hardware", "cpu-4vcpu", "--model", "smollm2-135m-q8_0", "--kv-tokens", "4096",
                         "--max-num-seqs", "4", "--prompt-tokens", "40", "--output-tokens", "64", "--requests", "16",
                         "--concurrency", "4")
        self.assertEqual(e["symptom"], "compute-bound")
        self.assertIn("GPU utilisation", e["will_not_help"])

    def test_failed_requests_are_a_symptom_not_a_healthy_server(self):
        # helper-46: 8 of 50 requests longer than --max-model-len read "healthy", change first "nothing"
        e = self.explain("simulate", "--requests", "50", "--max-model-len", "1100", "--seed", "9")
        self.assertEqual(e["symptom"], "failing")
        self.assertEqual(e["evidence"], ["8 of 50 requests failed (the first: longer than --max-model-len: "
                                         "prompt 1,001 + output 161 tokens > 1,100)"])
        self.assertIn("`--max-model-len` up", e["change_first"])
        # with another row binding, the failures are its evidence too
        e = self.explain("simulate", "--max-num-seqs", "8", "--concurrency", "32", "--requests", "64",
                         "--max-model-len", "1100", "--seed", "9")
        self.assertEqual(e["symptom"], "sequence-bound")
        self.assertRegex(e["evidence"][-1], r"^\d+ of 64 requests failed \(the first: longer than --max-model-len")
        # helper-47: a --seeds report kept the first seed's failure kinds only (none here), so the
        # row named no reason; the seeds' mean count is said to a tenth
        e = self.explain("simulate", "--seeds", "3", "--requests", "40", "--rate", "5", "--prompt-tokens", "100-2100",
                         "--output-tokens", "20", "--max-model-len", "2090")
        self.assertEqual(e["evidence"], ["0.3 of 40 requests failed (the first: longer than --max-model-len: "
                                         "prompt 2,074 + output 20 tokens > 2,090)"])

    def test_a_healthy_server(self):
        e = self.explain("simulate", "--concurrency", "8", "--requests", "64")
        self.assertEqual(e["symptom"], "healthy")
        self.assertEqual(e["phase"], "decode")

    def test_a_sweep_is_judged_at_its_most_loaded_point(self):
        e = self.explain("sweep", "--hardware", "cpu-4vcpu", "--model", "smollm2-135m-q8_0", "--kv-tokens", "4096",
                         "--max-num-seqs", "4", "--prompt-tokens", "40", "--output-tokens", "64", "--requests", "16",
                         "--concurrency", "1,4,8")
        self.assertIn("most loaded of 3 points", e["source"])
        self.assertEqual(e["symptom"], "compute-bound")
        # helper-37: the values in another order (a sweep runs them as given) judged the last one
        flipped = self.explain("sweep", "--hardware", "cpu-4vcpu", "--model", "smollm2-135m-q8_0", "--kv-tokens", "4096",
                               "--max-num-seqs", "4", "--prompt-tokens", "40", "--output-tokens", "64",
                               "--requests", "16", "--concurrency", "8,4,1")
        self.assertEqual({k: v for k, v in flipped.items() if k != "source"},
                         {k: v for k, v in e.items() if k != "source"})


class WontHelp(unittest.TestCase):
    """Every "won't help" of the table holds in servesim's own model: on each row's case, the
    knob it rules out changes nothing, and what the simulator shows helping is not ruled out
    (issue 20 finding 25)."""

    def points(self, *sweep):
        code, out, err = run_cli("sweep", *sweep, "--jobs", 1, "--json")
        self.assertIn(code, (0, 1), err)
        return json.loads(out)

    def explained(self, point):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "point.json")
            with open(path, "w") as f:
                json.dump(point, f)
            code, out, err = run_cli("explain", path, "--json")
        self.assertEqual(code, 0, err)
        return json.loads(out)[0]

    def test_a_bigger_token_budget_is_worth_it_below_the_knee_and_a_trade_past_it(self):
        # helper-72: a 2,048-token step on an H100 (knee ~197) is compute-bound, and explain promised
        # TTFT would fall with throughput the same; four times the budget bought 7% of queue p95
        shape = ("--prompt-tokens", "3000-4000", "--output-tokens", "64-128", "--concurrency", 32, "--requests", 64,
                 "--max-model-len", 8192, "--max-num-seqs", 32)
        small, bigger = self.points(*shape, "--max-num-batched-tokens", "256,1024")
        e = self.explained(small)
        self.assertEqual(e["symptom"], "token-budget-bound")
        self.assertLess(bigger["median_ttft_ms"], 0.5 * small["median_ttft_ms"])
        past, bigger = self.points(*shape, "--max-num-batched-tokens", "2048,8192")
        e = self.explained(past)
        self.assertEqual(e["symptom"], "token-budget-bound")
        self.assertIn("a step of 2,048 tokens is already compute-bound (knee ~197)", e["evidence"])
        self.assertTrue(e["expected_effect"].startswith("TTFT falls only as TPOT rises"), e["expected_effect"])
        self.assertGreater(bigger["p95_tpot_ms"], 1.1 * past["p95_tpot_ms"])
        self.assertLessEqual(bigger["output_throughput"], past["output_throughput"])

    def test_a_healthy_run_with_cached_prompts_or_a_first_round_waiting_is_not_budget_bound(self):
        # helper-72: 4 ms of queue (29% of a 15 ms TTFT) read as requests waiting, and 2,197-token
        # prompts, 90% of them cached, as long against an 8,192-token budget
        point, = self.points("--prefix-caching", "on", "--prefix-tokens", 2000, "--num-prefixes", 2, "--prompt-tokens",
                             "100-300", "--output-tokens", 50, "--rate", 30, "--requests", 400)
        self.assertLess(point["median_queue_ms"], 10)
        self.assertEqual(self.explained(point)["symptom"], "healthy")
        # a closed loop's first round waits at once (peak waiting 30), then nobody does
        point, = self.points("--concurrency", 64, "--requests", 512, "--prompt-tokens", "2000-4000", "--output-tokens",
                             "200-400")
        self.assertGreater(point["engine"]["peak_waiting"], 50)
        self.assertEqual(point["median_queue_ms"], 0)
        # (Not healthy either: 3,000-token prompts chunked into every step put it past the knee, TPOT
        # 35 ms against 7.6 at batch 1; see test_prompt_chunks_past_the_knee_are_not_healthy.)
        self.assertEqual(self.explained(point)["symptom"], "compute-bound")

    def test_prompt_chunks_past_the_knee_are_not_healthy(self):
        # helper-77: 2,000-token prompts at 4.2 req/s on a 70B TP4 read "healthy ... raise load" at a
        # TPOT 3.6 times the batch-1 step: 62 sequences are under the knee (197 tokens), but with the
        # prompt chunks a step computed 516 tokens. Smaller chunks are the TPOT knob, and they work.
        shape = ("--model", "llama-3.1-70b", "--max-model-len", 4096, "-tp", 4, "--requests", 800, "--prompt-tokens",
                 "1500-2500", "--output-tokens", "150-400", "--rate", 4.2)
        point, smaller = self.points(*shape, "--max-num-batched-tokens", "8192,512")
        e = self.explained(point)
        self.assertEqual(e["symptom"], "compute-bound")
        self.assertRegex(e["evidence"][0], r"^[4-7]\d\d tokens a step \(decodes and prompt chunks, mean batch \d\d\.\d\) "
                                           r"past the knee at ~197$")
        self.assertTrue(e["change_first"].startswith("for TPOT, `--max-num-batched-tokens` down"), e["change_first"])
        self.assertLess(smaller["median_tpot_ms"], 0.7 * point["median_tpot_ms"])
        # Its group is a node's 8 GPUs already: the throughput advice is another replica, not more TP.
        e = self.explained(self.points(*shape, "-tp", 8, "--rate", 14)[0])
        self.assertIn("another replica (tensor parallelism is 8 already, a node's GPUs)", e["change_first"])
        self.assertNotIn("--tensor-parallel-size", e["change_first"].partition("; for throughput, ")[2])

    def test_a_steps_tokens_are_counted_as_its_engine_computed_them(self):
        # helper-78: a disaggregated report's prompts (another engine's) over its decode steps read
        # 430 tokens a step where the decode engine computed 86; --warmup's steps over the measured
        # requests' tokens halved the figure
        shape = ("--max-model-len", 4096, "--requests", 300, "--prompt-tokens", 3000, "--output-tokens", "600-900",
                 "--rate", 8)
        apart, = self.points(*shape, "--disaggregate")
        self.assertIsNone(main.signals_from_report(apart, "d").step_tokens)
        plain, = self.points(*shape[:-2], "--rate", 4)
        warm, = self.points(*shape[:-2], "--rate", 4, "--warmup", 150)
        ratio = main.signals_from_report(warm, "w").step_tokens / main.signals_from_report(plain, "p").step_tokens
        self.assertAlmostEqual(ratio, 1, delta=0.2)

    def test_seats_full_on_steps_past_the_knee_are_compute_not_seats(self):
        # helper-78: "--max-num-seqs up" at 985 tokens a step (the knee ~394), TPOT 4.6 times batch 1;
        # and a group of tensor parallel 4 x pipeline 2 is 4 GPUs of tensor parallelism, not a node's 8
        point, = self.points("--model", "llama-3.1-70b", "--max-model-len", 4096, "-tp", 4, "-pp", 2, "--requests", 300,
                             "--prompt-tokens", "1500-2500", "--output-tokens", "150-400", "--rate", 9)
        self.assertEqual(point["engine"]["peak_running"], 256)
        e = self.explained(point)
        self.assertEqual(e["symptom"], "compute-bound")
        self.assertIn("256 running of 256 allowed: more would add to each step", e["evidence"])
        self.assertIn("tensor parallelism (`--tensor-parallel-size`)", e["change_first"])
        self.assertNotIn("a node's GPUs", e["change_first"])
        # a node of 4 GPUs is full at tensor parallel 4: the change and its effect both say a replica
        point["config"]["gpus_per_node"] = 4
        e = self.explained(point)
        self.assertIn("another replica (tensor parallelism is 4 already, a node's GPUs)", e["change_first"])
        self.assertNotIn("--tensor-parallel-size", e["expected_effect"])

    def test_a_run_that_waits_at_the_cap_is_not_healthy_whatever_its_median_queue(self):
        # helper-73: bursts that fill 8 seats leave the median request unqueued (30 ms) while 28% of
        # the steps have requests waiting at the cap, and p90 waits 2.2 s: it read "healthy"
        point, = self.points("--max-num-seqs", 8, "--rate", 3, "--burstiness", 0.1, "--requests", 400)
        self.assertLess(point["median_queue_ms"], main.QUEUE_NOTICED_MS)
        self.assertGreater(point["p90_queue_ms"], 1000)
        self.assertEqual(self.explained(point)["symptom"], "sequence-bound")

    def test_compute_bound_with_ttft_mostly_queue_asks_for_throughput_first(self):
        # helper-72: the advice was to lower --parallel, which lengthens the queue that is 84% of TTFT
        code, out, err = run_cli("explain", f"{FIXTURES}/llamacpp-c8.json", "--server-flags", "--parallel 4",
                                 "--hardware", f"{FIXTURES}/cpu-calibrated.json", "--model", "smollm2-135m-q8_0",
                                 "--json")
        self.assertEqual(code, 0, err)
        e = json.loads(out)[0]
        self.assertEqual((e["symptom"], e["phase"]), ("compute-bound", "queue"))
        self.assertTrue(e["change_first"].startswith("for throughput (TTFT is mostly queue), another `llama-server`"))

    def test_replicas_help_a_kv_bound_run_so_explain_does_not_rule_them_out(self):
        # issue 20 finding 25: explain said "a second GPU while prefix caching is off" won't help;
        # servesim's own sweep -dp 1,2 on that case takes TTFT p50 from 2.5 s to 0.36 s
        one, two = self.points("--kv-tokens", 20000, "--concurrency", 64, "--requests", 600, "-dp", "1,2")
        e = self.explained(one)
        self.assertEqual(e["symptom"], "kv-bound")
        self.assertGreater(one["median_ttft_ms"], 2 * two["median_ttft_ms"])
        self.assertNotRegex(e["will_not_help"], r"(?i)GPU|replica|data.parallel")

    def test_prefix_caching_helps_a_compute_bound_run_with_shared_prefixes(self):
        off, on = self.points("--hardware", "cpu-4vcpu", "--model", "smollm2-135m-q8_0", "--kv-tokens", 8192,
                              "--max-num-seqs", 4, "--prefix-tokens", 500, "--prompt-tokens", 40, "--output-tokens", 64,
                              "--requests", 16, "--concurrency", 4, "--prefix-caching", "off,on")
        e = self.explained(off)
        self.assertEqual(e["symptom"], "compute-bound")
        self.assertGreater(on["output_throughput"], 2 * off["output_throughput"])
        self.assertNotIn("prefix caching", e["will_not_help"])

    def test_each_knob_ruled_out_changes_nothing_on_its_row_case(self):
        cases = [   # symptom, the row's case as a sweep of the knob its "won't help" names
            ("kv-bound", "--max-num-seqs", ["--hardware", "l4-24gb", "--trace", f"{FIXTURES}/burst.jsonl",
                                             "--max-num-seqs", "256,512"]),
            ("sequence-bound", "--gpu-memory-utilization", ["--max-num-seqs", 8, "--concurrency", 32, "--requests", 64,
                                                            "--gpu-memory-utilization", "0.9,0.95"]),
            ("token-budget-bound", "--max-num-seqs", ["--max-num-batched-tokens", 256, "--prompt-tokens", "3000-4000",
                                                      "--output-tokens", "64-128", "--concurrency", 32, "--requests", 64,
                                                      "--max-model-len", 8192, "--max-num-seqs", "32,64"]),
            ("queue-bound", "--max-num-seqs", ["--concurrency", 256, "--requests", 256, "--max-num-seqs", "256,512"]),
            ("compute-bound", "KV memory", ["--hardware", "cpu-4vcpu", "--model", "smollm2-135m-q8_0", "--max-num-seqs",
                                            4, "--prompt-tokens", 40, "--output-tokens", 64, "--requests", 16,
                                            "--concurrency", 4, "--kv-tokens", "4096,8192"]),
        ]
        for symptom, knob, sweep in cases:
            with self.subTest(symptom):
                before, after = self.points(*sweep)
                e = self.explained(before)
                self.assertEqual(e["symptom"], symptom)
                self.assertIn(knob, e["will_not_help"])
                for key in ("median_ttft_ms", "median_tpot_ms", "output_throughput"):
                    self.assertAlmostEqual(after[key], before[key], delta=0.01 * before[key], msg=key)


class Scrapes(unittest.TestCase):
    def explain_text(self, text, *flags):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(text)
        self.addCleanup(os.unlink, f.name)
        code, out, err = run_cli("explain", f.name, "--json", *flags)
        self.assertEqual(code, 0, err)
        return json.loads(out)[0]

    def test_a_vllm_scrape_with_preemptions_and_a_full_cache(self):
        e = self.explain_text('vllm:num_requests_running{engine="0"} 17\nvllm:num_requests_waiting{engine="0"} 40\n'
                              'vllm:kv_cache_usage_perc{engine="0"} 1.0\nvllm:num_preemptions_total{engine="0"} 31\n'
                              'vllm:time_to_first_token_seconds_sum{engine="0"} 400\n'
                              'vllm:time_to_first_token_seconds_count{engine="0"} 20\n'
                              'vllm:request_queue_time_seconds_sum{engine="0"} 380\n'
                              'vllm:request_queue_time_seconds_count{engine="0"} 20\n',
                              "--server-flags", "--max-num-seqs 512")
        self.assertEqual((e["server"], e["symptom"]), ("vllm", "kv-bound"))
        self.assertIn("--enable-prefix-caching", e["change_first"])
        self.assertAlmostEqual(e["phases_ms"]["queue"], 19000)

    def test_a_llama_cpp_scrape_with_every_slot_busy_and_requests_deferred(self):
        e = self.explain_text("llamacpp:requests_processing 4\nllamacpp:requests_deferred 4\n"
                              "llamacpp:n_busy_slots_per_decode 3.9\n", "--server-flags", "--parallel 4 --ctx-size 4096")
        self.assertEqual((e["server"], e["symptom"]), ("llama.cpp", "sequence-bound"))
        self.assertIn("--parallel", e["change_first"])

    def test_server_flags_of_which_explain_reads_none_are_said_to_change_nothing(self):
        report = os.path.join(FIXTURES, "llamacpp-c8.json")
        code, _, err = run_cli("explain", report, "--server-flags", "--host 0.0.0.0 --port 8080 -ngl 99")
        self.assertEqual(code, 0, err)
        self.assertIn("--server-flags: none of these is a flag explain reads (--max-num-seqs, --parallel", err)
        code, _, err = run_cli("explain", report, "--server-flags", "--host 0.0.0.0 --parallel 4")
        self.assertEqual((code, err), (0, ""))      # one it reads among others: nothing to say

    def test_what_will_not_help_is_named_in_the_servers_own_flags(self):
        # A llama.cpp report's "won't help" named vLLM's --max-num-seqs and --max-num-batched-tokens.
        code, out, err = run_cli("explain", os.path.join(FIXTURES, "llamacpp-c8.json"), "--json")
        self.assertEqual(code, 0, err)
        e = json.loads(out)[0]
        self.assertEqual((e["server"], e["symptom"]), ("llama.cpp", "queue-bound"))
        self.assertIn("`--parallel`", e["will_not_help"])
        self.assertIn("`--batch-size`", e["will_not_help"])
        self.assertNotIn("--max-num", e["will_not_help"])
        e = self.explain_text('sglang:num_running_reqs{model_name="m"} 8\nsglang:num_queue_reqs{model_name="m"} 30\n'
                              'sglang:token_usage{model_name="m"} 0.2\n', "--server-flags", "--max-running-requests 8")
        self.assertEqual((e["server"], e["symptom"]), ("sglang", "sequence-bound"))
        self.assertEqual(e["will_not_help"], "more KV memory (`--mem-fraction-static`): the cache is idle")

    def test_an_sglang_scrape(self):
        e = self.explain_text('sglang:num_running_reqs{model_name="m"} 2\nsglang:num_queue_reqs{model_name="m"} 0\n'
                              'sglang:token_usage{model_name="m"} 0.1\n')
        self.assertEqual((e["server"], e["symptom"]), ("sglang", "healthy"))

    DP_ENGINE = ('vllm:num_requests_running{{engine="{0}"}} 48\nvllm:num_requests_waiting{{engine="{0}"}} 12\n'
                 'vllm:kv_cache_usage_perc{{engine="{0}"}} 0.62\nvllm:num_preemptions_total{{engine="{0}"}} 0\n'
                 'vllm:time_to_first_token_seconds_sum{{engine="{0}"}} {1}\n'
                 'vllm:time_to_first_token_seconds_count{{engine="{0}"}} 100\n'
                 'vllm:request_queue_time_seconds_sum{{engine="{0}"}} 60\n'
                 'vllm:request_queue_time_seconds_count{{engine="{0}"}} 100\n')

    def test_a_data_parallel_scrape_is_read_per_engine_where_a_sum_means_nothing(self):
        # Two engines' caches 62% full each were once a "KV peak 124%", and the verdict KV-bound.
        e = self.explain_text(self.DP_ENGINE.format(0, 80) + self.DP_ENGINE.format(1, 80))
        self.assertEqual(e["symptom"], "queue-bound")
        self.assertIn("running up to 96", e["capacity"][0])               # counts add over the engines
        self.assertNotIn("124%", json.dumps(e))

    def test_an_unreadable_or_missing_ttft_is_named_and_the_queue_still_counts(self):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(self.DP_ENGINE.format(0, "NaN") + 'vllm:kv_cache_usage_perc{engine="1"} 62\n')
        self.addCleanup(os.unlink, f.name)
        code, out, err = run_cli("explain", f.name, "--json")
        self.assertEqual(code, 0, err)
        self.assertIn("left out 2 sample(s) that are not a number in range", err)
        self.assertIn("vllm:time_to_first_token_seconds_sum", err)
        self.assertIn("vllm:kv_cache_usage_perc", err)
        e = json.loads(out)[0]
        self.assertEqual(e["symptom"], "queue-bound")             # 12 waiting, where "healthy" was printed
        self.assertIn("no TTFT in this input", e["evidence"])

    def test_input_that_is_none_of_these_exits_2(self):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("hello world\n")
        self.addCleanup(os.unlink, f.name)
        code, _, err = run_cli("explain", f.name)
        self.assertEqual(code, 2)
        self.assertIn("scrape", err)
        self.assertEqual(run_cli("explain")[0], 2)


class OneTable(unittest.TestCase):
    def test_the_runbook_and_the_prompt_hold_the_table_explain_applies(self):
        code, table, _ = run_cli("explain", "--table")
        self.assertEqual(code, 0)
        for path in (RUNBOOK, os.path.join(ROOT, "outputs", "prompt-explain-serving-metrics.md")):
            with open(path) as f:
                self.assertIn(table.strip(), f.read(), path)

    def test_every_knob_in_the_runbook_is_in_the_table_and_back(self):
        with open(RUNBOOK) as f:
            runbook = f.read()
        flags = lambda text: set(re.findall(r"`(--[a-z][a-z-]+)`", text))
        table = flags(main.decision_table_markdown())
        # The runbook's knob section names knobs in backticks; each must be one the table can recommend.
        knobs_section = runbook[runbook.index("## The knobs"):runbook.index("## Decision table")]
        self.assertEqual(flags(knobs_section) - table, set())
        self.assertEqual(table - flags(runbook), set())

    def test_the_table_covers_the_knobs_of_all_three_servers(self):
        text = main.decision_table_markdown()
        for knob in ("--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization", "--enable-prefix-caching",
                     "--max-model-len", "--tensor-parallel-size", "--parallel", "--ctx-size", "--batch-size",
                     "--ubatch-size", "--kv-unified", "--cache-reuse", "--max-running-requests",
                     "--chunked-prefill-size", "--mem-fraction-static"):
            self.assertIn(f"`{knob}`", text)
        self.assertIn("quantiz", text)


class Inputs(unittest.TestCase):
    def test_table_alone_and_server_flags_that_contradict_the_report_are_said(self):
        # helper-46: --table --json printed markdown; --server-flags "--max-num-seqs 4" over a
        # report run at 256 (43 running) diagnosed the cap without a word
        code, out, err = run_cli("explain", "--table", "--json")
        self.assertEqual((code, out), (2, ""))
        self.assertIn("--table prints the decision table alone, as markdown; drop --json", err)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "run.json")
            code, out, _ = run_cli("simulate", "--requests", "50", "--json")
            with open(path, "w") as f:
                f.write(out)
            code, out, err = run_cli("explain", path, "--server-flags", "--max-num-seqs 4 --max-num-batched-tokens 8192")
        self.assertEqual(code, 0, err)
        self.assertEqual(err, "servesim: run.json: --server-flags gives the sequence cap 4, where the report's run had 256: "
                              "the flag's is used\n")       # the budget agrees with the report: nothing said
        # a llama.cpp run's own flags: its slots round --ctx-size down, which is no contradiction (helper-47)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "ll.json")
            code, out, _ = run_cli("simulate", "--engine", "llamacpp", "--kv-tokens", "4097", "--max-num-seqs", "4",
                                   "--requests", "20", "--prompt-tokens", "100", "--output-tokens", "50", "--rate", "2",
                                   "--json")
            with open(path, "w") as f:
                f.write(out)
            code, out, err = run_cli("explain", path, "--server-flags", "--parallel 4 --ctx-size 4097")
        self.assertEqual((code, err), (0, ""))


class NothingRan(unittest.TestCase):
    def test_a_report_whose_every_request_failed_is_one_line_naming_the_first_reason_not_healthy(self):
        with tempfile.TemporaryDirectory() as scratch:
            path = os.path.join(scratch, "failed.json")
            code, out, err = run_cli("simulate", "--no-chunked-prefill", "--prompt-tokens", "9000", "--output-tokens",
                                     "100", "--requests", "4", "--concurrency", "2", "--json")
            self.assertEqual(code, 1)
            with open(path, "w") as f:
                f.write(out)
            code, out, err = run_cli("explain", path)
        self.assertEqual(code, 1)
        self.assertEqual(out, "")
        self.assertEqual(err.strip(), "servesim: explain input failed.json: all 4 of its requests failed (the first: "
                         "longer than --max-num-batched-tokens without chunked prefill: prompt 9,000 + output 100 tokens "
                         "> 8,192); there is no latency to diagnose until they run")

    def test_a_sweep_point_whose_requests_all_failed_is_left_out_and_named(self):
        with tempfile.TemporaryDirectory() as scratch:
            path = os.path.join(scratch, "sweep.json")
            code, out, _ = run_cli("sweep", "--max-num-batched-tokens", "16384,8192", "--prompt-tokens", "9000",
                                   "--output-tokens", "100", "--no-chunked-prefill", "--requests", "20",
                                   "--concurrency", "4", "--json")
            with open(path, "w") as f:
                f.write(out)
            code, out, err = run_cli("explain", path)
        self.assertEqual(code, 0, err)
        self.assertIn("explain sweep.json (most loaded of 1 point, 1 whose requests all failed left out)", out)
        self.assertIn("prompt 9,000 + output 100", out)

    def test_a_report_of_several_seeds_is_read_with_its_mean_counts(self):
        with tempfile.TemporaryDirectory() as scratch:
            path = os.path.join(scratch, "seeds.json")
            code, out, _ = run_cli("simulate", "--seeds", "3", "--requests", "200", "--json")
            self.assertEqual(code, 0)
            self.assertNotIsInstance(json.loads(out)["total_input_tokens"], int)    # a mean of three
            with open(path, "w") as f:
                f.write(out)
            code, out, err = run_cli("explain", path)
        self.assertEqual(code, 0, err)
        self.assertTrue(out.startswith("explain seeds.json (servesim)"))


if __name__ == "__main__":
    unittest.main()


class ExplainReadsWhatCanBe(unittest.TestCase):
    """helper-55: a KV peak edited to 75 (7,500%) turned a healthy run KV-bound; a cap of 0 sequences
    dropped the cap line; --server-flags with two engines' caps (64 and 4) used one in silence."""

    def test_impossible_figures_and_a_cap_given_twice_are_refused(self):
        code, out, err = call_cli("simulate", "--requests", "20", "--json")
        self.assertEqual(code, 0, err)
        report = json.loads(out)
        with tempfile.TemporaryDirectory() as tmp:
            for where, key, value, said in (("engine", "kv_peak", 75, "engine.kv_peak is 75; expected a share"),
                                            ("config", "max_num_seqs", 0, "config.max_num_seqs is 0; expected a number "
                                                                          "of at least 1"),
                                            ("engine", "peak_waiting", -3, "engine.peak_waiting is -3")):
                edited = json.loads(out)
                edited[where][key] = value
                path = os.path.join(tmp, f"{key}.json")
                with open(path, "w") as f:
                    json.dump(edited, f)
                code, shown, err = call_cli("explain", path)
                self.assertEqual((code, shown), (2, ""), err)
                self.assertIn(said, err)
            path = os.path.join(tmp, "fine.json")
            with open(path, "w") as f:
                json.dump(report, f)
            code, _, err = call_cli("explain", path, "--server-flags", "--max-num-seqs 64 --parallel 4")
        self.assertEqual(code, 2)
        self.assertIn("--server-flags gives the sequence cap twice, --max-num-seqs 64 and --parallel 4", err)
        code, _, err = call_cli("explain", path, "--server-flags", "--enable-prefix-caching --no-enable-prefix-caching")
        self.assertEqual(code, 2)
        self.assertIn("gives prefix caching twice, --enable-prefix-caching and --no-enable-prefix-caching", err)


class TheReportsOwnDeployment(unittest.TestCase):
    """explain reads a simulate report's deployment, not just its device and model."""

    def report(self, *flags):
        code, out, err = run_cli("simulate", "--rate", 20, "--requests", 300, *flags, "--json")
        self.assertEqual(code, 0, err)
        return json.loads(out)

    def test_replicas_are_counted_each_and_tensor_parallel_fp8_prices_its_own_step(self):
        # The cache of two replicas read as one (895,904 tokens, 1,131 requests) beside the cap of
        # one (256); a -tp 2 fp8 report took the batch-1 step of one bf16 GPU, twice too slow to
        # call its TPOT slowed by batching.
        two = self.report("-dp", 2)
        sig = main.signals_from_report(two, "dp2.json")
        self.assertEqual(sig.kv_tokens, two["engine"]["num_blocks"] * two["engine"]["block_size"] // 2)
        lines = " ".join(main.explain(sig)["capacity"])
        self.assertIn(f"each of the 2 replicas' KV caches holds {sig.kv_tokens:,} tokens", lines)
        self.assertIn("the sequence cap allows 256 in each", lines)
        self.assertIn("(in the busiest replica)", lines)
        one = main.signals_from_report(self.report(), "tp1.json")
        split = main.signals_from_report(self.report("-tp", 2, "--quantization", "fp8"), "tp2.json")
        # bf16 weights on one GPU against fp8 halves on each of two: a quarter of the bytes a step
        # reads, plus the all-reduces
        self.assertLess(split.batch1_tpot_ms, 0.5 * one.batch1_tpot_ms)
        self.assertEqual(one.replicas, 1)

    def test_a_config_that_is_no_deployment_is_one_line_and_a_profile_path_is_never_read(self):
        report = self.report()
        for key, value, said in (("quantization", "fp7", "config.quantization 'fp7' is not one of"),
                                 ("tensor_parallel_size", 0, "config.tensor_parallel_size"),
                                 ("cost_model", "../x", "config.cost_model must be one of the words")):
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "r.json")
                with open(path, "w") as f:
                    json.dump({**report, "config": {**report["config"], key: value}}, f)
                code, out, err = run_cli("explain", path)
            self.assertEqual(code, 2, err)
            self.assertIn(said, err)
            self.assertEqual(len(err.strip().splitlines()), 1, err)
        sig = main.signals_from_report({**report, "config": {**report["config"], "engine": "/etc/passwd"}}, "r.json")
        self.assertIsNone(sig.knee)


class ClientOnlyReports(unittest.TestCase):
    def test_a_long_ttft_without_a_queue_figure_is_not_called_healthy(self):
        # helper-61: a llama.cpp run without --metrics (TTFT p50 4.5 s) read "decode dominates" and
        # "healthy: no preemptions, little queue"
        with open(os.path.join(FIXTURES, "llamacpp-c8.json")) as f:
            report = json.load(f)
        for key in ("server", "timings"):
            report.pop(key, None)
        sig = main.signals_from_report(report, "c8.json")
        e = main.explain(sig)
        self.assertEqual(e["symptom"], "queue-bound")
        self.assertEqual(e["phase"], "ttft")
        self.assertRegex(e["evidence"][0], r"^TTFT [\d,]+ ms, longer than the decode after it")
        self.assertIn("no queue or prefill figure in this input", e["evidence"][1])
        # helper-63: the server's own gauges saw nothing waiting: a long TTFT is then prefill
        report = {"completed": 20, "failed": 0, "median_ttft_ms": 1500, "median_e2el_ms": 1700,
                  "total_input_tokens": 600000, "total_output_tokens": 200, "config": {},
                  "server": {"server": "vllm", "peak_running": 1, "peak_waiting": 0, "preemptions": 0}}
        self.assertEqual(main.explain(main.signals_from_report(report, "v.json"))["symptom"], "healthy")


class ScrapesSayOnlyWhatTheyHold(unittest.TestCase):
    def explain(self, text):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "m.prom")
            with open(path, "w") as f:
                f.write(text)
            code, out, err = run_cli("explain", path, "--json")
        self.assertEqual(code, 0, err)
        return json.loads(out)[0], err

    def test_no_counter_is_no_zero_a_bad_sample_is_named_and_cache_hits_mean_caching_is_on(self):
        # helper-61: "preemptions 0" and "waiting up to 0" where the scrape had no such series; a
        # sample "abc" dropped without a word; 700 hits of 1,000 lookups still advised turning
        # prefix caching on
        e, err = self.explain("vllm:num_requests_running 5\nvllm:num_requests_waiting abc\n")
        self.assertIn("vllm:num_requests_waiting", err)
        self.assertIn("waiting not reported", " ".join(e["capacity"]))
        self.assertTrue(e["evidence"][0].startswith("nothing in this input binds"), e["evidence"])
        full = ("vllm:num_requests_running 17\nvllm:num_requests_waiting 40\nvllm:kv_cache_usage_perc 1.0\n"
                "vllm:time_to_first_token_seconds_sum 400\nvllm:time_to_first_token_seconds_count 20\n"
                "vllm:request_queue_time_seconds_sum 380\nvllm:request_queue_time_seconds_count 20\n")
        e, _ = self.explain(full)
        self.assertEqual(e["symptom"], "kv-bound")
        self.assertEqual(e["evidence"][0], "preemptions not reported")
        e, _ = self.explain(full + "vllm:prefix_cache_queries_total 1000\nvllm:prefix_cache_hits_total 700\n")
        self.assertIn("prefix caching is already on", e["change_first"])
        _, err = self.explain(full + "vllm:prefix_cache_queries_total 1000\nvllm:prefix_cache_hits_total 2000\n")
        self.assertIn("is more than the 1,000 tokens looked up: the hit rate is left out", err)


class ReportsAsRunsGiveThem(unittest.TestCase):
    def test_impossible_medians_are_refused_and_a_knee_from_elsewhere_is_said(self):
        # helper-61: "decode -3,764 ms" from an E2E below its TTFT; "queue 3,782 ms of TTFT 0 ms";
        # --hardware/--model other than the report's used without a word; a device file's report
        # dropped the knee without one
        code, out, err = run_cli("simulate", "--requests", 40, "--rate", 5, "--json")
        report = json.loads(out)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "r.json")
            for edit, said in (({"median_e2el_ms": 1.0}, "its E2E latency 1.0 ms is less than its TTFT"),
                               ({"median_ttft_ms": 0.0}, "its TTFT 0.0 ms is less than its queue time")):
                with open(path, "w") as f:
                    json.dump({**report, **edit, "median_queue_ms": 5.0}, f)
                code, out, err = run_cli("explain", path)
                self.assertEqual(code, 2, err)
                self.assertIn(said, err)
            with open(path, "w") as f:
                json.dump(report, f)
            code, out, err = run_cli("explain", path, "--hardware", "l4-24gb", "--model", "qwen3-32b")
            self.assertEqual(code, 0, err)
            self.assertIn("price the knee, where the report's run was h100-sxm-80gb / llama-3.1-8b", err)
            with open(path, "w") as f:
                json.dump({**report, "config": {**report["config"], "hardware": "my-box"}}, f)
            code, out, err = run_cli("explain", path)
            self.assertEqual(code, 0, err)
            self.assertIn("which explain cannot price", err)


class ServerFlagsGiven(unittest.TestCase):
    def test_server_flags_starting_with_a_dash_get_the_way_to_pass_them(self):
        # helper-61: --server-flags "--parallel=4" failed with argparse's "expected one argument" alone
        code, out, err = run_cli("explain", os.path.join(FIXTURES, "llamacpp-c8.json"), "--server-flags", "--parallel=4")
        self.assertEqual(code, 2, err)
        self.assertIn('a value that starts with - goes after an =: --server-flags="--parallel 4"', err)
        code, out, err = run_cli("explain", os.path.join(FIXTURES, "llamacpp-c8.json"), "--server-flags=--parallel=4")
        self.assertEqual(code, 0, err)
        self.assertIn("4 running of 4 allowed", out)
