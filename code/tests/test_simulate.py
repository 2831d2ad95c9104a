"""The lesson's Step 9 simulator figures, and the Monday incident."""
import csv
import io
import json
import unittest

from helpers import FIXTURES, cells, run_cli

H100_TABLE = """
1 132.9 21.5 7.4 7.4 0.0 1.0 0.3% 0
8 932.7 22.9 8.3 8.7 0.0 7.9 1.7% 0
32 2568.2 26.8 11.4 12.6 267.1 29.2 5.8% 0
128 4177.9 100.3 22.7 37.1 2403.5 86.9 22.3% 0
256 4587.5 2937.6 30.6 66.7 5074.0 146.2 40.4% 0
"""

CPU_TABLE = """
1 92.6 109.6 9.2 9.2 0.0 1.0 2.7% 0
4 207.1 432.4 12.8 12.8 0.0 4.0 10.9% 0
8 207.1 1668.7 12.8 12.8 1236.3 4.0 10.9% 0
"""


def table_rows(out):
    lines = out.strip().splitlines()
    header = lines[1].split()
    return header, [cells(l) for l in lines[2:]]


class Step9Sweeps(unittest.TestCase):
    def assert_table(self, out, expected):
        _, rows = table_rows(out)
        want = [cells(l) for l in expected.strip().splitlines()]
        # Our table adds a failed column; the lesson's columns come first, cell for cell.
        self.assertEqual([row[:len(w)] for row, w in zip(rows, want)], want)
        self.assertTrue(all(row[-1] == 0 for row in rows))

    def test_h100_sweep_matches_the_lesson_cell_for_cell(self):
        code, out, err = run_cli("sweep", "--requests", "256", "--concurrency", "1,8,32,128,256")
        self.assertEqual(code, 0, err)
        self.assertTrue(out.startswith("sweep llama-3.1-8b on h100-sxm-80gb  256 requests  prompt 256-1024  output 64-256"))
        self.assert_table(out, H100_TABLE)

    def test_cpu_sweep_matches_the_lesson_cell_for_cell(self):
        code, out, err = run_cli("sweep", "--hardware", "cpu-4vcpu", "--model", "smollm2-135m-q8_0",
                                 "--kv-tokens", "4096", "--max-num-seqs", "4", "--prompt-tokens", "40",
                                 "--output-tokens", "64", "--requests", "16", "--concurrency", "1,4,8")
        self.assertEqual(code, 0, err)
        self.assert_table(out, CPU_TABLE)


class BurstIncident(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        trace = f"{FIXTURES}/burst.jsonl"
        cls.plain = json.loads(run_cli("simulate", "--hardware", "l4-24gb", "--trace", trace, "--json")[1])
        cls.shared = json.loads(run_cli("simulate", "--hardware", "l4-24gb", "--trace", trace,
                                        "--prefix-caching", "--json")[1])

    def test_the_fixture_is_48_requests_in_3_5_seconds_on_two_1024_token_prefixes(self):
        with open(f"{FIXTURES}/burst.jsonl") as f:
            rows = [json.loads(l) for l in f]
        self.assertEqual(len(rows), 48)
        self.assertLessEqual(max(r["arrival"] for r in rows), 3.5)
        self.assertEqual({(r["prefix"], r["prefix_tokens"]) for r in rows},
                         {("system-a", 1024), ("system-b", 1024)})

    def test_without_prefix_caching_the_cache_fills_and_requests_are_preempted(self):
        self.assertEqual(self.plain["engine"]["kv_peak"], 1.0)
        self.assertGreater(self.plain["engine"]["preemptions"], 0)
        self.assertEqual(self.plain["failed"], 0)

    def test_prefix_caching_removes_preemption_and_cuts_ttft_and_raises_throughput(self):
        self.assertEqual(self.shared["engine"]["preemptions"], 0)
        self.assertGreater(self.shared["engine"]["prefix_hit_rate"], 0.6)
        self.assertGreaterEqual(self.plain["median_ttft_ms"] / self.shared["median_ttft_ms"], 5)
        self.assertGreaterEqual(self.shared["output_throughput"] / self.plain["output_throughput"], 1.5)
        self.assertGreater(self.shared["engine"]["mean_batch"], self.plain["engine"]["mean_batch"])

    def test_the_queue_not_generation_is_the_spinner(self):
        self.assertGreater(self.plain["median_queue_ms"], 0.8 * self.plain["median_ttft_ms"])


class JsonOutput(unittest.TestCase):
    VLLM_KEYS = ["duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                 "request_throughput", "output_throughput", "total_token_throughput"] + [
        f"{stat}_{metric}_ms" for metric in ("ttft", "tpot", "itl", "e2el", "queue")
        for stat in ("mean", "median", "std", "p90", "p95", "p99")]

    def test_simulate_json_has_vllm_bench_keys_engine_and_config(self):
        code, out, _ = run_cli("simulate", "--requests", "20", "--concurrency", "4", "--json")
        self.assertEqual(code, 0)
        result = json.loads(out)
        for key in self.VLLM_KEYS:
            self.assertIn(key, result)
        self.assertEqual(set(result["engine"]), {"hardware", "steps", "mean_batch", "kv_peak", "kv_mean", "peak_waiting", "peak_running", "steps_waiting_at_seq_cap", "preemptions", "row_utilisation", "wasted_decode_rows", "kv_reserved_peak_tokens", "kv_used_of_reserved",
                                                 "evictions", "prefix_hit_rate", "num_blocks", "block_size", "mean_running"})
        self.assertEqual(result["config"]["max_concurrency"], 4)
        self.assertEqual(result["completed"], 20)

    def test_the_engines_time_weighted_means_cover_the_time_it_ran_warm_up_included(self):
        # helper-46: the KV mean over the run's blocks was divided by the measured requests'
        # span alone, so a long --warmup put the mean above the peak (22.0% against 5.8%)
        import main
        for extra in ({}, {"data_parallel_size": 2}, {"disaggregate": True}):
            with self.subTest(**extra):
                plain = main.run(main.RunSpec(requests=100, seed=3, **extra))
                warm = main.run(main.RunSpec(requests=100, seed=3, warmup=90, **extra))
                for result in (plain, warm):
                    self.assertLessEqual(result["engine"]["kv_mean"], result["engine"]["kv_peak"])
                    if not extra:       # (replicas: the mean is of them all, the peak the busiest one's)
                        self.assertLessEqual(result["engine"]["mean_running"], result["engine"]["peak_running"])
                # the same requests, the same steps: only which requests are measured differs
                self.assertEqual(warm["engine"], plain["engine"])
                self.assertLess(warm["duration"], plain["duration"])

    def test_detailed_adds_per_request_arrays(self):
        result = json.loads(run_cli("simulate", "--requests", "5", "--output-tokens", "3", "--json", "--detailed")[1])
        self.assertEqual(result["output_lens"], [3] * 5)
        self.assertEqual([len(g) for g in result["itls"]], [2] * 5)
        for key in ("input_lens", "ttfts", "latencies", "start_times", "errors"):
            self.assertEqual(len(result[key]), 5)

    def test_a_fixed_seed_gives_the_same_output_and_another_seed_does_not(self):
        args = ("simulate", "--rate", "20", "--requests", "50", "--json")
        a, b = run_cli(*args)[1], run_cli(*args)[1]
        self.assertEqual(a, b)
        self.assertNotEqual(json.loads(a)["mean_ttft_ms"], json.loads(run_cli(*args, "--seed", "8")[1])["mean_ttft_ms"])

    def test_failed_requests_are_reported_and_exit_1(self):
        code, out, _ = run_cli("simulate", "--requests", "10", "--prompt-tokens", "100-5000", "--max-model-len", "4096",
                               "--json")
        result = json.loads(out)
        self.assertEqual(code, 1)
        self.assertGreater(result["failed"], 0)
        self.assertEqual(result["completed"] + result["failed"], 10)
        self.assertEqual(list(result["errors_by_kind"]), ["longer than --max-model-len"])

    def test_sweep_csv_and_json(self):
        code, out, _ = run_cli("sweep", "--requests", "8", "--concurrency", "1,2", "--csv")
        lines = out.strip().splitlines()
        self.assertEqual(code, 0)
        self.assertEqual(len(lines), 3)
        self.assertIn("engine.mean_batch", lines[0].split(","))
        # The table's load cell is a column too, as the table prints it.
        rows = list(csv.DictReader(io.StringIO(run_cli("sweep", "--hardware", "l4-24gb", "--prompt-tokens", "500",
                                                       "--output-tokens", "100", "--requests", "300", "--rate", "1,8",
                                                       "--csv")[1])))
        self.assertEqual([r["load"] for r in rows][0], "sustained")
        self.assertTrue(rows[1]["load"].startswith("overloaded"), rows[1]["load"])
        results = json.loads(run_cli("sweep", "--requests", "8", "--rate", "1,2", "--json")[1])
        self.assertEqual([r["config"]["request_rate"] for r in results], [1, 2])


class FailureLines(unittest.TestCase):
    def test_several_failures_of_one_kind_show_the_first_as_the_first(self):
        # Ten prompts of 9,000 to 9,100 tokens under an 8,192 budget: one line for the kind, and the
        # first request's own figures marked as the first's, since the others' differ.
        code, out, _ = run_cli("simulate", "--no-chunked-prefill", "--prompt-tokens", "9000-9100", "--output-tokens",
                               "100", "--requests", "10", "--concurrency", "2")
        self.assertEqual(code, 1)
        line = next(line for line in out.splitlines() if " x longer than" in line)
        self.assertRegex(line.strip(), r"^10 x longer than --max-num-batched-tokens without chunked prefill "
                                       r"\(the first: prompt 9,\d{3} \+ output 100 tokens > 8,192\)$")
        code, out, _ = run_cli("simulate", "--no-chunked-prefill", "--prompt-tokens", "9000", "--output-tokens",
                               "100", "--requests", "1", "--concurrency", "1")
        self.assertIn("1 x longer than --max-num-batched-tokens without chunked prefill: prompt 9,000 + output 100 "
                      "tokens > 8,192", out)

    def test_a_turn_whose_requests_failed_says_how_many(self):
        # The third turn's prompt (two answers of history on 3,000 tokens) outgrows an 8,192 budget.
        code, out, _ = run_cli("simulate", "--turns", "3", "--no-chunked-prefill", "--prompt-tokens", "3000",
                               "--output-tokens", "100", "--requests", "30", "--concurrency", "4")
        self.assertEqual(code, 1)
        rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("turn ")}
        self.assertIn("10 requests (10 failed)  prompt - tokens", rows["3"])
        self.assertNotIn("failed", rows["1"])


if __name__ == "__main__":
    unittest.main()


class ReplicaLabels(unittest.TestCase):
    def test_blocks_and_steps_are_said_to_be_all_replicas_and_the_batch_each_ones(self):
        # helper-74: "kv cache 223,976 blocks" (eight replicas') beside "mean batch 3.8 seqs" (one's)
        code, out, err = run_cli("simulate", "-dp", "8", "--concurrency", "32", "--requests", "200")
        self.assertEqual(code, 0, err)
        self.assertIn("blocks x 16 tokens in all, 27,997 in each replica", out)
        self.assertRegex(out, r"steps +[0-9,]+ in all  mean batch [0-9.]+ seqs a replica")
